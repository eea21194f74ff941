"""Retrievers: BM25 against a hand-written Lucene BM25, dense against an independent embedding and
numpy brute force, RRF against hand-computed fusions, edge cases, persistence and the index cache.

Dense and hybrid run on a real slice of the Wikipedia corpus (its first 100 lead sections: embedding them takes ~5 s on 2 cores), built
once per module into a temporary cache; the full corpus is in test_retrieval_quality.py (slow).
"""

import itertools
import math
import os
from collections import Counter

import numpy as np
import pytest

from chatgym.retrievers.base import Document, Passage, check_queries, corpus_fingerprint
from chatgym.retrievers.bm25 import BM25Retriever
from chatgym.retrievers.build import cached_retriever, load_index
from chatgym.retrievers.corpora import load_jsonl_corpus, wiki_corpus
from chatgym.retrievers.dense import DenseRetriever, default_model_path, make_index, model_fingerprint
from chatgym.retrievers.hybrid import HybridRetriever, reciprocal_rank_fusion

SLICE = 100


def docs_of(*texts: str) -> list[Document]:
    return [Document(id=f"d{i}", text=t) for i, t in enumerate(texts)]


def lucene_bm25(query: list[str], corpus: list[list[str]], k1: float = 1.5, b: float = 0.75) -> list[float]:
    """Reference Lucene BM25 (Kamphuis et al. 2020, ECIR), written out independently of bm25s."""
    n_docs = len(corpus)
    avgdl = sum(map(len, corpus)) / n_docs
    scores = []
    for doc in corpus:
        tf = Counter(doc)
        s = 0.0
        for term in query:
            df = sum(term in d for d in corpus)
            if tf[term]:
                idf = math.log(1 + (n_docs - df + 0.5) / (df + 0.5))
                s += idf * tf[term] / (tf[term] + k1 * (1 - b + b * len(doc) / avgdl))
        scores.append(s)
    return scores


# ---- BM25 ---------------------------------------------------------------------------------------

PLAIN = {"stopwords": None, "stemmer": None}  # exact tokens, so hand computation is easy


def test_bm25_scores_match_hand_computed_lucene_bm25():
    texts = ["apple banana", "apple cherry cherry", "banana date", "elder fig"]
    r = BM25Retriever(docs_of(*texts), **PLAIN)
    # N=4, avgdl=9/4. "apple" is in 2 of 4 docs: idf = ln(1 + 2.5/2.5) = ln 2.
    #   d0: tf=1, |d|=2: ln2 * 1/(1 + 1.5*(0.25 + 0.75*2/2.25)) = 0.693147/2.375 = 0.291851
    #   d1: tf=1, |d|=3: ln2 * 1/(1 + 1.5*1.25) = 0.693147/2.875 = 0.241095
    # "cherry": idf = ln(1 + 3.5/1.5) = 1.203973; d1: tf=2: 1.203973 * 2/3.875 = 0.621406
    hits = r.search("apple cherry", k=10)
    assert [p.id for p in hits] == ["d1", "d0"]  # d2, d3 share no term: not returned
    assert hits[0].score == pytest.approx(0.241095 + 0.621406, abs=1e-5)
    assert hits[1].score == pytest.approx(0.291851, abs=1e-5)
    ref = lucene_bm25(["apple", "cherry"], [t.split() for t in texts])
    assert [p.score for p in hits] == pytest.approx([ref[1], ref[0]], rel=1e-5)


def test_term_in_half_of_the_documents_scores_above_zero():
    # Robertson's idf would be ln((4-2+0.5)/(2+0.5)) = 0 here; Lucene's is ln 2.
    r = BM25Retriever(docs_of("apple one", "apple two", "three four", "five six"), **PLAIN)
    hits = r.search("apple", k=4)
    assert [p.id for p in hits] == ["d0", "d1"]
    assert all(p.score > 0 for p in hits)
    assert hits[0].score == pytest.approx(math.log(2) / (1 + 1.5), rel=1e-5)  # |d| = avgdl = 2


