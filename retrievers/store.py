"""Index files on disk and the build-once cache.

An index directory holds ``meta.json`` (kind, settings, corpus fingerprint, library versions),
``docs.jsonl`` (the documents, so a directory can be served on its own) and the retriever's own
files. Cached indexes live under ``$CHATGYM_CACHE/retrievers/<kind>-<key>/`` (default cache root
``~/.cache/chatgym``), where ``key`` hashes the corpus, the model and every setting, so a changed
corpus, model or setting builds a new index and an unchanged one loads in well under a second.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from chatgym.retrievers.base import Document

META_FILE = "meta.json"
DOCS_FILE = "docs.jsonl"


def cache_root() -> Path:
    """``$CHATGYM_CACHE`` or ``~/.cache/chatgym``."""
    return Path(os.environ.get("CHATGYM_CACHE") or Path.home() / ".cache" / "chatgym")


def save_docs(path: Path, docs: Sequence[Document]) -> None:
    with open(path / DOCS_FILE, "w", encoding="utf-8") as f:
        for d in docs:
            f.write(json.dumps(d.to_json(), ensure_ascii=False) + "\n")


def load_docs(path: Path) -> list[Document]:
    with open(Path(path) / DOCS_FILE, encoding="utf-8") as f:
        return [Document.from_json(json.loads(line)) for line in f if line.strip()]


def write_meta(path: Path, meta: dict[str, Any]) -> None:
    (path / META_FILE).write_text(json.dumps(meta, indent=1, sort_keys=True))


def read_meta(path: str | Path) -> dict[str, Any]:
    """The ``meta.json`` of an index directory.

    Raises:
        FileNotFoundError: ``path`` is not an index directory (names the path).
    """
    file = Path(path) / META_FILE
    if not file.is_file():
        raise FileNotFoundError(f"{path} is not a chatgym index directory (no {META_FILE})")
    return json.loads(file.read_text())


def cache_key(kind: str, fingerprint: str, settings: dict[str, Any]) -> str:
    """16 hex chars of SHA-256 over kind, corpus fingerprint and settings (model hash included)."""
    blob = json.dumps({"kind": kind, "corpus": fingerprint, "settings": settings}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


@contextlib.contextmanager
def atomic_dir(final: Path) -> Iterator[Path]:
    """Yield a fresh temp directory next to ``final``; rename it to ``final`` when the block succeeds.

    Two processes building the same index at once both finish; the first rename wins and the second
    copy is discarded, so a reader never sees a half-written index.
    """
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.", dir=final.parent))
    try:
        yield tmp
        try:
            os.rename(tmp, final)
        except OSError:
            if not (final / META_FILE).is_file():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
