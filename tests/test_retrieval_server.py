"""The retrieval server as a real process (``python -m chatgym.cli serve-retriever``) on 127.0.0.1,
the async client's timeouts / retries / concurrency cap against a stub server process, the env over
HTTP, and the ``chatgym`` command.
"""

import asyncio
import os
import select
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import aiohttp
import pytest

from chatgym.envs.search.env import SearchEnv, format_passages
from chatgym.envs.search.wiki_qa import load_wiki_qa
from chatgym.retrievers.bm25 import BM25Retriever
from chatgym.retrievers.client import RetrievalClient, RetrievalError
from chatgym.retrievers.corpora import wiki_corpus

REPO = Path(__file__).resolve().parents[1]


def start(cmd: list[str], log: Path, timeout_s: float = 120.0) -> tuple[subprocess.Popen, str]:
    """Start a server that prints ``... http://HOST:PORT`` on its first stdout line; return its URL."""
    with open(log, "w") as err:  # the child keeps its own copy of the descriptor
        proc = subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stderr=err, text=True, cwd=REPO, env={**os.environ}
        )
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        ready, _, _ = select.select([proc.stdout], [], [], 0.5)
        if ready:
            line = proc.stdout.readline()
            if "http://" in line:
                return proc, "http://" + line.rsplit("http://", 1)[1].strip()
        if proc.poll() is not None:
            break
    stop(proc)
    raise RuntimeError(f"server did not start: {log.read_text()[-2000:]}")


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def wait_healthy(url: str, timeout_s: float = 30.0) -> dict:
    async def probe() -> dict:
        async with RetrievalClient(url, retries=0, timeout_s=2) as c:
            return await c.health()

    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return asyncio.run(probe())
        except RetrievalError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


@pytest.fixture(scope="module")
def bm25(tmp_path_factory):
    return BM25Retriever(wiki_corpus())


@pytest.fixture(scope="module")
def server(bm25, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("server")
    bm25.save(tmp / "index")
    cmd = [
        sys.executable,
        "-m",
        "chatgym.cli",
        "serve-retriever",
        "--index",
        str(tmp / "index"),
        "--port",
        "0",
    ]
    proc, url = start(cmd, tmp / "server.log")
    try:
        yield url, wait_healthy(url)
    finally:
        stop(proc)


@pytest.fixture(scope="module")
def questions():
    return [r["question"] for r in load_wiki_qa("test", limit=160)]


def test_health(server):
    url, health = server
    assert url.startswith("http://127.0.0.1:")
    assert health == {"status": "ok", "kind": "bm25", "num_docs": 10_033, "topk": 3}


async def test_concurrent_batches_equal_in_process_results(server, bm25, questions):
    url, _ = server
    batches = [questions[i : i + 5] for i in range(0, len(questions), 5)]  # 32 requests of 5 queries
    async with RetrievalClient(url, max_concurrency=16) as client:
        remote = await asyncio.gather(*(client.search_batch(b, 10) for b in batches))
    assert len(remote) == 32
    for batch, got in zip(batches, remote, strict=True):
        assert got == bm25.search_batch(batch, 10)  # ids, texts, meta and scores, exactly


async def test_search_r1_request_shape(server, bm25):
    url, _ = server
    async with aiohttp.ClientSession() as s:
        async with s.post(f"{url}/retrieve", json={"queries": ["Stanley Kubrick film"]}) as r:
            body = await r.json()
        async with s.post(
            f"{url}/retrieve", json={"queries": ["Gdańsk"], "topk": 2, "return_scores": True}
        ) as r:
            scored = await r.json()
    (docs,) = body["result"]
    want = bm25.search("Stanley Kubrick film", 3)  # the server's default topk
    assert [d["id"] for d in docs] == [p.id for p in want]
    assert docs[0]["contents"] == f"{want[0].title}\n{want[0].text}" and "score" not in docs[0]
    (hits,) = scored["result"]
    assert [(h["document"]["id"], h["score"]) for h in hits] == [
        (p.id, p.score) for p in bm25.search("Gdańsk", 2)
    ]


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"queries": "one"}, "queries: must be a list of strings"),
        ({"queries": ["ok", "  "]}, r"queries[1] is empty or whitespace-only"),
        ({"queries": ["ok", 3]}, "queries[1] must be a str"),
        ({"queries": ["ok"], "topk": "3"}, "topk: must be an integer >= 1"),
        ({"queries": ["ok"], "topk": 0}, "topk: must be an integer >= 1"),
        ({"queries": ["ok"], "return_scores": "yes"}, "return_scores: must be a boolean"),
        ([1, 2], "request body must be a JSON object"),
    ],
)
async def test_bad_requests_get_400_naming_the_field(server, body, message):
    url, _ = server
    async with aiohttp.ClientSession() as s, s.post(f"{url}/retrieve", json=body) as r:
        assert r.status == 400
        assert message in (await r.json())["error"]