def test_k_larger_than_corpus_returns_every_matching_document_sorted():
    texts = ["zeta", "zeta zeta alpha", "zeta beta gamma"]
    r = BM25Retriever(docs_of(*texts), **PLAIN)
    hits = r.search("zeta", k=100)
    # idf = ln(1 + 0.5/3.5) = 0.133531, avgdl = 7/3: d0 0.071902, d1 0.069885, d2 0.047328
    assert [p.id for p in hits] == ["d0", "d1", "d2"]
    assert [p.score for p in hits] == pytest.approx([0.071902, 0.069885, 0.047328], abs=1e-5)
    assert [p.score for p in hits] == pytest.approx(
        lucene_bm25(["zeta"], [t.split() for t in texts]), rel=1e-5
    )


def test_ties_keep_corpus_order():
    r = BM25Retriever(docs_of("same words here", "other text", "same words here"), **PLAIN)
    hits = r.search("words", k=5)
    assert [p.id for p in hits] == ["d0", "d2"] and hits[0].score == hits[1].score


def test_empty_index_returns_nothing():
    r = BM25Retriever([])
    assert r.search("apple", k=5) == []
    assert r.search_batch(["apple", "pear"], k=5) == [[], []]


def test_empty_and_whitespace_queries_raise_naming_the_query():
    r = BM25Retriever(docs_of("apple pie"), **PLAIN)
    with pytest.raises(ValueError, match=r"queries\[0\] is empty"):
        r.search("", k=3)
    with pytest.raises(ValueError, match=r"queries\[1\] is empty or whitespace-only"):
        r.search_batch(["apple", " \t\n"], k=3)
    with pytest.raises(ValueError, match="k must be >= 1"):
        r.search("apple", k=0)
    with pytest.raises(TypeError, match="single str"):
        r.search_batch("apple", k=3)
    with pytest.raises(TypeError, match=r"queries\[0\] must be a str"):
        check_queries([None], 3)
    assert r.search_batch([], k=3) == []


def test_stopword_only_and_unknown_queries_return_nothing():
    r = BM25Retriever(docs_of("the apple of the garden", "a pear"))  # default: English stop-words
    assert r.search("the of a", k=5) == []
    assert r.search("zzzunknown", k=5) == []


def test_default_tokenisation_stems_and_lowercases():
    r = BM25Retriever(docs_of("The city runs a railway", "A quiet village"))
    # Snowball: running -> run, runs -> run; cities -> citi, city -> citi
    assert [p.id for p in r.search("RUNNING Cities", k=5)] == ["d0"]
    assert r.tokenize(["Running cities of the world"]) == [["run", "citi", "world"]]


def test_unicode_queries():
    r = BM25Retriever(docs_of("Zürich is a city", "Kraków lies on the Vistula", "東京 is a capital"))
    assert [p.id for p in r.search("ZÜRICH", k=3)] == ["d0"]
    assert [p.id for p in r.search("kraków", k=3)] == ["d1"]
    assert [p.id for p in r.search("東京", k=3)] == ["d2"]


def test_title_is_indexed_and_passages_carry_meta():
    docs = [Document("x", "A small town.", {"title": "Springfield", "topic": "Geography"}), *docs_of("b c")]
    hit = BM25Retriever(docs).search("springfield", k=2)
    assert hit == [
        Passage("x", "A small town.", hit[0].score, {"title": "Springfield", "topic": "Geography"})
    ]
    assert hit[0].meta is docs[0].meta  # shared, read-only by contract (no per-hit copy)


def test_duplicate_ids_and_bad_settings_are_rejected():
    with pytest.raises(ValueError, match=r"docs\[1\].id 'a' is not unique"):
        BM25Retriever([Document("a", "x"), Document("a", "y")])
    with pytest.raises(ValueError, match="b must be in"):
        BM25Retriever(docs_of("x"), b=1.5)


def test_bm25_save_load_roundtrip(tmp_path):
    docs = wiki_corpus(200)
    r = BM25Retriever(docs)
    r.save(tmp_path / "idx")
    loaded = load_index(tmp_path / "idx")
    queries = ["1968 film by Stanley Kubrick", "painting by Georges Seurat", "Kraków"]
    assert isinstance(loaded, BM25Retriever)
    assert loaded.search_batch(queries, 7) == r.search_batch(queries, 7)
    BM25Retriever([]).save(tmp_path / "empty")
    assert load_index(tmp_path / "empty").search("x", 3) == []


