"""BM25 / dense / hybrid retrieval over real corpora, in process or over HTTP."""