async def test_not_json_is_400(server):
    url, _ = server
    async with aiohttp.ClientSession() as s, s.post(f"{url}/retrieve", data=b"{nope") as r:
        assert r.status == 400 and "not valid JSON" in (await r.json())["error"]


def test_env_over_http_equals_in_process(server, bm25):
    url, _ = server
    env = SearchEnv(mode="tags", retriever_url=url, topk=4, max_passage_tokens=None)
    env.reset(options={"task": {"question": "Who directed 2001?", "answers": ["Stanley Kubrick"]}})
    obs, *_, info = env.step("<search>2001 A Space Odyssey director</search>")
    want = bm25.search("2001 A Space Odyssey director", 4)
    assert obs[0]["content"] == f"<information>{format_passages(want)}</information>"
    assert info["retrieved_ids"] == [p.id for p in want]
    env.close()


# ---- the client against a stub server process ---------------------------------------------------

STUB = textwrap.dedent(
    """
    import asyncio, sys
    from aiohttp import web

    fail_first, delay_s = int(sys.argv[1]), float(sys.argv[2])
    state = {"calls": 0, "inflight": 0, "max_inflight": 0}

    async def retrieve(request):
        state["calls"] += 1
        state["inflight"] += 1
        state["max_inflight"] = max(state["max_inflight"], state["inflight"])
        try:
            await asyncio.sleep(delay_s)
            if state["calls"] <= fail_first:
                return web.Response(status=503, text="busy")
            body = await request.json()
            doc = {"id": "x", "contents": "Title\\nsome text"}
            return web.json_response({"result": [[{"document": doc, "score": 1.5}] for _ in body["queries"]]})
        finally:
            state["inflight"] -= 1

    async def stats(request):
        return web.json_response(state)

    async def main():
        app = web.Application()
        app.router.add_post("/retrieve", retrieve)
        app.router.add_get("/stats", stats)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        print("stub on http://%s:%d" % runner.addresses[0], flush=True)
        await asyncio.Event().wait()

    asyncio.run(main())
    """
)


@pytest.fixture
def stub(tmp_path):
    script = tmp_path / "stub.py"
    script.write_text(STUB)
    procs = []

    def run(fail_first: int = 0, delay_s: float = 0.0) -> str:
        proc, url = start(
            [sys.executable, str(script), str(fail_first), str(delay_s)], tmp_path / "stub.log", 30
        )
        procs.append(proc)
        return url

    yield run
    for p in procs:
        stop(p)


async def stats(url: str) -> dict:
    async with aiohttp.ClientSession() as s, s.get(f"{url}/stats") as r:
        return await r.json()


async def test_client_retries_5xx_then_succeeds(stub):
    url = stub(fail_first=2)
    async with RetrievalClient(url, retries=2, backoff_s=0.01) as c:
        (hit,) = await c.search("q", 1)
    # Search-R1's document shape ({"id", "contents"}) is understood too.
    assert (hit.id, hit.text, hit.score, hit.title) == ("x", "some text", 1.5, "Title")
    assert (await stats(url))["calls"] == 3


