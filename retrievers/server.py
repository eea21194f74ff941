"""A retrieval server over HTTP (aiohttp), with Search-R1's ``/retrieve`` request and response shape.

Endpoints:

* ``POST /retrieve`` with ``{"queries": [str, ...], "topk": int (optional), "return_scores": bool}``
  answers ``{"result": [[hit, ...] per query]}``; a hit is ``{"document": doc, "score": float}`` when
  ``return_scores`` is true, else the bare ``doc``; ``doc`` is
  ``{"id", "contents": "title\\ntext", "meta"}`` (``contents`` as in Search-R1's corpora).
  A malformed request gets HTTP 400 with ``{"error": "..."}`` naming the bad field.
* ``GET /health`` answers ``{"status": "ok", "kind", "num_docs", "topk"}``.
* ``GET /stats`` answers ``{"requests", "queries", "batches"}`` served so far (``queries / batches``
  is the mean size of the coalesced ``search_batch`` calls).

Searches run on one worker thread so the event loop keeps accepting requests; queries of requests
that arrive while a search runs are coalesced into the next ``search_batch`` call (same ``topk``),
which is where a dense retriever's batched encoder pays off.

Run it with ``chatgym serve-retriever --index wiki --kind bm25 --port 8000`` (see :func:`main`).
One process serves about one core's worth of searches (the GIL); ``--workers N`` forks N processes
that share the listening socket, each with its own copy of the index (``/stats`` is per process).
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import contextlib
import json
import os
import signal
import socket
import sys
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiohttp import web

try:
    import orjson as _orjson
except ImportError:  # plain json works, only slower
    _orjson = None

from chatgym.retrievers.base import Passage, Retriever, check_queries

MAX_BODY_BYTES = 64 * 2**20


def passage_to_document(p: Passage) -> dict[str, Any]:
    """The JSON ``document`` of a hit: ``{"id", "contents", "meta"}``, ``contents`` being
    ``"title\ntext"`` (or the text alone when there is no title), as in Search-R1's corpora."""
    return {"id": p.id, "contents": f"{p.title}\n{p.text}" if p.title else p.text, "meta": p.meta}


def document_to_passage(doc: dict[str, Any], score: float) -> Passage:
    """A :class:`Passage` from a ``/retrieve`` document (ours, or Search-R1's ``{"id", "contents"}``)."""
    contents = str(doc.get("contents", ""))
    meta = dict(doc.get("meta") or {})
    if "meta" not in doc:  # Search-R1: the first line of contents is the title
        title, _, text = contents.partition("\n")
        return Passage(str(doc.get("id", "")), text, float(score), {"title": title})
    title = str(meta.get("title") or "")
    text = contents[len(title) + 1 :] if title and contents.startswith(title + "\n") else contents
    return Passage(str(doc["id"]), text, float(score), meta)


def dumps(obj: Any) -> bytes:
    """JSON bytes, with orjson when installed (several times faster on 10-passage answers)."""
    return _orjson.dumps(obj) if _orjson is not None else json.dumps(obj).encode()


def loads(data: bytes) -> Any:
    """Parse JSON bytes (orjson when installed). Raises ``ValueError`` on bad JSON."""
    return _orjson.loads(data) if _orjson is not None else json.loads(data)


def json_response(obj: Any, status: int = 200) -> web.Response:
    return web.Response(body=dumps(obj), status=status, content_type="application/json")


@dataclass
class _Pending:
    queries: list[str]
    k: int
    future: asyncio.Future = field(repr=False)


