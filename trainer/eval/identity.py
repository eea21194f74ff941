"""What makes two evaluations comparable: the model's identity, the env's version, the grid's key.

* Model: a display name plus a hash of its weights files (sha256 over the sorted ``*.safetensors`` /
  ``*.bin`` / ``*.gguf`` files and ``config.json`` of a local model directory, by content, so a copy
  of the same weights elsewhere hashes the same). Server/API engines cannot see the weights: their
  hash is ``"api:<engine>"`` unless given (``--model-hash``).
* Env: the id's ``-vN`` version plus the hash of the split's task rows (so a changed dataset or
  generator gives a new version even under the same id), the split, and the extra ``gym.make``
  keywords. A leaderboard column is one (id, dataset hash, split, keywords): versions are never mixed.
* ``run_key``: sha256 of both plus seed, samples per task and sampling settings — one evaluation grid.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

_VERSION = re.compile(r"-(v\d+)$")
_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".gguf", ".pt")


def canonical_json(value: Any) -> str:
    """Sorted-key JSON (non-JSON values as ``str``): the same value always gives the same text."""
    return json.dumps(value, sort_keys=True, ensure_ascii=False, default=str, separators=(",", ":"))


def short_hash(value: Any, n: int = 16) -> str:
    """First ``n`` hex digits of sha256 of ``canonical_json(value)``."""
    return hashlib.sha256(canonical_json(value).encode("utf-8")).hexdigest()[:n]


def weights_hash(model_dir: str | Path) -> str:
    """sha256 (first 16 hex digits) over the weights files and ``config.json`` of a model directory,
    by relative name and content; reads every byte (about 1 s per GB).

    Raises:
        FileNotFoundError: ``model_dir`` holds no weights file.
    """
    root = Path(model_dir)
    files = sorted(p for p in root.rglob("*") if p.is_file() and p.suffix in _WEIGHT_SUFFIXES)
    if not files:
        raise FileNotFoundError(f"no weights files ({', '.join(_WEIGHT_SUFFIXES)}) under {root}")
    if (root / "config.json").is_file():
        files.append(root / "config.json")
    digest = hashlib.sha256()
    for p in files:
        digest.update(str(p.relative_to(root)).encode("utf-8") + b"\0")
        with open(p, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 22), b""):
                digest.update(chunk)
    return digest.hexdigest()[:16]


def env_version(env_id: str) -> str:
    """The ``vN`` of an id like ``Math-v0`` (``"v?"`` for an id without one)."""
    m = _VERSION.search(env_id)
    return m.group(1) if m else "v?"


def dataset_hash(tasks: Any) -> str:
    """Hash of a split's task rows (order included; 16 hex digits)."""
    return short_hash(list(tasks))


@dataclass(frozen=True)
class ModelId:
    name: str
    weights_hash: str
    engine: str


@dataclass(frozen=True)
class EnvId:
    env_id: str
    version: str
    dataset_hash: str
    split: str
    env_kwargs: str  # canonical JSON of the extra gym.make keywords
    num_tasks: int  # tasks in the split (the grid may use fewer)

    @property
    def column(self) -> str:
        """A leaderboard column's label: ``Math-v0@1a2b3c4d/test`` (+ keywords when any)."""
        extra = "" if self.env_kwargs == "{}" else f" {self.env_kwargs}"
        return f"{self.env_id}@{self.dataset_hash[:8]}/{self.split}{extra}"


def run_key(model: ModelId, env: EnvId, seed: int, n_samples: int, sampling: Mapping[str, Any]) -> str:
    """The key of one evaluation grid (see the module docstring)."""
    return short_hash(
        {
            "model": [model.name, model.weights_hash, model.engine],
            "env": [env.env_id, env.version, env.dataset_hash, env.split, env.env_kwargs],
            "seed": seed,
            "n_samples": n_samples,
            "sampling": dict(sampling),
        },
        32,
    )