async def test_client_gives_up_after_retries(stub):
    url = stub(fail_first=10)
    async with RetrievalClient(url, retries=1, backoff_s=0.01) as c:
        with pytest.raises(
            RetrievalError, match=r"failed after 2 attempts: RetrievalError: .*HTTP 503: busy"
        ):
            await c.search("q", 1)
    assert (await stats(url))["calls"] == 2


async def test_client_timeout(stub):
    url = stub(delay_s=5.0)
    t0 = time.monotonic()
    async with RetrievalClient(url, retries=1, timeout_s=0.3, backoff_s=0.01) as c:
        with pytest.raises(RetrievalError, match="failed after 2 attempts: TimeoutError"):
            await c.search("q", 1)
    assert time.monotonic() - t0 < 2.0  # two 0.3 s attempts, not the stub's 5 s


async def test_client_concurrency_cap(stub):
    url = stub(delay_s=0.1)
    async with RetrievalClient(url, max_concurrency=4) as c:
        t0 = time.monotonic()
        results = await asyncio.gather(*(c.search(f"q{i}", 1) for i in range(20)))
        elapsed = time.monotonic() - t0
    assert len(results) == 20
    assert (await stats(url))["max_inflight"] == 4
    assert elapsed >= 0.5  # 20 requests / 4 at a time * 0.1 s


async def test_client_checks_arguments_before_sending():
    async with RetrievalClient("http://127.0.0.1:9") as c:
        with pytest.raises(ValueError, match=r"queries\[0\] is empty"):
            await c.search(" ", 3)
        assert await c.search_batch([], 3) == []
    with pytest.raises(ValueError, match="max_concurrency must be >= 1"):
        RetrievalClient("http://x", max_concurrency=0)


# ---- the command line ---------------------------------------------------------------------------


def chatgym(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "chatgym.cli", *args], capture_output=True, text=True, cwd=REPO
    )


def test_cli_dispatch():
    out = chatgym("--help")
    assert out.returncode == 0 and "serve-retriever" in out.stdout
    out = chatgym("nope")
    assert out.returncode == 2 and "unknown subcommand 'nope'" in out.stderr
    out = chatgym("serve-retriever", "--index", "/no/such/index")
    assert out.returncode == 2 and "not 'wiki', an index directory or a JSONL corpus file" in out.stderr
    out = chatgym("serve-retriever", "--help")
    assert out.returncode == 0 and "--index" in out.stdout


def test_document_round_trip():
    from chatgym.retrievers.base import Passage
    from chatgym.retrievers.server import document_to_passage, passage_to_document

    for p in [
        Passage("a", "line one\nline two", 1.25, {"title": "T", "topic": "x"}),
        Passage("b", "no title\nbut a newline", 0.5, {}),
        Passage("c", "Zürich — 東京", -0.25, {"title": "Ünïcode"}),
    ]:
        doc = passage_to_document(p)
        assert doc["contents"] == (f"{p.title}\n{p.text}" if p.title else p.text)
        assert document_to_passage(doc, p.score) == p
    # Search-R1's corpora: {"id", "contents"} with the title on the first line.
    assert document_to_passage({"id": 7, "contents": "Paris\nCapital."}, 2) == Passage(
        "7", "Capital.", 2.0, {"title": "Paris"}
    )


async def test_stats_count_coalesced_batches(server):
    url, _ = server
    async with RetrievalClient(url) as c:
        await asyncio.gather(*(c.search(f"river {i}", 2) for i in range(8)))
    async with aiohttp.ClientSession() as s, s.get(f"{url}/stats") as r:
        stats = await r.json()
    assert stats["queries"] >= stats["requests"] >= 8 and 1 <= stats["batches"] <= stats["requests"]