class BatchingSearcher:
    """Runs a retriever's ``search_batch`` on one worker thread, coalescing queued requests.

    Args:
        retriever: any in-process retriever.
        max_batch: most queries sent to one ``search_batch`` call.
    """

    def __init__(self, retriever: Retriever, max_batch: int = 512):
        self.retriever = retriever
        self.max_batch = max_batch
        self._queue: asyncio.Queue[_Pending] | None = None
        self._task: asyncio.Task | None = None
        self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="retriever")
        self.stats = {"requests": 0, "queries": 0, "batches": 0}

    async def start(self) -> None:
        self._queue = asyncio.Queue()
        self._task = asyncio.create_task(self._worker())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        self._pool.shutdown(wait=False, cancel_futures=True)

    async def search(self, queries: list[str], k: int) -> list[list[Passage]]:
        assert self._queue is not None, "call start() first"
        fut = asyncio.get_running_loop().create_future()
        self._queue.put_nowait(_Pending(queries, k, fut))
        return await fut

    async def _worker(self) -> None:
        assert self._queue is not None
        loop = asyncio.get_running_loop()
        while True:
            items = [await self._queue.get()]
            n = len(items[0].queries)
            while n < self.max_batch and not self._queue.empty():
                items.append(self._queue.get_nowait())
                n += len(items[-1].queries)
            by_k: dict[int, list[_Pending]] = defaultdict(list)
            for it in items:
                by_k[it.k].append(it)
            for k, group in by_k.items():
                queries = [q for it in group for q in it.queries]
                self.stats["requests"] += len(group)
                self.stats["queries"] += len(queries)
                self.stats["batches"] += 1
                try:
                    results = await loop.run_in_executor(self._pool, self.retriever.search_batch, queries, k)
                except Exception as exc:
                    for it in group:
                        if not it.future.done():
                            it.future.set_exception(exc)
                    continue
                start = 0
                for it in group:
                    if not it.future.done():  # the client may have gone away
                        it.future.set_result(results[start : start + len(it.queries)])
                    start += len(it.queries)


def parse_retrieve_request(body: Any, default_topk: int) -> tuple[list[str], int, bool]:
    """Validate a ``/retrieve`` body; returns ``(queries, topk, return_scores)``.

    Raises:
        ValueError: with a message naming the bad field (``queries``, ``queries[i]``, ``topk``,
            ``return_scores``).
    """
    if not isinstance(body, dict):
        raise ValueError("request body must be a JSON object")
    queries = body.get("queries")
    if not isinstance(queries, list):
        raise ValueError("queries: must be a list of strings")
    topk = body.get("topk")
    topk = default_topk if topk is None else topk
    if isinstance(topk, bool) or not isinstance(topk, int) or topk < 1:
        raise ValueError(f"topk: must be an integer >= 1, got {topk!r}")
    return_scores = body.get("return_scores", False)
    if not isinstance(return_scores, bool):
        raise ValueError(f"return_scores: must be a boolean, got {return_scores!r}")
    try:
        check_queries(queries, topk)
    except (TypeError, ValueError) as exc:
        raise ValueError(str(exc)) from None
    return queries, topk, return_scores


def make_app(retriever: Retriever, *, default_topk: int = 3, max_batch: int = 512) -> web.Application:
    """The aiohttp application serving ``retriever`` (see the module docstring)."""
    searcher = BatchingSearcher(retriever, max_batch)
    app = web.Application(client_max_size=MAX_BODY_BYTES)

    async def retrieve(request: web.Request) -> web.Response:
        try:
            body = loads(await request.read())
        except ValueError as exc:
            return json_response({"error": f"request body is not valid JSON ({exc})"}, status=400)
        try:
            queries, topk, return_scores = parse_retrieve_request(body, default_topk)
        except ValueError as exc:
            return json_response({"error": str(exc)}, status=400)
        try:
            results = await searcher.search(queries, topk)
        except Exception as exc:  # a retriever bug is the client's 500, not the server's crash
            return json_response({"error": f"search failed: {type(exc).__name__}: {exc}"}, status=500)
        if return_scores:
            out = [[{"document": passage_to_document(p), "score": p.score} for p in hits] for hits in results]
        else:
            out = [[passage_to_document(p) for p in hits] for hits in results]
        return json_response({"result": out})

    async def health(request: web.Request) -> web.Response:
        return json_response(
            {"status": "ok", "kind": retriever.kind, "num_docs": len(retriever.docs), "topk": default_topk}
        )

    async def stats(request: web.Request) -> web.Response:
        return json_response(searcher.stats)

    async def on_startup(app: web.Application) -> None:
        await searcher.start()

    async def on_cleanup(app: web.Application) -> None:
        await searcher.stop()

    app.router.add_post("/retrieve", retrieve)
    app.router.add_get("/health", health)
    app.router.add_get("/stats", stats)
    app.on_startup.append(on_startup)
    app.on_cleanup.append(on_cleanup)
    return app


async def serve(
    retriever: Retriever,
    host: str = "127.0.0.1",
    port: int = 8000,
    default_topk: int = 3,
    *,
    sock: socket.socket | None = None,
    announce: bool = True,
) -> None:
    """Serve until SIGINT/SIGTERM; print ``listening on http://HOST:PORT`` (the real port when 0).

    ``sock``: an already listening socket to serve on instead of binding ``host:port`` (the
    ``--workers`` processes share one); ``announce=False`` skips the print.
    """
    runner = web.AppRunner(make_app(retriever, default_topk=default_topk), access_log=None)
    await runner.setup()
    site = web.SockSite(runner, sock) if sock is not None else web.TCPSite(runner, host, port)
    await site.start()
    if announce:
        bound = runner.addresses[0]
        print(
            f"chatgym retrieval server: kind={retriever.kind} docs={len(retriever.docs)} "
            f"listening on http://{bound[0]}:{bound[1]}",
            flush=True,
        )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        await stop.wait()
    finally:
        await runner.cleanup()


