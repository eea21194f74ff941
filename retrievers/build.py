"""Ready retrievers: one of a given kind over a corpus from the index cache (:func:`cached_retriever`),
or any saved index directory by its kind (:func:`load_index`). The retriever modules import
:mod:`.store`, never this module, so the imports here run one way."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from chatgym.retrievers.base import Document, Retriever
from chatgym.retrievers.bm25 import BM25Retriever
from chatgym.retrievers.dense import DenseRetriever
from chatgym.retrievers.hybrid import HybridRetriever
from chatgym.retrievers.store import META_FILE, read_meta

KINDS = ("bm25", "dense", "hybrid")


def cached_retriever(
    kind: str,
    docs: Sequence[Document],
    *,
    cache_dir: str | Path | None = None,
    bm25: dict[str, Any] | None = None,
    dense: dict[str, Any] | None = None,
    hybrid: dict[str, Any] | None = None,
) -> Retriever:
    """A BM25, dense or hybrid retriever over ``docs``, loaded from the cache or built once.

    Args:
        kind: ``"bm25"``, ``"dense"`` or ``"hybrid"``.
        docs: the corpus.
        cache_dir: cache root (default ``$CHATGYM_CACHE`` or ``~/.cache/chatgym``).
        bm25: settings of :class:`~chatgym.retrievers.bm25.BM25Retriever` (``k1``, ``b``, ...).
        dense: settings of :class:`~chatgym.retrievers.dense.DenseRetriever` (``model``,
            ``index_type``, ``device``, ...).
        hybrid: settings of :class:`~chatgym.retrievers.hybrid.HybridRetriever` (``c``, ``depth``,
            ``weights``).

    Raises:
        ValueError: unknown ``kind``.
    """
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
    if kind == "bm25":
        return BM25Retriever.cached(docs, cache_dir=cache_dir, **(bm25 or {}))
    if kind == "dense":
        return DenseRetriever.cached(docs, cache_dir=cache_dir, **(dense or {}))
    return HybridRetriever(
        cached_retriever("bm25", docs, cache_dir=cache_dir, bm25=bm25),
        cached_retriever("dense", docs, cache_dir=cache_dir, dense=dense),
        **(hybrid or {}),
    )


def load_index(path: str | Path, **kwargs: Any) -> Retriever:
    """Load any saved index directory (BM25, dense or hybrid) by the kind in its ``meta.json``.

    ``kwargs`` go to the retriever's ``load`` (e.g. ``model=`` for a dense index).

    Raises:
        FileNotFoundError: not an index directory. ValueError: unknown kind.
    """
    kind = read_meta(path).get("kind")
    if kind == "bm25":
        return BM25Retriever.load(path, **kwargs)
    if kind == "dense":
        return DenseRetriever.load(path, **kwargs)
    if kind == "hybrid":
        return HybridRetriever.load(path, **kwargs)
    raise ValueError(f"{path}: unknown index kind {kind!r} in {META_FILE}")
