"""BM25 retrieval with ``bm25s`` (Lù 2024, "BM25S: Orders of magnitude faster lexical search via
eager sparse scoring", arXiv:2407.03618).

Scoring variant: **Lucene's BM25** (``method="lucene"``), whose IDF is
``log(1 + (N - n + 0.5) / (n + 0.5))`` for a term in ``n`` of ``N`` documents. It stays positive
for every ``n``; Robertson's original ``log((N - n + 0.5) / (n + 0.5))`` is exactly 0 when a term is
in half of the documents and negative above that, which would score real matches at or below
non-matches. (rank_bm25's BM25Okapi patches the same problem with an epsilon floor.)

Tokenisation (the same for documents and queries, recorded in the index's ``meta.json``):
lower-case; tokens are runs of two or more Unicode word characters (regex ``(?u)\\b\\w\\w+\\b``, so
accented and non-Latin words are kept, one-character tokens are dropped); English stop-words from
``bm25s.stopwords`` (``stopwords="en"``; ``None`` keeps every token) are removed; then the Snowball
English stemmer from PyStemmer (``stemmer="english"``; ``None`` disables it). A document's indexed
text is its title and text (``Document.contents``).

Only documents that share at least one term with the query (score > 0) are returned: a query made
only of stop-words or unknown words returns ``[]``, never zero-score filler.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from chatgym.retrievers.base import Document, Passage, check_queries, check_unique_ids, corpus_fingerprint
from chatgym.retrievers.store import (
    atomic_dir,
    cache_key,
    cache_root,
    load_docs,
    read_meta,
    save_docs,
    write_meta,
)


def _import_bm25s() -> Any:
    try:
        import bm25s
    except ImportError as exc:
        raise ImportError("BM25 retrieval needs bm25s: pip install 'chatgym[retrieval]'") from exc
    return bm25s


def make_stemmer(language: str | None) -> Any:
    """A PyStemmer Snowball stemmer for ``language``, or None when ``language`` is None.

    Raises:
        ImportError: PyStemmer is missing (names the extra to install).
    """
    if language is None:
        return None
    try:
        import Stemmer
    except ImportError as exc:
        raise ImportError("BM25 stemming needs PyStemmer: pip install 'chatgym[retrieval]'") from exc
    return Stemmer.Stemmer(language)


class BM25Retriever:
    """BM25 (Lucene variant) over a list of documents; see the module docstring for the details.

    Args:
        docs: the corpus; ids must be unique. May be empty (every search then returns ``[]``).
        k1: term-frequency saturation (Robertson/Lucene default 1.5).
        b: document-length normalisation in [0, 1] (default 0.75).
        stopwords: ``"en"`` (bm25s's English list) or None.
        stemmer: a Snowball language name such as ``"english"``, or None.

    Raises:
        ValueError: duplicate document ids, or ``b`` outside [0, 1], or ``k1 < 0``.
        ImportError: bm25s / PyStemmer missing (``pip install 'chatgym[retrieval]'``).
    """

    kind = "bm25"

    def __init__(
        self,
        docs: Sequence[Document],
        *,
        k1: float = 1.5,
        b: float = 0.75,
        stopwords: str | None = "en",
        stemmer: str | None = "english",
        _index: Any = None,
    ):
        if not 0.0 <= b <= 1.0:
            raise ValueError(f"b must be in [0, 1], got {b}")
        if k1 < 0:
            raise ValueError(f"k1 must be >= 0, got {k1}")
        check_unique_ids(docs)
        self.docs = list(docs)
        self._rows = [(d.id, d.text, d.meta) for d in self.docs]
        self.settings = {"k1": k1, "b": b, "stopwords": stopwords, "stemmer": stemmer, "method": "lucene"}
        self._bm25s = _import_bm25s()
        self._stemmer = make_stemmer(stemmer)
        self.build_seconds = 0.0
        if _index is not None or not self.docs:
            self._index = _index
            return
        t0 = time.perf_counter()
        self._index = self._bm25s.BM25(k1=k1, b=b, method="lucene")
        self._index.index(self.tokenize([d.contents for d in self.docs]), show_progress=False)
        self.build_seconds = time.perf_counter() - t0

    def tokenize(self, texts: Sequence[str]) -> list[list[str]]:
        """Token strings of each text (lower-cased, stop-words removed, stemmed)."""
        return self._bm25s.tokenize(
            list(texts),
            stopwords=self.settings["stopwords"] or [],
            stemmer=self._stemmer,
            return_ids=False,
            show_progress=False,
        )

    def search(self, query: str, k: int = 10) -> list[Passage]:
        """Top-``k`` passages for one query (see :meth:`search_batch`)."""
        return self.search_batch([query], k)[0]

    def search_batch(self, queries: Sequence[str], k: int = 10) -> list[list[Passage]]:
        """Top-``k`` passages per query, best first, ties broken by corpus order.

        Returns fewer than ``k`` passages when fewer documents contain a query term.

        Raises:
            TypeError / ValueError: see :func:`chatgym.retrievers.base.check_queries`.
        """
        check_queries(queries, k)
        if self._index is None or not queries:
            return [[] for _ in queries]
        # bm25s's own token-id form (as its README calls it); retrieve() maps it onto the index vocab.
        tokens = self._bm25s.tokenize(
            list(queries),
            stopwords=self.settings["stopwords"] or [],
            stemmer=self._stemmer,
            show_progress=False,
        )
        idx, scores = self._index.retrieve(tokens, k=min(k, len(self.docs)), show_progress=False, n_threads=0)
        # Rows come sorted by score; re-sort by (score desc, corpus position) so ties are deterministic.
        order = np.lexsort((idx, -scores), axis=-1)
        idx, scores = np.take_along_axis(idx, order, -1), np.take_along_axis(scores, order, -1)
        rows = self._rows
        return [
            [
                Passage(rows[i][0], rows[i][1], s, rows[i][2])
                for i, s in zip(row_i, row_s, strict=True)
                if s > 0.0
            ]
            for row_i, row_s in zip(idx.tolist(), scores.tolist(), strict=True)
        ]

    # ---- persistence --------------------------------------------------------------------------

    def _meta(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "settings": self.settings,
            "num_docs": len(self.docs),
            "corpus_fingerprint": corpus_fingerprint(self.docs),
            "bm25s_version": self._bm25s.__version__,
        }

    def save(self, path: str | Path) -> None:
        """Write the index, the documents and ``meta.json`` into directory ``path`` (created)."""
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        if self._index is not None:
            self._index.save(str(path / "bm25s"))
        save_docs(path, self.docs)
        write_meta(path, self._meta())

    @classmethod
    def load(cls, path: str | Path, *, mmap: bool = False) -> BM25Retriever:
        """Load a directory written by :meth:`save` (``mmap=True`` maps the score arrays).

        Raises:
            FileNotFoundError: not an index directory. ValueError: it holds another kind of index.
        """
        path = Path(path)
        meta = read_meta(path)
        if meta.get("kind") != cls.kind:
            raise ValueError(f"{path} holds a {meta.get('kind')!r} index, not bm25")
        docs = load_docs(path)
        bm25s = _import_bm25s()
        index = None
        if docs:
            index = bm25s.BM25.load(str(path / "bm25s"), mmap=mmap, show_progress=False, verbosity=0)
        s = meta["settings"]
        return cls(docs, k1=s["k1"], b=s["b"], stopwords=s["stopwords"], stemmer=s["stemmer"], _index=index)

    @classmethod
    def cached(
        cls, docs: Sequence[Document], *, cache_dir: str | Path | None = None, **settings: Any
    ) -> BM25Retriever:
        """Load the index for ``docs`` + ``settings`` from the cache, building and saving it once.

        The cache directory is ``<cache_dir or $CHATGYM_CACHE>/retrievers/bm25-<key>``; ``key`` hashes
        the corpus fingerprint, the settings and the bm25s version.
        """
        bm25s = _import_bm25s()
        probe = {"k1": 1.5, "b": 0.75, "stopwords": "en", "stemmer": "english", **settings}
        key = cache_key(cls.kind, corpus_fingerprint(docs), {**probe, "bm25s": bm25s.__version__})
        final = Path(cache_dir or cache_root()) / "retrievers" / f"{cls.kind}-{key}"
        if (final / "meta.json").is_file():
            return cls.load(final)
        retriever = cls(docs, **probe)
        with atomic_dir(final) as tmp:
            retriever.save(tmp)
        return retriever
