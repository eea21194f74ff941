"""Gateway overhead: microseconds per chat request through the gateway vs the collector.

The same engine (a scripted :class:`~chatgym.trainer.engines.replay.ReplayEngine` with no delay, so
the engine costs ~0), the same replies (``--turns - 1`` hermes calls of an ``add`` tool, then an
answer) and the same tool env. The collector side runs the episodes itself (env step, chat-template
delta, generate). The gateway side runs ``trainer.rollout_source: gateway``'s
:class:`~chatgym.trainer.gateway.source.GatewayCollector`: per episode an env reset (the task), a
session, an agent written with the ``openai`` client (``--agent sync``: threads, the usual way an
agent is written; ``async``: ``AsyncOpenAI`` on the event loop) that plays the env's loop over HTTP
(the add tool run in the agent), the session's end. ``--client shared`` (default) builds one OpenAI
client per process and copies it per session (``with_options(api_key=...)``, as the example agent
does); ``per-episode`` builds a new client per episode (each loads the CA bundle: ~50-100 ms). Both
sides check that they produced the same token ids. Runs come in pairs in alternating order; medians
over pairs are reported: us per request for each side, their ratio, the gateway's extra us per
request, and the gateway side's latency per request split into the server's (``timing["serve_s"]``:
body, render, sample, answer, JSON) and the client's (time inside ``create()`` less the server's: the
openai client's request building and parsing, httpx, the HTTP round trip, and with concurrency > 1
the waits for the GIL and the event loop), plus the client set-up per episode.

    .venv/bin/python benchmarks/gateway_overhead.py --episodes 64 --turns 3 --repeats 5
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import threading
import time
from typing import Any

from chatgym.envs import messages as M
from chatgym.envs.core import AssistantTurn, ChatEnv, StepOutcome
from chatgym.envs.tools import Tool
from chatgym.trainer.config.gateway import GatewayConfig
from chatgym.trainer.engines.replay import ReplayEngine, turn_script
from chatgym.trainer.gateway.source import gateway_collector
from chatgym.trainer.rollout.collector import Collector, RolloutConfig

HEADER = "<|im_start|>assistant\n"


async def add(a: int, b: int) -> str:
    """Add two integers.

    Args:
        a: first addend.
        b: second addend.
    """
    return str(a + b)


class AddEnv(ChatEnv):
    """A tool env: the add tool, then any answer ends the episode (reward 1)."""

    def __init__(self, **kwargs: Any):
        super().__init__(tools=[Tool.from_function(add)], max_turns=64, **kwargs)

    def load_tasks(self, split: str) -> list[dict[str, Any]]:
        return [{"task_id": i, "question": f"What is {i} + {i + 1}?"} for i in range(4096)]

    def initial_messages(self, task: dict[str, Any]) -> list[M.Message]:
        return [M.system("You add numbers with the add tool."), M.user(task["question"])]

    async def score(self, turn: AssistantTurn) -> StepOutcome:
        return StepOutcome(reward=1.0, terminated=True)


def _tool_results(message: Any) -> list[dict[str, Any]]:
    out = []
    for call in message.tool_calls or ():
        args = json.loads(call.function.arguments)
        out.append({"role": "tool", "tool_call_id": call.id, "content": str(args["a"] + args["b"])})
    return out


# Set by main() in the module the gateway loaded the agents from (its own copy of this file).
CLIENT = "shared"
STATS: dict[str, list[float]] = {"setup_s": [], "call_s": []}
_SHARED: dict[tuple[str, bool], Any] = {}
_LOCK = threading.Lock()


def _client(base_url: str, api_key: str, is_async: bool) -> Any:
    import openai

    cls = openai.AsyncOpenAI if is_async else openai.OpenAI
    t = time.perf_counter()
    if CLIENT == "per-episode":
        client = cls(base_url=base_url, api_key=api_key, max_retries=0)
    else:
        with _LOCK:
            if (base_url, is_async) not in _SHARED:
                _SHARED[base_url, is_async] = cls(base_url=base_url, api_key="unset", max_retries=0)
        client = _SHARED[base_url, is_async].with_options(api_key=api_key)
    STATS["setup_s"].append(time.perf_counter() - t)
    return client


def sync_agent(base_url: str, api_key: str, task: dict[str, Any]) -> float:
    """The env's loop over the OpenAI API (``openai.OpenAI``, in a thread)."""
    client = _client(base_url, api_key, False)
    messages = list(task["messages"])
    while True:
        t = time.perf_counter()
        message = client.chat.completions.create(model="m", messages=messages, tools=task["tools"]).choices[0].message
        STATS["call_s"].append(time.perf_counter() - t)
        messages.append(message.model_dump(exclude_none=True))
        if not message.tool_calls:
            if CLIENT == "per-episode":
                client.close()
            return 1.0
        messages.extend(_tool_results(message))


async def async_agent(base_url: str, api_key: str, task: dict[str, Any]) -> float:
    """:func:`sync_agent` with ``openai.AsyncOpenAI`` on the event loop."""
    client = _client(base_url, api_key, True)
    messages = list(task["messages"])
    while True:
        t = time.perf_counter()
        reply = await client.chat.completions.create(model="m", messages=messages, tools=task["tools"])
        STATS["call_s"].append(time.perf_counter() - t)
        message = reply.choices[0].message
        messages.append(message.model_dump(exclude_none=True))
        if not message.tool_calls:
            if CLIENT == "per-episode":
                await client.close()
            return 1.0
        messages.extend(_tool_results(message))


