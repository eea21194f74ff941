"""One entry point to get a ready retriever of a given kind over a corpus, from the index cache."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .base import Document, Retriever

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
        from .bm25 import BM25Retriever

        return BM25Retriever.cached(docs, cache_dir=cache_dir, **(bm25 or {}))
    if kind == "dense":
        from .dense import DenseRetriever

        return DenseRetriever.cached(docs, cache_dir=cache_dir, **(dense or {}))
    from .hybrid import HybridRetriever

    return HybridRetriever(
        cached_retriever("bm25", docs, cache_dir=cache_dir, bm25=bm25),
        cached_retriever("dense", docs, cache_dir=cache_dir, dense=dense),
        **(hybrid or {}),
    )
