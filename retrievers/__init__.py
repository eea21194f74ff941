"""BM25 / dense / hybrid retrieval over real corpora, in process or over HTTP.

* :class:`Document`, :class:`Passage`, :class:`Retriever` — the contract (``retrievers.base``);
* :class:`BM25Retriever` (bm25s), :class:`DenseRetriever` (sentence-transformers + faiss),
  :class:`HybridRetriever` (reciprocal-rank fusion); :func:`cached_retriever` builds one once and
  caches it under ``$CHATGYM_CACHE``;
* :func:`wiki_corpus` — the bundled English Wikipedia lead sections;
* :class:`RetrievalClient` and ``chatgym serve-retriever`` (``retrievers.server``) — over HTTP.

Heavy libraries (bm25s, faiss, sentence-transformers) are imported only when a retriever is built;
they come with ``pip install 'chatgym[retrieval]'``.
"""

from chatgym.retrievers.base import Document, Passage, Retriever
from chatgym.retrievers.bm25 import BM25Retriever
from chatgym.retrievers.build import cached_retriever, load_index
from chatgym.retrievers.client import RetrievalClient, RetrievalError
from chatgym.retrievers.corpora import load_jsonl_corpus, wiki_corpus
from chatgym.retrievers.dense import DenseRetriever
from chatgym.retrievers.hybrid import HybridRetriever, reciprocal_rank_fusion
from chatgym.retrievers.quality import recall_at_k

__all__ = [
    "BM25Retriever",
    "DenseRetriever",
    "Document",
    "HybridRetriever",
    "Passage",
    "RetrievalClient",
    "RetrievalError",
    "Retriever",
    "cached_retriever",
    "load_index",
    "load_jsonl_corpus",
    "recall_at_k",
    "reciprocal_rank_fusion",
    "wiki_corpus",
]