def make_engine(tok: Any, turns: int) -> ReplayEngine:
    enc = lambda text: tok.encode(text, add_special_tokens=False)  # noqa: E731
    call = "<tool_call>\n" + json.dumps({"name": "add", "arguments": {"a": 2, "b": 3}}) + "\n</tool_call>"
    eos = tok.convert_tokens_to_ids("<|im_end|>")
    script = [[*enc(call), eos]] * (turns - 1) + [[*enc("The answer is 5"), eos]]
    return ReplayEngine(turn_script(script, enc(HEADER)), tok)


async def timed(collector: Any, episodes: int) -> tuple[float, list[Any]]:
    t0 = time.perf_counter()
    trajs = await collector.collect(AddEnv, episodes, 1, seed=0)
    wall = time.perf_counter() - t0
    bad = [t.error for t in trajs if t.failed]
    if bad:
        raise SystemExit(f"episodes failed: {bad[:3]}")
    return wall, trajs


def _us(values: list[float]) -> str:
    return "[" + ", ".join(f"{x:.0f}" for x in values) + "]"


async def run_pairs(collector: Any, gateway: Any, stats: dict[str, list[float]], args: Any) -> dict[str, list[float]]:
    """``--repeats`` pairs of runs in alternating order; per run, us per request (collector, gateway,
    the gateway's server and client parts) and us per episode of client set-up."""
    requests = args.episodes * args.turns
    out: dict[str, list[float]] = {k: [] for k in ("collector", "gateway", "server", "client", "setup")}
    for i in range(args.repeats):
        order = [("collector", collector), ("gateway", gateway)]
        ids = {}
        for name, side in order if i % 2 == 0 else order[::-1]:
            for v in stats.values():
                v.clear()
            wall, trajs = await timed(side, args.episodes)
            ids[name] = [t.token_ids for t in trajs]
            out[name].append(1e6 * wall / requests)
            if name == "gateway":
                server = sum(t.timing.get("serve_s", 0.0) for t in trajs)
                out["server"].append(1e6 * server / requests)
                out["client"].append(1e6 * (sum(stats["call_s"]) - server) / requests)
                out["setup"].append(1e6 * sum(stats["setup_s"]) / args.episodes)
        if ids["collector"] != ids["gateway"]:
            raise SystemExit("the gateway's token ids differ from the collector's")
    return out


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--episodes", type=int, default=64)
    ap.add_argument("--turns", type=int, default=3, help="requests per episode (tool calls + answer)")
    ap.add_argument("--concurrency", type=int, default=16, help="episodes in flight on both sides")
    ap.add_argument("--agent", choices=["sync", "async"], default="sync")
    ap.add_argument("--client", choices=["shared", "per-episode"], default="shared",
                    help="one OpenAI client per process (copied per session) or a new one per episode")
    ap.add_argument("--repeats", type=int, default=5, help="pairs of runs")
    args = ap.parse_args()

    from chatgym.trainer.chat.tokenizer import get_tokenizer

    tok = get_tokenizer("smollm2")
    rollout = RolloutConfig(max_concurrent_episodes=args.concurrency, episode_timeout_s=300.0, max_model_len=8192)
    collector = Collector(make_engine(tok, args.turns), tok, rollout)
    program = GatewayConfig(
        agent=f"{__file__}:{args.agent}_agent", concurrency=args.concurrency, reward="program"
    )
    gateway = gateway_collector(make_engine(tok, args.turns), tok, rollout, program)
    agent_module = gateway.program.fn.__globals__  # the gateway's copy of this file
    agent_module["CLIENT"] = args.client
    try:
        await timed(gateway, 2)  # warm-up: server start, imports, the client's connection set-up
        await timed(collector, 2)
        r = await run_pairs(collector, gateway, agent_module["STATS"], args)
    finally:
        collector.close()
        await gateway.aclose()
    med = {k: statistics.median(v) for k, v in r.items()}
    pairs = list(zip(r["gateway"], r["collector"], strict=True))
    print(f"{args.episodes} episodes x {args.turns} requests, concurrency {args.concurrency}, "
          f"agent {args.agent}, client {args.client}")
    print(f"collector us/request: {_us(r['collector'])}")
    print(f"gateway   us/request: {_us(r['gateway'])}")
    print(f"median us/request: collector {med['collector']:.0f}, gateway {med['gateway']:.0f}")
    print(f"gateway extra us/request (median of pairs): {statistics.median(g - c for g, c in pairs):.0f}")
    print(f"ratio gateway / collector (median of pairs): {statistics.median(g / c for g, c in pairs):.2f}")
    # Latencies: with concurrency > 1 requests overlap, so these add up to more than the wall time.
    print(f"gateway latency per request, median: server {med['server']:.0f} us (body, render, sample, answer, "
          f"JSON); client {med['client']:.0f} us (openai client, httpx, HTTP round trip, waits for the GIL "
          f"and the event loop); client set-up {med['setup']:.0f} us/episode")


if __name__ == "__main__":
    asyncio.run(main())
