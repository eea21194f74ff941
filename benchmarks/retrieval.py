"""Retrieval speed on the bundled Wikipedia corpus (10,033 lead sections), side by side in one run.

Queries: the first 200 questions of WikiQA's test split; k = 10; each figure is the median of
``--repeats`` timed runs after one warm-up run. Printed:

* BM25 — our ``BM25Retriever.search_batch`` vs raw ``bm25s`` (the same tokenisation and scoring,
  called as bm25s's README does: ``bm25s.tokenize`` then ``BM25.retrieve``), and vs ``rank_bm25``'s
  ``BM25Okapi`` (``get_scores`` + top-k per query, on the same tokens). Our wrapper's overhead is
  ``1 - ours/raw`` (target <= 10%).
* dense — our ``DenseRetriever.search_batch`` (encode + flat search) vs the same encoder + a numpy
  brute-force ``emb @ q`` top-k; and the search step alone (queries pre-encoded): ours, faiss's
  ``IndexFlatIP.search`` on the same index, numpy; batched and one query per call.
* server — ``chatgym serve-retriever`` started as a real process on 127.0.0.1 (with 1 and with
  ``--workers`` processes, default one per CPU), driven by ``RetrievalClient`` from this process at
  concurrency 32 with one query per request (what an env sends), and with 10 queries per request:
  requests/s and p50/p99 latency, as a share of the in-process batch throughput (target >= 70%).
* ``--quality`` — recall@1/5/10 of BM25, dense and hybrid on the whole WikiQA test split, by
  question type (support recall: a two-hop question counts each of its two documents).

    python benchmarks/retrieval.py [--repeats 5] [--requests 2000] [--workers N] [--skip-dense] [--skip-server] [--quality]

The dense index over the full corpus is built once into ``$CHATGYM_CACHE`` (minutes on 2 cores).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import select
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from chatgym.envs.search.wiki_qa import load_wiki_qa
from chatgym.retrievers import (
    BM25Retriever,
    DenseRetriever,
    HybridRetriever,
    RetrievalClient,
    recall_at_k,
    wiki_corpus,
)

K = 10


def median_rate(fn: Callable[[], Any], n_items: int, repeats: int) -> float:
    """Items per second: median over ``repeats`` timed calls, after one warm-up call."""
    return interleaved_rates({"x": fn}, n_items, repeats)["x"]


def interleaved_rates(fns: dict[str, Callable[[], Any]], n_items: int, repeats: int) -> dict[str, float]:
    """Items per second of each function: one warm-up each, then ``repeats`` rounds that run every
    function once (interleaved, so load from other processes hits all sides alike); medians."""
    for fn in fns.values():
        fn()
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            t0 = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t0)
    return {name: n_items / statistics.median(t) for name, t in times.items()}


def row(name: str, value: float, unit: str = "q/s", note: str = "") -> None:
    print(f"  {name:<44} {value:>10,.1f} {unit:<6} {note}")


# ---- BM25 ---------------------------------------------------------------------------------------


def bench_bm25(docs, queries: list[str], repeats: int) -> BM25Retriever:
    import bm25s
    import rank_bm25

    print(
        "BM25 (Lucene variant, English stop-words, Snowball stemmer), batch of", len(queries), "queries, k=10"
    )
    ours = BM25Retriever.cached(docs)
    stemmer = ours._stemmer
    raw = bm25s.BM25(k1=1.5, b=0.75, method="lucene")
    raw.index(
        bm25s.tokenize([d.contents for d in docs], stopwords="en", stemmer=stemmer, show_progress=False),
        show_progress=False,
    )

    def run_raw():
        tokens = bm25s.tokenize(queries, stopwords="en", stemmer=stemmer, show_progress=False)
        return raw.retrieve(tokens, k=K, show_progress=False)

    def run_ours():
        return ours.search_batch(queries, K)

    # Same results, or the comparison means nothing.
    raw_ids, raw_scores = run_raw()
    ours_res = run_ours()
    agree = np.mean(
        [
            {docs[i].id for i, s in zip(ids, sc, strict=True) if s > 0} == {p.id for p in hits}
            for ids, sc, hits in zip(raw_ids, raw_scores, ours_res, strict=True)
        ]
    )
    corpus_tokens = ours.tokenize([d.contents for d in docs])
    okapi = rank_bm25.BM25Okapi(corpus_tokens)
    query_tokens = ours.tokenize(queries)

    def run_rank_bm25():
        for q in query_tokens:
            scores = okapi.get_scores(q)
            top = np.argpartition(-scores, K)[:K]
            top[np.argsort(-scores[top])]

    rates = interleaved_rates({"ours": run_ours, "raw": run_raw}, len(queries), 3 * repeats)
    r_ours, r_raw = rates["ours"], rates["raw"]
    r_okapi = median_rate(run_rank_bm25, len(queries), max(1, repeats // 2))
    row("ours: BM25Retriever.search_batch", r_ours)
    row("raw bm25s: tokenize + retrieve", r_raw)
    row("rank_bm25 BM25Okapi: get_scores + top-k", r_okapi)
    print(f"  same top-10 sets as raw bm25s: {agree:.1%} of queries")
    print(f"  ours / raw bm25s = {r_ours / r_raw:.3f}  (wrapper overhead {max(0.0, 1 - r_ours / r_raw):.1%})")
    print(f"  ours / rank_bm25 = {r_ours / r_okapi:.1f}x")
    return ours


# ---- dense --------------------------------------------------------------------------------------


def bench_dense(docs, queries: list[str], repeats: int) -> DenseRetriever:
    print(f"\ndense (all-MiniLM-L6-v2, flat index, cosine), batch of {len(queries)} queries, k=10")
    t0 = time.perf_counter()
    ours = DenseRetriever.cached(docs)
    print(
        f"  index ready in {time.perf_counter() - t0:.1f} s (built: {ours.build_seconds:.1f} s; 0 = loaded from cache)"
    )
    emb = ours.index.reconstruct_n(0, ours.index.ntotal)

    def encode():
        return np.asarray(
            ours.encoder.encode(queries, batch_size=ours.batch_size, normalize_embeddings=True),
            dtype=np.float32,
        )

    def numpy_topk(q):
        sims = q @ emb.T
        top = np.argpartition(-sims, K, axis=1)[:, :K]
        order = np.take_along_axis(sims, top, 1).argsort(axis=1)[:, ::-1]
        return np.take_along_axis(top, order, 1)

    q = encode()
    same = np.mean(
        [
            [docs[i].id for i in ids] == [p.id for p in hits]
            for ids, hits in zip(numpy_topk(q), ours.search_batch(queries, K), strict=True)
        ]
    )
    rates = interleaved_rates(
        {"ours": lambda: ours.search_batch(queries, K), "numpy": lambda: numpy_topk(encode())},
        len(queries),
        repeats,
    )
    r_ours, r_numpy = rates["ours"], rates["numpy"]
    rates = interleaved_rates(
        {
            "ours": lambda: ours.search_vectors(q, K),
            "faiss": lambda: ours.index.search(q, K),
            "numpy": lambda: numpy_topk(q),
        },
        len(queries),
        repeats,
    )
    single = interleaved_rates(
        {
            "ours": lambda: [ours.search_vectors(q[i : i + 1], K) for i in range(len(q))],
            "faiss": lambda: [ours.index.search(q[i : i + 1], K) for i in range(len(q))],
        },
        len(queries),
        repeats,
    )
    row("ours: DenseRetriever.search_batch", r_ours, note="(encode + search)")
    row("numpy brute force", r_numpy, note="(encode + emb @ q, top-k)")
    row("search step, batch: ours (BLAS over the index)", rates["ours"], note="(with passages)")
    row("search step, batch: faiss IndexFlatIP.search", rates["faiss"])
    row("search step, batch: numpy", rates["numpy"])
    row("search step, 1 query/call: ours", single["ours"])
    row("search step, 1 query/call: faiss IndexFlatIP", single["faiss"])
    print(
        f"  same top-10 as numpy: {same:.1%} of queries; ours / numpy = {r_ours / r_numpy:.2f} end to end; "
        f"search step ours / faiss = {rates['ours'] / rates['faiss']:.2f} (batch), "
        f"{single['ours'] / single['faiss']:.2f} (1 query)"
    )
    return ours


# ---- server -------------------------------------------------------------------------------------


def start_server(index_dir: Path, workers: int = 1) -> tuple[subprocess.Popen, str]:
    cmd = [sys.executable, "-m", "chatgym.cli", "serve-retriever", "--index", str(index_dir), "--port", "0"]
    cmd += ["--workers", str(workers)]
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env={**os.environ}
    )
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and proc.poll() is None:
        if select.select([proc.stdout], [], [], 0.5)[0]:
            line = proc.stdout.readline()
            if "http://" in line:
                return proc, "http://" + line.rsplit("http://", 1)[1].strip()
    proc.kill()
    raise RuntimeError("retrieval server did not start")


async def drive(
    url: str, queries: list[str], n_requests: int, concurrency: int, per_request: int = 1
) -> tuple[float, list[float]]:
    """Closed loop: ``concurrency`` workers, ``per_request`` queries per request; returns
    (requests/s, per-request latencies in seconds)."""
    latencies: list[float] = []
    async with RetrievalClient(url, max_concurrency=concurrency, timeout_s=60) as client:
        await asyncio.gather(*(client.search(q, K) for q in queries[:concurrency]))  # warm-up
        counter = iter(range(n_requests))

        async def worker():
            for i in counter:
                batch = [queries[(i * per_request + j) % len(queries)] for j in range(per_request)]
                t0 = time.perf_counter()
                await client.search_batch(batch, K)
                latencies.append(time.perf_counter() - t0)

        t0 = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        elapsed = time.perf_counter() - t0
    return n_requests / elapsed, latencies


def bench_server(
    name: str,
    retriever,
    queries: list[str],
    n_requests: int,
    repeats: int,
    workers: list[int],
    concurrency: int = 32,
) -> None:
    # In-process throughput measured before and after the server runs, so slow drift of the load from
    # other processes does not favour either side.
    before = median_rate(lambda: retriever.search_batch(queries, K), len(queries), repeats)
    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        retriever.save(Path(tmp) / "index")
        for w in workers:
            proc, url = start_server(Path(tmp) / "index", w)
            try:
                single = asyncio.run(drive(url, queries, n_requests, concurrency))
                batched = asyncio.run(
                    drive(url, queries, max(1, n_requests // 10), concurrency, per_request=10)
                )
            finally:
                proc.terminate()
                proc.wait(timeout=30)
            runs.append((w, single, batched))
    in_process = (before + median_rate(lambda: retriever.search_batch(queries, K), len(queries), repeats)) / 2
    print(f"\nserver ({name}), concurrency {concurrency}, k=10; client in this process")
    row("in-process search_batch (batch of 200)", in_process)
    for w, (rate, lat), (rate10, lat10) in runs:
        p50, p99 = np.percentile(np.array(lat) * 1000, [50, 99])
        row(
            f"{w} worker(s), 1 query/request ({len(lat)} req)",
            rate,
            "req/s",
            f"p50 {p50:.1f} ms, p99 {p99:.1f} ms",
        )
        p50, p99 = np.percentile(np.array(lat10) * 1000, [50, 99])
        row(
            f"{w} worker(s), 10 queries/request ({len(lat10)} req)",
            rate10 * 10,
            "q/s",
            f"p50 {p50:.1f} ms, p99 {p99:.1f} ms",
        )
        print(
            f"  {w} worker(s): server / in-process batch = {rate / in_process:.2f} (1 query/request), "
            f"{rate10 * 10 / in_process:.2f} (10 queries/request)"
        )


# ---- quality ------------------------------------------------------------------------------------


def quality(docs, bm25: BM25Retriever, dense: DenseRetriever) -> None:
    rows = load_wiki_qa("test")
    hybrid = HybridRetriever(bm25, dense)
    ks = (1, 5, 10)
    print(f"\nrecall@k on the WikiQA test split ({len(rows)} questions; seed 0)")
    print(f"  {'retriever':<10} {'type':<9} {'n':>5} " + " ".join(f"{'R@' + str(k):>7}" for k in ks))
    for name, r in (("bm25", bm25), ("dense", dense), ("hybrid", hybrid)):
        results = r.search_batch([x["question"] for x in rows], max(ks))
        for typ in ("describe", "define", "bridge", "all"):
            idx = [i for i, x in enumerate(rows) if typ in ("all", x["type"])]
            rec = recall_at_k([results[i] for i in idx], [rows[i]["support"] for i in idx], ks)
            print(f"  {name:<10} {typ:<9} {len(idx):>5} " + " ".join(f"{rec[k]:>7.3f}" for k in ks))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--requests", type=int, default=2000, help="server requests for BM25 (dense: a fifth)")
    p.add_argument("--workers", type=int, default=os.cpu_count() or 1, help="server processes (also run: 1)")
    p.add_argument("--skip-dense", action="store_true")
    p.add_argument("--skip-server", action="store_true")
    p.add_argument("--quality", action="store_true", help="also print recall@1/5/10 (needs the dense index)")
    args = p.parse_args()

    docs = wiki_corpus()
    queries = [r["question"] for r in load_wiki_qa("test", limit=200)]
    print(f"corpus: {len(docs)} documents; {len(queries)} queries; {os.cpu_count()} CPUs\n")
    bm25 = bench_bm25(docs, queries, args.repeats)
    dense = None if args.skip_dense else bench_dense(docs, queries, args.repeats)
    if not args.skip_server:
        workers = sorted({1, args.workers})
        bench_server("BM25", bm25, queries, args.requests, args.repeats, workers)
        if dense is not None:
            bench_server("dense", dense, queries, max(200, args.requests // 5), args.repeats, workers)
    if args.quality and dense is not None:
        quality(docs, bm25, dense)


if __name__ == "__main__":
    main()