def listening_socket(host: str, port: int) -> socket.socket:
    """A non-blocking TCP socket bound to ``host:port`` (0: a free port) and listening."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(1024)
    sock.setblocking(False)
    return sock


def _die_with_parent() -> None:
    """Linux: deliver SIGTERM to this (forked worker) process when its parent dies."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # 1 = PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def load_retriever(
    index: str,
    kind: str = "bm25",
    *,
    cache_dir: str | None = None,
    model: str | None = None,
    device: str = "cpu",
) -> Retriever:
    """The retriever for ``--index``: a saved index directory, ``wiki`` (the bundled Wikipedia
    corpus) or a ``.jsonl`` corpus file; the last two are built once into the cache as ``kind``.

    Raises:
        FileNotFoundError: ``index`` is neither a known corpus name, an index directory nor a file.
    """
    from chatgym.retrievers.build import cached_retriever, load_index
    from chatgym.retrievers.corpora import load_jsonl_corpus, wiki_corpus
    from chatgym.retrievers.store import read_meta

    dense_kw: dict[str, Any] = {"device": device, **({"model": model} if model else {})}
    path = Path(index)
    if index == "wiki":
        docs = wiki_corpus()
    elif path.is_dir():  # a saved index: its own kind, whatever --kind says
        return load_index(path, **(dense_kw if read_meta(path).get("kind") != "bm25" else {}))
    elif path.is_file():
        docs = load_jsonl_corpus(path)
    else:
        raise FileNotFoundError(f"--index {index!r}: not 'wiki', an index directory or a JSONL corpus file")
    return cached_retriever(kind, docs, cache_dir=cache_dir, dense=dense_kw)


def main(argv: Sequence[str] | None = None) -> int:
    """``chatgym serve-retriever``: serve an index on 127.0.0.1 (see ``--help``)."""
    p = argparse.ArgumentParser(prog="chatgym serve-retriever", description=__doc__.split("\n")[0])
    p.add_argument("--index", required=True, help="index directory, 'wiki', or a JSONL corpus file")
    p.add_argument("--kind", default="bm25", choices=["bm25", "dense", "hybrid"], help="for 'wiki' / JSONL")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000, help="0 picks a free port (printed on start)")
    p.add_argument("--topk", type=int, default=3, help="default topk when a request gives none")
    p.add_argument("--model", default=None, help="sentence-transformers model directory (dense/hybrid)")
    p.add_argument("--device", default="cpu")
    p.add_argument("--cache-dir", default=None, help="index cache root (default $CHATGYM_CACHE)")
    p.add_argument(
        "--workers",
        type=int,
        default=1,
        help="server processes sharing the port (each loads the index; one process uses about one core)",
    )
    args = p.parse_args(argv)
    if args.topk < 1:
        p.error(f"--topk must be >= 1, got {args.topk}")
    if args.workers < 1:
        p.error(f"--workers must be >= 1, got {args.workers}")
    sock = listening_socket(args.host, args.port) if args.workers > 1 else None
    children = []
    # Fork before anything heavy (torch, faiss) is loaded; every process then loads its own index.
    for _ in range(args.workers - 1):
        pid = os.fork()
        if pid == 0:  # a worker: serve, then leave without ever returning into the parent's code
            code = 1
            try:
                _die_with_parent()
                code = _run(args, sock, announce=False)
            finally:
                os._exit(code)
        children.append(pid)
    try:
        return _run(args, sock, announce=True)
    finally:
        for pid in children:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
        for pid in children:
            os.waitpid(pid, 0)


def _run(args: argparse.Namespace, sock: socket.socket | None, announce: bool) -> int:
    try:
        retriever = load_retriever(
            args.index, args.kind, cache_dir=args.cache_dir, model=args.model, device=args.device
        )
    except (FileNotFoundError, ValueError, ImportError) as exc:
        print(f"chatgym serve-retriever: {exc}", file=sys.stderr)
        return 2
    asyncio.run(serve(retriever, args.host, args.port, args.topk, sock=sock, announce=announce))
    return 0