def test_cache_builds_once_and_rebuilds_when_corpus_or_settings_change(tmp_path):
    docs = docs_of("apple banana", "cherry date")
    first = BM25Retriever.cached(docs, cache_dir=tmp_path)
    again = BM25Retriever.cached(docs, cache_dir=tmp_path)
    assert first.build_seconds > 0 and again.build_seconds == 0.0  # loaded, not built
    root = tmp_path / "retrievers"
    assert len(list(root.iterdir())) == 1
    BM25Retriever.cached(docs_of("apple banana", "cherry plum"), cache_dir=tmp_path)
    BM25Retriever.cached(docs, cache_dir=tmp_path, k1=1.2)
    assert len([p for p in root.iterdir() if not p.name.startswith(".")]) == 3
    assert again.search("apple", 2) == first.search("apple", 2)


def test_cache_root_comes_from_env(tmp_path, monkeypatch):
    monkeypatch.setenv("CHATGYM_CACHE", str(tmp_path / "c"))
    BM25Retriever.cached(docs_of("apple"))
    (entry,) = (tmp_path / "c" / "retrievers").iterdir()
    assert entry.name.startswith("bm25-") and (entry / "meta.json").is_file()


def test_jsonl_corpus_accepts_search_r1_contents(tmp_path):
    f = tmp_path / "c.jsonl"
    f.write_text(
        '{"id": "1", "contents": "Paris\\nCapital of France."}\n{"id": 2, "text": "x", "title": "T"}\n'
    )
    assert load_jsonl_corpus(f) == [
        Document("1", "Capital of France.", {"title": "Paris"}),
        Document("2", "x", {"title": "T"}),
    ]
    f.write_text('{"id": "1"}\n')
    with pytest.raises(ValueError, match=r"c\.jsonl:1: missing field 'text'"):
        load_jsonl_corpus(f)


def test_wiki_corpus_shape():
    docs = wiki_corpus()
    assert len(docs) == 10_033 and len({d.id for d in docs}) == 10_033
    d = next(d for d in docs if d.id == "2001: A Space Odyssey")
    assert d.meta == {
        "title": "2001: A Space Odyssey",
        "description": "1968 film by Stanley Kubrick",
        "topic": "Arts",
    }
    assert d.text.startswith("2001: A Space Odyssey is a 1968 epic science fiction film")


# ---- dense --------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def slice_docs():
    return wiki_corpus(SLICE)


@pytest.fixture(scope="module")
def dense(slice_docs, tmp_path_factory):
    return DenseRetriever.cached(slice_docs, cache_dir=tmp_path_factory.mktemp("cache"))


def stored_vectors(r: DenseRetriever) -> np.ndarray:
    return r.index.reconstruct_n(0, r.index.ntotal)


def test_dense_embeddings_match_an_independent_mean_pooling(dense, slice_docs):
    # all-MiniLM-L6-v2 = mean of the last hidden states over real tokens, then L2 norm; recomputed
    # here with plain transformers for the first 4 documents.
    import torch
    from transformers import AutoModel, AutoTokenizer

    path = default_model_path()
    tok, model = AutoTokenizer.from_pretrained(path), AutoModel.from_pretrained(path).eval()
    batch = tok(
        [d.contents for d in slice_docs[:4]],
        padding=True,
        truncation=True,
        max_length=256,
        return_tensors="pt",
    )
    with torch.no_grad():
        hidden = model(**batch).last_hidden_state
    mask = batch["attention_mask"].unsqueeze(-1).float()
    ref = torch.nn.functional.normalize((hidden * mask).sum(1) / mask.sum(1), dim=-1).numpy()
    got = stored_vectors(dense)[:4]
    assert np.linalg.norm(got, axis=1) == pytest.approx(np.ones(4), abs=1e-5)
    assert (got * ref).sum(1) == pytest.approx(np.ones(4), abs=1e-4)


