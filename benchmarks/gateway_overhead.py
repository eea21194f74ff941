"""Gateway overhead: microseconds per chat request through the gateway vs the collector.

The same engine (a scripted :class:`~chatgym.trainer.engines.replay.ReplayEngine` with no delay, so
the engine costs ~0), the same replies (``--turns - 1`` hermes calls of an ``add`` tool, then an
answer) and the same tool env. The collector side runs the episodes itself (env step, chat-template
delta, generate). The gateway side runs ``trainer.rollout_source: gateway``'s
:class:`~chatgym.trainer.gateway.source.GatewayCollector`: per episode an env reset (the task), a
session, an agent written with the ``openai`` client (``--agent sync``: threads, the usual way an
agent is written; ``async``: ``AsyncOpenAI`` on the event loop) that plays the env's loop over HTTP
(the add tool run in the agent), the session's end. Both sides check that they produced the same
token ids. Runs come in pairs in alternating order; medians over pairs are reported: us per request
for each side, their ratio, and the gateway's extra us per request.

    .venv/bin/python benchmarks/gateway_overhead.py --episodes 64 --turns 3 --repeats 5
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
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


def sync_agent(base_url: str, api_key: str, task: dict[str, Any]) -> float:
    """The env's loop over the OpenAI API (``openai.OpenAI``, in a thread)."""
    import openai

    client = openai.OpenAI(base_url=base_url, api_key=api_key, max_retries=0)
    messages = list(task["messages"])
    while True:
        message = client.chat.completions.create(model="m", messages=messages, tools=task["tools"]).choices[0].message
        messages.append(message.model_dump(exclude_none=True))
        if not message.tool_calls:
            client.close()
            return 1.0
        messages.extend(_tool_results(message))


async def async_agent(base_url: str, api_key: str, task: dict[str, Any]) -> float:
    """:func:`sync_agent` with ``openai.AsyncOpenAI`` on the event loop."""
    import openai

    async with openai.AsyncOpenAI(base_url=base_url, api_key=api_key, max_retries=0) as client:
        messages = list(task["messages"])
        while True:
            reply = await client.chat.completions.create(model="m", messages=messages, tools=task["tools"])
            message = reply.choices[0].message
            messages.append(message.model_dump(exclude_none=True))
            if not message.tool_calls:
                return 1.0
            messages.extend(_tool_results(message))


def make_engine(tok: Any, turns: int) -> ReplayEngine:
    enc = lambda text: tok.encode(text, add_special_tokens=False)  # noqa: E731
    call = "<tool_call>\n" + json.dumps({"name": "add", "arguments": {"a": 2, "b": 3}}) + "\n</tool_call>"
    eos = tok.convert_tokens_to_ids("<|im_end|>")
    script = [[*enc(call), eos]] * (turns - 1) + [[*enc("The answer is 5"), eos]]
    return ReplayEngine(turn_script(script, enc(HEADER)), tok)


async def timed(collector: Any, episodes: int) -> tuple[float, list[list[int]]]:
    t0 = time.perf_counter()
    trajs = await collector.collect(AddEnv, episodes, 1, seed=0)
    wall = time.perf_counter() - t0
    bad = [t.error for t in trajs if t.failed]
    if bad:
        raise SystemExit(f"episodes failed: {bad[:3]}")
    return wall, [t.token_ids for t in trajs]


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--episodes", type=int, default=64)
    ap.add_argument("--turns", type=int, default=3, help="requests per episode (tool calls + answer)")
    ap.add_argument("--concurrency", type=int, default=16, help="episodes in flight on both sides")
    ap.add_argument("--agent", choices=["sync", "async"], default="sync")
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
    requests = args.episodes * args.turns
    col_us, gw_us = [], []
    try:
        await timed(gateway, 2)  # warm-up: server start, imports, the client's connection set-up
        await timed(collector, 2)
        for i in range(args.repeats):
            order = [("collector", collector), ("gateway", gateway)]
            ids = {}
            for name, side in order if i % 2 == 0 else order[::-1]:
                wall, ids[name] = await timed(side, args.episodes)
                (col_us if name == "collector" else gw_us).append(1e6 * wall / requests)
            if ids["collector"] != ids["gateway"]:
                raise SystemExit("the gateway's token ids differ from the collector's")
    finally:
        collector.close()
        await gateway.aclose()
    ratios = [g / c for g, c in zip(gw_us, col_us, strict=True)]
    extra = [g - c for g, c in zip(gw_us, col_us, strict=True)]
    print(f"{args.episodes} episodes x {args.turns} requests, concurrency {args.concurrency}, agent {args.agent}")
    print(f"collector us/request: [{', '.join(f'{x:.0f}' for x in col_us)}]")
    print(f"gateway   us/request: [{', '.join(f'{x:.0f}' for x in gw_us)}]")
    print(f"median us/request: collector {statistics.median(col_us):.0f}, gateway {statistics.median(gw_us):.0f}")
    print(f"gateway extra us/request (median of pairs): {statistics.median(extra):.0f}")
    print(f"ratio gateway / collector (median of pairs): {statistics.median(ratios):.2f}")


if __name__ == "__main__":
    asyncio.run(main())