@pytest.mark.slow
def test_hybrid_server_equals_in_process(tmp_path):
    # Dense + hybrid over a real slice (first 100 lead sections): the server loads the encoder
    # itself and must rank exactly like the in-process retriever.
    import torch
    from train_helpers import torch_threads

    from chatgym.retrievers import DenseRetriever, HybridRetriever

    docs = wiki_corpus(100)
    hybrid = HybridRetriever(BM25Retriever(docs), DenseRetriever(docs), depth=30)
    hybrid.save(tmp_path / "index")
    cmd = [sys.executable, "-m", "chatgym.cli", "serve-retriever", "--index", str(tmp_path / "index"), "--port", "0"]
    # The server encodes the queries itself, with this process's torch thread count (a Learner run
    # earlier in the session may have changed it from torch's default): both sides' float32 sums are
    # split alike, so the scores can match to 1e-6 and the rankings exactly.
    with torch_threads(torch.get_num_threads()):
        proc, url = start(cmd, tmp_path / "server.log", timeout_s=300)
        try:
            assert wait_healthy(url)["kind"] == "hybrid"
            queries = ["Kubrick science fiction film", "impressionist painting", "ancient philosopher", "opera"]

            async def remote():
                async with RetrievalClient(url) as c:
                    return await asyncio.gather(*(c.search_batch([q, q.upper()], 5) for q in queries))

            got = asyncio.run(remote())
            want = [hybrid.search_batch([q, q.upper()], 5) for q in queries]
            for g, w in zip(got, want, strict=True):
                assert [[(p.id, p.text, p.meta) for p in hits] for hits in g] == [
                    [(p.id, p.text, p.meta) for p in hits] for hits in w
                ]
                assert [[p.score for p in hits] for hits in g] == [
                    [pytest.approx(p.score) for p in hits] for hits in w
                ]
        finally:
            stop(proc)


def children_of(pid: int) -> list[int]:
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:  # field 4: parent pid
                out.append(int(entry.name))
    return out


def test_workers_share_the_port_and_stop_together(bm25, tmp_path):
    bm25.save(tmp_path / "index")
    cmd = [sys.executable, "-m", "chatgym.cli", "serve-retriever", "--index", str(tmp_path / "index")]
    proc, url = start([*cmd, "--port", "0", "--workers", "2"], tmp_path / "server.log")
    try:
        wait_healthy(url)
        (worker,) = children_of(proc.pid)
        queries = ["Kubrick", "Seurat painting", "river in Egypt", "Kraków"]

        async def remote():
            async with RetrievalClient(url, max_concurrency=8) as c:
                return await asyncio.gather(*(c.search_batch([q], 5) for q in queries * 10))

        got = asyncio.run(remote())
        assert got == [bm25.search_batch([q], 5) for q in queries * 10]
    finally:
        stop(proc)
    deadline = time.monotonic() + 10
    while Path(f"/proc/{worker}").exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not Path(f"/proc/{worker}").exists()  # the parent reaped its worker


def test_worker_dies_with_a_killed_parent(bm25, tmp_path):
    bm25.save(tmp_path / "index")
    cmd = [sys.executable, "-m", "chatgym.cli", "serve-retriever", "--index", str(tmp_path / "index")]
    proc, url = start([*cmd, "--port", "0", "--workers", "2"], tmp_path / "server.log")
    try:
        wait_healthy(url)
        (worker,) = children_of(proc.pid)
        proc.kill()  # SIGKILL: no cleanup in the parent; PR_SET_PDEATHSIG must stop the worker
        proc.wait()
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                state = Path(f"/proc/{worker}/stat").read_text().rsplit(")", 1)[1].split()[0]
            except OSError:
                break
            if state == "Z":
                break
            time.sleep(0.1)
        else:
            pytest.fail(f"worker {worker} outlived its killed parent")
    finally:
        stop(proc)