def test_dense_search_equals_numpy_brute_force(dense):
    queries = ["1968 film by Stanley Kubrick", "pointillist painting", "Zürich", "a chemical element"]
    q = np.asarray(dense.encoder.encode(queries, normalize_embeddings=True), dtype=np.float32)
    sims = q @ stored_vectors(dense).T
    for query, row, hits in zip(queries, sims, dense.search_batch(queries, 10), strict=True):
        top = np.argsort(-row, kind="stable")[:10]
        assert [p.id for p in hits] == [dense.docs[i].id for i in top], query
        assert [p.score for p in hits] == pytest.approx(row[top].tolist(), abs=1e-5)
    # ...and equals faiss's own exhaustive search over the same index.
    faiss_scores, faiss_ids = dense.index.search(q, 10)
    for hits, ids, scores in zip(dense.search_batch(queries, 10), faiss_ids, faiss_scores, strict=True):
        assert [p.id for p in hits] == [dense.docs[i].id for i in ids]
        assert [p.score for p in hits] == pytest.approx(scores.tolist(), abs=1e-5)
    assert dense.search("1968 film by Stanley Kubrick", 1)[0].id == "2001: A Space Odyssey"


def test_dense_k_larger_than_corpus_returns_all_sorted(dense):
    hits = dense.search("music", k=10 * SLICE)
    assert len(hits) == SLICE and len({p.id for p in hits}) == SLICE
    assert all(a.score >= b.score for a, b in itertools.pairwise(hits))


def test_dense_empty_index_returns_nothing():
    r = DenseRetriever([])
    assert r.index.ntotal == 0
    assert r.search("anything", k=5) == [] and r.search_batch(["a", "b"], 3) == [[], []]
    with pytest.raises(ValueError, match=r"queries\[0\] is empty"):
        r.search("  ", k=5)


def test_dense_unicode_query(dense):
    hits = dense.search("Kraków, Gdańsk, Zürich — 東京", 3)
    assert len(hits) == 3 and all(-1.0 <= p.score <= 1.0 for p in hits)


def test_ivf_and_hnsw_options(dense):
    emb = stored_vectors(dense)
    q = np.asarray(dense.encoder.encode(["ancient Greek philosopher"], normalize_embeddings=True), np.float32)
    _, flat_ids = make_index(emb, "flat").search(q, 10)
    # IVF probing every cell is exhaustive, so it must equal flat exactly.
    _, ivf_ids = make_index(emb, "ivf", nlist=8, nprobe=8).search(q, 10)
    assert ivf_ids.tolist() == flat_ids.tolist()
    _, hnsw_ids = make_index(emb, "hnsw", hnsw_m=16, ef_search=300).search(q, 10)
    assert set(hnsw_ids[0].tolist()) == set(flat_ids[0].tolist())
    with pytest.raises(ValueError, match="index_type must be one of"):
        make_index(emb, "lsh")
    # The retriever's faiss search path (non-flat index) ranks like the flat one.
    ivf = DenseRetriever(dense.docs, index_type="ivf", _index=make_index(emb, "ivf", nlist=8, nprobe=8))
    queries = ["ancient Greek philosopher", "film", "a river"]
    assert [[p.id for p in h] for h in ivf.search_batch(queries, 7)] == [
        [p.id for p in h] for h in dense.search_batch(queries, 7)
    ]


def test_dense_cache_loads_and_survives_reload(dense, slice_docs, tmp_path):
    dense.save(tmp_path / "d")
    loaded = load_index(tmp_path / "d")
    assert isinstance(loaded, DenseRetriever) and loaded.index.ntotal == SLICE
    assert loaded.search_batch(["opera", "river"], 5) == dense.search_batch(["opera", "river"], 5)


def test_dense_rebuilds_when_the_model_changes(tmp_path):
    # A model directory that differs from the packaged one only in its README: new fingerprint,
    # new cache entry, and the old index refuses to load with it.
    src = default_model_path()
    other = tmp_path / "model"
    for f in src.rglob("*"):
        if f.is_file():
            dst = other / f.relative_to(src)
            dst.parent.mkdir(parents=True, exist_ok=True)
            if f.name == "README.md":
                dst.write_text(f.read_text() + "\nchanged\n")
            else:
                os.symlink(f, dst)
    assert model_fingerprint(other) != model_fingerprint(src)
    docs = docs_of("a red apple", "a yellow banana", "a blue sky")
    a = DenseRetriever.cached(docs, cache_dir=tmp_path / "c")
    b = DenseRetriever.cached(docs, model=other, cache_dir=tmp_path / "c")
    entries = sorted(p.name for p in (tmp_path / "c" / "retrievers").iterdir())
    assert len(entries) == 2 and all(e.startswith("dense-") for e in entries)
    assert a.build_seconds > 0 and b.build_seconds > 0
    a.save(tmp_path / "a")
    with pytest.raises(ValueError, match="built with another model"):
        DenseRetriever.load(tmp_path / "a", model=other)


