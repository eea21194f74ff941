"""Retrieval quality: recall@k of the documents that support each question."""

from __future__ import annotations

from collections.abc import Sequence

from chatgym.retrievers.base import Passage


def recall_at_k(
    results: Sequence[Sequence[Passage]], gold: Sequence[Sequence[str]], ks: Sequence[int]
) -> dict[int, float]:
    """Mean over questions of the share of gold documents found in the top ``k`` results.

    For a one-hop question (one gold id) this is the hit rate; for a two-hop question with gold
    ``[A, B]`` finding only A counts 0.5 (support recall, as in HotpotQA's supporting-document recall).

    Args:
        results: ranked passages per question (best first), e.g. from ``search_batch``.
        gold: ids of the supporting documents per question (non-empty).
        ks: cut-offs, each >= 1.

    Raises:
        ValueError: ``results`` and ``gold`` differ in length, a gold list is empty, or a k < 1.
    """
    if len(results) != len(gold):
        raise ValueError(f"results has {len(results)} entries but gold has {len(gold)}")
    if any(k < 1 for k in ks):
        raise ValueError(f"every k must be >= 1, got {list(ks)}")
    totals = dict.fromkeys(ks, 0.0)
    for i, (hits, want) in enumerate(zip(results, gold, strict=True)):
        if not want:
            raise ValueError(f"gold[{i}] is empty")
        ids = [p.id for p in hits]
        for k in ks:
            top = set(ids[:k])
            totals[k] += sum(g in top for g in want) / len(want)
    n = max(len(gold), 1)
    return {k: totals[k] / n for k in ks}
