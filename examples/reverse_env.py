"""A new chatgym env in one file: ``ReverseWord-v0`` (spell a word backwards), played by a scripted policy.

    .venv/bin/python examples/reverse_env.py

The env is a :class:`chatgym.envs.ChatEnv` subclass with the three hooks every dataset env has
(``load_tasks``, ``initial_messages``, ``score``) and one tool, ``count_letters``, that the model may
call before it answers. docs/write-an-env.md walks through it; tests/test_docs.py runs this file and
checks what it prints.
"""

from __future__ import annotations

import re
from typing import Any

import gymnasium as gym

import chatgym  # noqa: F401  (registers chatgym's own env ids; not needed for this env, but usual)
from chatgym.envs import messages as M
from chatgym.envs.core import AssistantTurn, ChatEnv, StepOutcome

ENV_ID = "ReverseWord-v0"
WORDS = {"train": ["gym", "token", "reward", "policy"], "test": ["agent", "sandbox"]}
_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.S)


def count_letters(word: str) -> int:
    """Count the letters of a word.

    Args:
        word: the word whose letters are counted.
    """
    return sum(c.isalpha() for c in word)


class ReverseWordEnv(ChatEnv):
    """Spell a word backwards, inside ``<answer>`` tags; up to 3 turns (tool calls, then the answer).

    Task rows (``options={"task": row}``): ``{"task_id": str, "word": str}``. The final step's
    ``info``: ``answer`` (str or None), ``expected`` (str), ``success`` (bool) and
    ``reward_components`` (``{"correct": 0.0 | 1.0, "format": 0.0 | 1.0}``).
    """

    def __init__(self, **kwargs: Any):
        kwargs.setdefault("max_turns", 3)
        super().__init__(tools=[count_letters], **kwargs)

    def load_tasks(self, split: str) -> list[dict[str, Any]]:
        return [{"task_id": f"{split}/{i}", "word": w} for i, w in enumerate(WORDS[split])]

    def initial_messages(self, task: dict[str, Any]) -> list[M.Message]:
        return [
            M.system("Answer with the word spelled backwards inside <answer></answer> tags."),
            M.user(f"Spell {task['word']!r} backwards."),
        ]

    async def score(self, turn: AssistantTurn) -> StepOutcome:
        # Called for a turn without tool calls: the final answer. The base class runs tool calls.
        tags = _ANSWER.findall(turn.raw_text)
        answer = tags[-1].strip() if tags else None
        expected = self.task["word"][::-1]
        correct = float(answer == expected)
        info = {
            "answer": answer,
            "expected": expected,
            "success": answer == expected,
            "reward_components": {"correct": correct, "format": float(bool(tags))},
        }
        return StepOutcome(reward=correct, terminated=True, info=info)

    def reference_action(self) -> str:
        """The right answer (evaluation's "reference" policy and tests use it)."""
        return f"<answer>{self.task['word'][::-1]}</answer>"


def register() -> None:
    if ENV_ID not in gym.registry:
        gym.register(id=ENV_ID, entry_point=ReverseWordEnv)


def play(env: gym.Env, replies: list[str], options: dict[str, Any]) -> None:
    """One episode: reset, then one scripted assistant turn per reply until the episode ends."""
    obs, info = env.reset(seed=0, options=options)
    print(f"task {info['task_id']}: {obs[-1]['content']}  (tools: {[t['function']['name'] for t in info['tools']]})")
    for reply in replies:
        obs, reward, terminated, truncated, info = env.step(reply)
        new = [f"{m['role']}: {m['content']!r}" for m in obs]  # only the NEW messages
        print(f"  turn {info['turn']}: reward {reward} terminated {terminated} truncated {truncated} new {new}")
        if terminated or truncated:
            print(f"  success {info['success']} answer {info['answer']!r} components {info['reward_components']}")
            return


def main() -> None:
    register()
    env = gym.make(ENV_ID, split="train")
    call = '<tool_call>{"name": "count_letters", "arguments": {"word": "token"}}</tool_call>'
    play(env, [call, "<answer>nekot</answer>"], {"task_index": 1})  # a tool call, then the answer
    play(env, ["drawer"], {"task_index": 2})  # no tags: wrong format, wrong answer
    play(env, ["<answer>gnirts</answer>"], {"task": {"task_id": "mine/0", "word": "string"}})
    env.close()


if __name__ == "__main__":
    main()