# ---- hybrid -------------------------------------------------------------------------------------


def test_rrf_hand_computed():
    fused = reciprocal_rank_fusion([["a", "b", "c"], ["b", "c", "d"]], c=60)
    # b: 1/62 + 1/61 = 0.032522; c: 1/63 + 1/62 = 0.032002; a: 1/61 = 0.016393; d: 1/63 = 0.015873
    assert [i for i, _ in fused] == ["b", "c", "a", "d"]
    assert [s for _, s in fused] == pytest.approx([1 / 62 + 1 / 61, 1 / 63 + 1 / 62, 1 / 61, 1 / 63])
    # Equal scores: best rank reached (both 1), then first appearance.
    assert [i for i, _ in reciprocal_rank_fusion([["x", "y"], ["y", "x"]])] == ["x", "y"]
    # Weights: 2/61 for "p" beats 1/61 + ... only when weighted.
    assert reciprocal_rank_fusion([["p"], ["q"]], weights=[2.0, 1.0])[0] == ("p", pytest.approx(2 / 61))
    with pytest.raises(ValueError, match="weights has 1 entries for 2 rankings"):
        reciprocal_rank_fusion([["p"], ["q"]], weights=[1.0])


@pytest.fixture(scope="module")
def hybrid(dense, slice_docs):
    return HybridRetriever(BM25Retriever(slice_docs), dense, depth=50)


def test_hybrid_equals_rrf_of_its_parts(hybrid):
    for query in ["1968 film by Stanley Kubrick", "impressionist painter", "Mesopotamia"]:
        lex = [p.id for p in hybrid.bm25.search(query, 50)]
        sem = [p.id for p in hybrid.dense.search(query, 50)]
        want = reciprocal_rank_fusion([lex, sem], c=60)[:10]
        got = hybrid.search(query, 10)
        assert [(p.id, p.score) for p in got] == [(i, pytest.approx(s)) for i, s in want]


def test_hybrid_k_larger_than_corpus_and_errors(hybrid, slice_docs, dense):
    hits = hybrid.search("war", k=2 * SLICE)
    assert len(hits) == SLICE and all(a.score >= b.score for a, b in itertools.pairwise(hits))
    with pytest.raises(ValueError, match="same documents"):
        HybridRetriever(BM25Retriever(slice_docs[:10]), dense)
    with pytest.raises(ValueError, match=r"queries\[0\] is empty"):
        hybrid.search("", 3)


def test_hybrid_save_load_and_cached_builder(hybrid, tmp_path, slice_docs):
    hybrid.save(tmp_path / "h")
    loaded = load_index(tmp_path / "h")
    assert isinstance(loaded, HybridRetriever)
    assert loaded.search_batch(["river", "emperor"], 5) == hybrid.search_batch(["river", "emperor"], 5)
    with pytest.raises(ValueError, match="kind must be one of"):
        cached_retriever("splade", slice_docs)


def test_fingerprint_changes_with_any_field():
    base = [Document("a", "x", {"title": "T"})]
    assert corpus_fingerprint(base) != corpus_fingerprint([Document("a", "x", {"title": "U"})])
    assert corpus_fingerprint(base) == corpus_fingerprint([Document("a", "x", {"title": "T"})])


def test_missing_index_dir_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="not a chatgym index directory"):
        load_index(tmp_path)


def test_recall_at_k_hand_computed():
    from chatgym.retrievers import recall_at_k

    def hits(*ids):
        return [Passage(i, "", 0.0) for i in ids]

    results = [hits("a", "b", "c"), hits("x", "y", "b"), hits("q")]
    gold = [["b"], ["a", "b"], ["z"]]
    # k=1: 0 + 0 + 0; k=2: 1 + 0 + 0; k=3: 1 + 1/2 + 0   (then divided by 3 questions)
    assert recall_at_k(results, gold, [1, 2, 3]) == pytest.approx({1: 0.0, 2: 1 / 3, 3: 0.5})
    with pytest.raises(ValueError, match=r"gold\[0\] is empty"):
        recall_at_k([hits("a")], [[]], [1])
    with pytest.raises(ValueError, match="results has 1 entries but gold has 2"):
        recall_at_k([hits("a")], [["a"], ["b"]], [1])
