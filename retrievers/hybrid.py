"""Hybrid retrieval: reciprocal-rank fusion (RRF) of a BM25 and a dense ranking.

RRF (Cormack, Clarke & Büttcher 2009, "Reciprocal Rank Fusion outperforms Condorcet and individual
rank learning methods", SIGIR) scores a document ``d`` as ``sum_i w_i / (c + rank_i(d))`` over the
rankings ``i`` that contain it, ranks starting at 1, with ``c = 60`` as in the paper. It needs no
score calibration between BM25's unbounded scores and cosine similarities.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from chatgym.retrievers.base import Passage, check_queries
from chatgym.retrievers.bm25 import BM25Retriever
from chatgym.retrievers.dense import DenseRetriever
from chatgym.retrievers.store import read_meta, write_meta


def reciprocal_rank_fusion(
    rankings: Sequence[Sequence[str]], c: float = 60.0, weights: Sequence[float] | None = None
) -> list[tuple[str, float]]:
    """Fuse ranked id lists into ``[(id, rrf_score)]``, best first.

    Args:
        rankings: each a list of ids, best first (an id appears at most once per list).
        c: the RRF constant (> 0); larger values flatten the contribution of top ranks.
        weights: one weight per ranking (default 1.0 each).

    Ties are broken by the best rank the id reached in any list, then by first appearance, so the
    order is deterministic.

    Raises:
        ValueError: ``c <= 0`` or ``len(weights) != len(rankings)``.
    """
    if c <= 0:
        raise ValueError(f"c must be > 0, got {c}")
    if weights is None:
        weights = [1.0] * len(rankings)
    if len(weights) != len(rankings):
        raise ValueError(f"weights has {len(weights)} entries for {len(rankings)} rankings")
    score: dict[str, float] = {}
    best: dict[str, int] = {}
    for ranking, w in zip(rankings, weights, strict=True):
        for rank, doc_id in enumerate(ranking, 1):
            score[doc_id] = score.get(doc_id, 0.0) + w / (c + rank)
            best[doc_id] = min(best.get(doc_id, rank), rank)
    order = {doc_id: i for i, doc_id in enumerate(score)}  # first appearance
    return sorted(score.items(), key=lambda kv: (-kv[1], best[kv[0]], order[kv[0]]))


class HybridRetriever:
    """RRF of :class:`BM25Retriever` and :class:`DenseRetriever` over the same corpus.

    Args:
        bm25, dense: the two retrievers; they must index the same documents in the same order.
        c: the RRF constant (default 60).
        depth: candidates taken from each retriever per query (at least ``k``); deeper lists let a
            document ranked moderately by both rise above one ranked high by only one.
        weights: ``(bm25_weight, dense_weight)``.

    ``Passage.score`` is the RRF score. ``k`` larger than the corpus returns every document (the
    dense ranking covers the whole corpus).

    Raises:
        ValueError: the two retrievers index different documents; ``depth < 1``.
    """

    kind = "hybrid"

    def __init__(
        self,
        bm25: BM25Retriever,
        dense: DenseRetriever,
        *,
        c: float = 60.0,
        depth: int = 100,
        weights: tuple[float, float] = (1.0, 1.0),
    ):
        if [d.id for d in bm25.docs] != [d.id for d in dense.docs]:
            raise ValueError("bm25 and dense retrievers must index the same documents in the same order")
        if depth < 1:
            raise ValueError(f"depth must be >= 1, got {depth}")
        self.bm25, self.dense = bm25, dense
        self.docs = bm25.docs
        self.settings = {"c": c, "depth": depth, "weights": list(weights)}
        self._by_id = {d.id: d for d in self.docs}

    def search(self, query: str, k: int = 10) -> list[Passage]:
        """Top-``k`` fused passages for one query (see :meth:`search_batch`)."""
        return self.search_batch([query], k)[0]

    def search_batch(self, queries: Sequence[str], k: int = 10) -> list[list[Passage]]:
        """Top-``k`` passages per query by RRF score, best first.

        Raises:
            TypeError / ValueError: see :func:`chatgym.retrievers.base.check_queries`.
        """
        check_queries(queries, k)
        depth = max(k, self.settings["depth"])
        lexical = self.bm25.search_batch(queries, depth)
        semantic = self.dense.search_batch(queries, depth)
        out = []
        for lex, sem in zip(lexical, semantic, strict=True):
            fused = reciprocal_rank_fusion(
                [[p.id for p in lex], [p.id for p in sem]], self.settings["c"], self.settings["weights"]
            )[:k]
            docs = self._by_id
            out.append([Passage(i, docs[i].text, s, docs[i].meta) for i, s in fused])
        return out

    def save(self, path: str | Path) -> None:
        """Write ``bm25/`` and ``dense/`` sub-indexes and ``meta.json`` into ``path``."""
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        self.bm25.save(path / "bm25")
        self.dense.save(path / "dense")
        write_meta(path, {"kind": self.kind, "settings": self.settings, "num_docs": len(self.docs)})

    @classmethod
    def load(cls, path: str | Path, **dense_kwargs: Any) -> HybridRetriever:
        """Load a directory written by :meth:`save` (``dense_kwargs`` go to ``DenseRetriever.load``)."""
        path = Path(path)
        meta = read_meta(path)
        if meta.get("kind") != cls.kind:
            raise ValueError(f"{path} holds a {meta.get('kind')!r} index, not hybrid")
        s = meta["settings"]
        return cls(
            BM25Retriever.load(path / "bm25"),
            DenseRetriever.load(path / "dense", **dense_kwargs),
            c=s["c"],
            depth=s["depth"],
            weights=tuple(s["weights"]),
        )
