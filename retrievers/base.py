"""The retriever contract: documents in, ranked passages out.

Every retriever (BM25, dense, hybrid, the HTTP client) answers ``search(query, k)`` with a list of
:class:`Passage`, best first, and ``search_batch(queries, k)`` with one such list per query. Envs and
the server depend only on this module.

Query rules shared by all retrievers (checked by :func:`check_queries`):

* a query is a ``str``; an empty or whitespace-only query raises ``ValueError`` naming the query's
  position — it has no meaning, and silently returning nothing would hide a caller's bug;
* ``k`` is an ``int >= 1``; ``k`` larger than the corpus returns every matching document, sorted;
* an empty index returns ``[]`` for every query (never placeholder hits).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable


@dataclass(frozen=True)
class Document:
    """One corpus entry.

    Attributes:
        id: unique id within the corpus (for the Wikipedia corpus: the article title).
        text: the passage text that is returned to the caller.
        meta: JSON-serialisable extras; ``meta["title"]``, when present, is indexed with the text.
    """

    id: str
    text: str
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def title(self) -> str:
        return str(self.meta.get("title") or "")

    @property
    def contents(self) -> str:
        """What gets indexed: ``"title\\ntext"`` (Search-R1's ``contents`` layout), or the text alone."""
        return f"{self.title}\n{self.text}" if self.title else self.text

    def to_json(self) -> dict[str, Any]:
        return {"id": self.id, "text": self.text, "meta": self.meta}

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> Document:
        return cls(id=str(obj["id"]), text=str(obj["text"]), meta=dict(obj.get("meta") or {}))


@dataclass(slots=True)
class Passage:
    """One search hit.

    Attributes:
        id: the document's id.
        text: the document's text.
        score: retriever-specific relevance, higher is better (BM25 score, cosine similarity,
            or reciprocal-rank-fusion score).
        meta: the document's ``meta`` — the same dict, not a copy (copying costs BM25 ~3% of its
            throughput); treat it as read-only.
    """

    id: str
    text: str
    score: float
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def title(self) -> str:
        return str(self.meta.get("title") or "")


@runtime_checkable
class Retriever(Protocol):
    """In-process retriever (sync; CPU-bound, so async callers run it in a thread)."""

    kind: str
    docs: Sequence[Document]

    def search(self, query: str, k: int = 10) -> list[Passage]: ...

    def search_batch(self, queries: Sequence[str], k: int = 10) -> list[list[Passage]]: ...

    def save(self, path: str) -> None: ...


def check_queries(queries: Sequence[str], k: int) -> None:
    """Validate a batch of queries and ``k``.

    Raises:
        TypeError: ``queries`` is a bare string or holds a non-string; ``k`` is not an int.
        ValueError: a query is empty or whitespace-only (message names ``queries[i]``); ``k < 1``.
    """
    if isinstance(queries, str):
        raise TypeError("queries must be a list of strings, got a single str (use search() for one query)")
    if isinstance(k, bool) or not isinstance(k, int):
        raise TypeError(f"k must be an int, got {type(k).__name__}")
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    for i, q in enumerate(queries):
        if not isinstance(q, str):
            raise TypeError(f"queries[{i}] must be a str, got {type(q).__name__}")
        if not q.strip():
            raise ValueError(f"queries[{i}] is empty or whitespace-only")


def rank_passages(docs: Sequence[Document], indices: Iterable[int], scores: Iterable[float]) -> list[Passage]:
    """Passages for (index, score) pairs, sorted by score (descending), ties by corpus position.

    The explicit tie-break makes results identical across processes and library versions, which the
    server-vs-in-process equality test relies on.
    """
    pairs = sorted(zip(indices, scores, strict=True), key=_rank_key)
    return [Passage(docs[i].id, docs[i].text, s, docs[i].meta) for i, s in pairs]


def _rank_key(pair: tuple[int, float]) -> tuple[float, int]:
    return (-pair[1], pair[0])


def corpus_fingerprint(docs: Sequence[Document]) -> str:
    """SHA-256 over every document's id, text and meta, in order (hex)."""
    h = hashlib.sha256()
    for d in docs:
        h.update(json.dumps(d.to_json(), sort_keys=True, ensure_ascii=False).encode())
        h.update(b"\n")
    return h.hexdigest()


def check_unique_ids(docs: Sequence[Document]) -> None:
    """Raises ``ValueError`` naming the first duplicated document id."""
    seen: set[str] = set()
    for i, d in enumerate(docs):
        if d.id in seen:
            raise ValueError(f"docs[{i}].id {d.id!r} is not unique")
        seen.add(d.id)
