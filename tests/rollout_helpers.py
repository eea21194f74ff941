"""Small real envs and scripted turns shared by the collector tests and benchmarks.

``AddEnv``: a tool env with an ``add(a, b)`` tool; the episode ends when the assistant answers
without a tool call, and the reward is 1.0 iff the answer contains the task's expected number.
Variants hang in a tool (``hang_s``) or raise from ``step`` (``crash_on_turn``).
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from typing import Any

import gymnasium as gym

from chatgym.envs import messages as M
from chatgym.envs.core import AssistantTurn, ChatEnv, StepOutcome
from chatgym.envs.spaces import ActionSpace, MessagesSpace
from chatgym.envs.tools import Tool

TASKS = [
    {"task_id": "add-0", "question": "What is 2 + 3 + 4?", "answer": 9},
    {"task_id": "add-1", "question": "What is 10 + 20 + 30?", "answer": 60},
    {"task_id": "add-2", "question": "What is 1 + 1 + 1?", "answer": 3},
]


def add_tool(hang_s: float = 0.0, latency: Any = None) -> Tool:
    async def add(a: int, b: int) -> str:
        """Add two integers.

        Args:
            a: first addend.
            b: second addend.
        """
        if hang_s:
            await asyncio.sleep(hang_s)
        if latency is not None:
            await asyncio.sleep(latency())
        return str(a + b)

    return Tool.from_function(add)


class AddEnv(ChatEnv):
    """Tool env over :data:`TASKS` (see module docstring)."""

    def __init__(
        self, hang_s: float = 0.0, crash_on_turn: int | None = None, latency: Any = None, **kwargs: Any
    ):
        kwargs.setdefault("max_turns", 8)
        kwargs.setdefault("tool_timeout_s", 3600.0)
        super().__init__(tools=[add_tool(hang_s, latency)], **kwargs)
        self.crash_on_turn = crash_on_turn

    def load_tasks(self, split: str) -> list[dict[str, Any]]:
        return TASKS

    def initial_messages(self, task: dict[str, Any]) -> list[M.Message]:
        return [M.system("You add numbers with the add tool."), M.user(task["question"])]

    async def react(self, turn: AssistantTurn) -> StepOutcome:
        if self.crash_on_turn is not None and self.turn - 1 == self.crash_on_turn:
            raise RuntimeError("boom")
        return await super().react(turn)

    async def score(self, turn: AssistantTurn) -> StepOutcome:
        numbers = re.findall(r"-?\d+", turn.raw_text)
        ok = bool(numbers) and int(numbers[-1]) == self.task["answer"]
        return StepOutcome(reward=1.0 if ok else 0.0, terminated=True)


class OkEnv(ChatEnv):
    """Answers every assistant turn with the user message "ok" until ``max_turns`` (reward 0.5 each)."""

    def __init__(self, **kwargs: Any):
        kwargs.setdefault("max_turns", 100)
        super().__init__(**kwargs)

    def load_tasks(self, split: str) -> list[dict[str, Any]]:
        return TASKS

    def initial_messages(self, task: dict[str, Any]) -> list[M.Message]:
        return [M.user(task["question"])]

    async def react(self, turn: AssistantTurn) -> StepOutcome:
        return StepOutcome(messages=[M.user("ok")], reward=0.5)


class SyncEchoEnv(gym.Env):
    """A plain sync Gymnasium env (no async API): each step sleeps ``sleep_s`` then echoes the action
    back as a user message; terminates after ``turns`` steps with reward = number of steps."""

    def __init__(self, sleep_s: float = 0.0, turns: int = 2):
        self.observation_space = MessagesSpace()
        self.action_space = ActionSpace()
        self.sleep_s = sleep_s
        self.turns = turns
        self.n = 0

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        self.n = 0
        return [M.user("Say something.")], {"task_id": "echo"}

    def step(self, action: str):
        time.sleep(self.sleep_s)
        self.n += 1
        done = self.n >= self.turns
        return [M.user(f"echo: {action}")], float(self.n), done, False, {}


def tool_call_text(name: str, **arguments: Any) -> str:
    """Hermes-style call text, as a model following the chatml_tools template writes it."""
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": arguments}) + "\n</tool_call>"


ASSISTANT_HEADER = "<|im_start|>assistant\n"
