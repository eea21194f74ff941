"""Shared pieces of the collector benchmarks: engines by name and two small real envs.

Engines (``--engine``):
* ``hf``: :class:`~chatgym.trainer.engines.hf.TransformersEngine` on SmolLM2's real weights;
* ``hf-random``: the same engine on a randomly initialised model of SmolLM2's architecture, built from
  ``config.json`` only (for machines that cannot hold the weights, e.g. a GPU host reached with a small
  upload); its text is noise, but every turn generates exactly ``max_tokens`` tokens;
* ``vllm``: in-process vLLM;
* ``replay``: :class:`~chatgym.trainer.engines.replay.ReplayEngine`, a scripted policy with a fixed
  delay per call (an engine with unlimited batch parallelism): isolates the collector's own work.
"""

from __future__ import annotations

import asyncio
import math
import statistics
from typing import Any

import numpy as np

from chatgym.envs import messages as M
from chatgym.envs.core import AssistantTurn, ChatEnv, StepOutcome
from chatgym.envs.messages import make_tool_call
from chatgym.envs.tools import Tool, run_tool_call

QUESTIONS = [
    "Find the population of city number {i} and compare it with its neighbours.",
    "Look up the opening hours of library {i} and summarise them.",
    "Which trains leave station {i} after noon? Check the timetable.",
    "Collect the weather of region {i} for the last three days.",
]
TASKS = [{"task_id": i, "question": QUESTIONS[i % len(QUESTIONS)].format(i=i)} for i in range(4096)]


def make_engine(
    name: str,
    model: str,
    tokenizer: Any,
    *,
    device: str | None,
    dtype: str,
    delay_s: float,
    threads: int | None = None,
) -> Any:
    """An engine by benchmark name (see the module docstring); ``threads``: torch CPU threads (hf)."""
    if name == "replay":
        from chatgym.trainer.engines.replay import ReplayEngine

        words = tokenizer.encode(" Looking up the next record in the table now.", add_special_tokens=False)
        eos = tokenizer.convert_tokens_to_ids("<|im_end|>")
        return ReplayEngine(lambda ids: [*words, eos], tokenizer, delay_s=delay_s)
    if name in ("hf", "hf-random"):
        from chatgym.trainer.engines.hf import TransformersEngine

        if name == "hf":
            return TransformersEngine(
                model, tokenizer, dtype=dtype, device=device, max_batch_size=256, num_threads=threads
            )
        from chatgym.trainer.models.random_init import random_model

        net = random_model(model, dtype=dtype, device=device or "cpu")
        return TransformersEngine(net, tokenizer, max_batch_size=256, num_threads=threads)
    if name == "vllm":
        from chatgym.trainer.engines.vllm_inproc import VLLMEngine

        return VLLMEngine(model, tokenizer, dtype=dtype)
    raise ValueError(f"--engine must be one of hf, hf-random, vllm, replay; got {name!r}")


class LatencyEnv(ChatEnv):
    """A multi-turn env whose every step calls a tool with a heavy-tailed latency.

    Each assistant turn is sent to the env's ``lookup`` tool (a real :class:`Tool` call, run through
    ``run_tool_call``, with the turn's text as the query); the tool sleeps for a latency drawn from a
    log-normal distribution, capped like a tool timeout, and returns a short result. The episode ends
    after ``n_turns`` turns. The latency of (task, turn) is a fixed function of ``latency_seed``, so two
    ways of running the same tasks meet exactly the same latencies.

    Args:
        n_turns: assistant turns per episode.
        median_s, sigma: log-normal parameters (median in seconds, sigma of the log).
        cap_s: latency cap in seconds.
        latency_seed: seed of the latency draws.
    """

    def __init__(
        self,
        n_turns: int = 8,
        median_s: float = 0.1,
        sigma: float = 1.5,
        cap_s: float = 10.0,
        latency_seed: int = 0,
    ):
        super().__init__(max_turns=n_turns + 1)
        self.n_turns, self.median_s, self.sigma, self.cap_s = n_turns, median_s, sigma, cap_s
        self.latency_seed = latency_seed

        async def lookup(query: str) -> str:
            """Look something up.

            Args:
                query: what to look up.
            """
            await asyncio.sleep(self.latency(self.task["task_id"], self.turn))
            return f"Record {self.turn} for task {self.task['task_id']}: {len(query)} characters matched."

        self.tool_map = {"lookup": Tool.from_function(lookup)}

    def latency(self, task_id: int, turn: int) -> float:
        rng = np.random.default_rng([self.latency_seed, task_id, turn])
        return float(min(self.cap_s, rng.lognormal(math.log(self.median_s), self.sigma)))

    def load_tasks(self, split: str) -> list[dict[str, Any]]:
        return TASKS

    def initial_messages(self, task: dict[str, Any]) -> list[M.Message]:
        return [M.user(task["question"])]

    async def react(self, turn: AssistantTurn) -> StepOutcome:
        call = make_tool_call("lookup", {"query": turn.raw_text[:500]}, f"call_{self.turn}")
        outcome = await run_tool_call(call, self.tool_map)
        return StepOutcome(messages=[outcome.message], reward=0.0, terminated=self.turn >= self.n_turns)


class OneTurnEnv(ChatEnv):
    """One question, one answer, reward 0: the collector's minimum work per episode."""

    def __init__(self) -> None:
        super().__init__(max_turns=1)

    def load_tasks(self, split: str) -> list[dict[str, Any]]:
        return TASKS

    def initial_messages(self, task: dict[str, Any]) -> list[M.Message]:
        return [M.user(task["question"])]

    async def react(self, turn: AssistantTurn) -> StepOutcome:
        return StepOutcome(terminated=True)


def median(xs: list[float]) -> float:
    return statistics.median(xs)


def fmt_runs(xs: list[float]) -> str:
    return ", ".join(f"{x:.3f}" for x in xs)
