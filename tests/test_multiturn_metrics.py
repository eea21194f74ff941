"""Multi-turn metrics on every run: tool calls and tool errors by kind, turns, truncation by budget,
reward by turn count (``chatgym.trainer.logging.step_metrics.multiturn_metrics``), from the kinds the envs
report (``info["tool_error_kinds"]``) through the collector's per-episode sums to the step metrics.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import gymnasium as gym
import pytest

import chatgym  # noqa: F401  (registers env ids)
from chatgym.envs import messages as M
from chatgym.envs.core import ChatEnv
from chatgym.envs.tools import TOOL_ERROR_KINDS, Tool, ToolResult
from chatgym.trainer.logging.step_metrics import TRUNCATION_BUDGETS, multiturn_metrics, rollout_metrics
from chatgym.trainer.rollout.episode import record_step
from chatgym.trainer.rollout.types import Trajectory


def call(name: str, **arguments: Any) -> str:
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": arguments}) + "\n</tool_call>"


# ---- the kinds the envs report ------------------------------------------------------------------


async def slow() -> str:
    """Takes a minute."""
    await asyncio.sleep(60)
    return "done"


async def broken() -> ToolResult:
    """Reports its own failure."""
    return ToolResult("Error: the backend is down", is_error=True)


class KindsEnv(ChatEnv):
    """A ChatEnv with a tool that times out and one that returns an error result."""

    def __init__(self) -> None:
        super().__init__(tools=[Tool.from_function(slow), Tool.from_function(broken)], tool_timeout_s=0.05)

    def load_tasks(self, split: str) -> list[dict[str, Any]]:
        return [{"task_id": "k"}]

    def initial_messages(self, task: dict[str, Any]) -> list[M.Message]:
        return [M.user("go")]


async def test_each_tool_error_kind_is_reported_by_the_env():
    env = gym.make("MathCalculator-v0", split="test").unwrapped
    await env.areset(options={"task_index": 0})
    cases = [
        ("<tool_call>\n{not json}\n</tool_call>", {"parse_error": 1}),
        (call("sqrt", x=4), {"unknown_tool": 1}),
        (call("calculate", expr="1 + 1"), {"bad_arguments": 1}),  # schema: 'expression' required
        (call("calculate", expression="1 / 0"), {"raised": 1}),  # ZeroDivisionError inside the tool
    ]
    env.max_turns = 10
    for text, kinds in cases:
        obs, _, _, _, info = await env.astep(text)
        assert info["tool_error_kinds"] == kinds and info["tool_errors"] == 1, text
        assert obs[0]["content"].startswith("Error:")
    # Two calls in one turn: one fine, one unknown.
    _, _, _, _, info = await env.astep(call("calculate", expression="2 + 2") + call("nope"))
    assert info["tool_error_kinds"] == {"unknown_tool": 1} and info["tool_errors"] == 1
    _, _, _, _, info = await env.astep(call("calculate", expression="2 + 2"))
    assert info["tool_error_kinds"] == {} and info["tool_errors"] == 0

    env = KindsEnv()
    await env.areset(options={"task_index": 0})
    _, _, _, _, info = await env.astep(call("slow") + call("broken"))
    assert info["tool_error_kinds"] == {"timeout": 1, "tool_error": 1} and info["tool_errors"] == 2
    assert set(TOOL_ERROR_KINDS) == {
        "parse_error",
        "unknown_tool",
        "bad_arguments",
        "raised",
        "timeout",
        "tool_error",
    }


def test_record_step_sums_kinds_and_counts_unclassified_errors():
    traj = Trajectory(env_id="x", task_id=0)
    tool = M.tool("r", "c1")
    record_step(traj, [tool, tool], 0.0, {"tool_errors": 2, "tool_error_kinds": {"timeout": 1, "raised": 1}})
    record_step(traj, [tool], 0.0, {"tool_errors": 1, "tool_error_kinds": {"timeout": 1}})
    record_step(traj, [tool, tool], 0.0, {"tool_errors": 2})  # an env that does not say the kind
    assert traj.info["tool_results_total"] == 5 and traj.info["tool_errors_total"] == 5
    assert traj.info["tool_errors_by_kind"] == {"timeout": 2, "raised": 1, "unspecified": 2}


# ---- the metrics on hand-built trajectories --------------------------------------------------------


def traj(
    turns: int, reward: float, calls: int = 0, kinds: dict[str, int] | None = None, **kw: Any
) -> Trajectory:
    kinds = kinds or {}
    info = {
        "tool_results_total": calls,
        "tool_errors_total": sum(kinds.values()),
        "tool_errors_by_kind": dict(kinds),
        "turns": kw.pop("turn_records", [{"finish_reason": "stop"}] * turns),
    }
    info.update(kw.pop("info", {}))
    t = Trajectory(env_id="x", task_id=0, finish_reasons=["stop"] * turns, reward=reward, info=info, **kw)
    return t


def batch() -> list[Trajectory]:
    t1 = traj(
        3, 1.0, 4, {"bad_arguments": 1, "timeout": 1},
        info={"genrm": {"score": 0.8, "judge_s": 2.0}, "reward_components": {"env": 0.2, "genrm": 0.8}},
    )  # fmt: skip
    t2 = traj(1, 0.0, 0, truncated=True, info={"truncated_by": "max_response_tokens"})
    t3 = traj(
        2, 0.5, 2, {"tool_error": 1}, truncated=True, info={"truncated_by": "max_model_len"},
        turn_records=[{"finish_reason": "stop"}, {"finish_reason": "length", "cut_by": "max_tokens"}],
    )  # fmt: skip
    t4 = traj(1, 0.0, 1, {"raised": 1}, error="timeout: episode exceeded", info={"error_kind": "timeout"})
    t5 = traj(
        1, 1.0, 1, {"custom_kind": 1},
        info={"genrm": {"score": None, "judge_s": 1.0}, "reward_components": {"env": 1.0, "genrm": 0.0}},
    )  # fmt: skip
    return [t1, t2, t3, t4, t5]


def test_multiturn_metrics_exact_values():
    m = multiturn_metrics(batch())
    # Trajectories that did not fail: t1, t2, t3, t5 (t4 timed out). Calls 4 + 0 + 2 + 1 = 7.
    assert m["tools/calls_per_episode"] == 7 / 4
    assert m["tools/episodes_with_call_frac"] == 3 / 4
    assert m["tools/error_rate"] == 4 / 7  # errors 2 + 0 + 1 + 1
    expected_kinds = dict.fromkeys(TOOL_ERROR_KINDS, 0.0) | {
        "bad_arguments": 1 / 7,
        "timeout": 1 / 7,
        "tool_error": 1 / 7,
        "custom_kind": 1 / 7,  # a kind an env made up is reported too
    }
    assert {
        k.removeprefix("tools/error_rate/"): v for k, v in m.items() if k.startswith("tools/error_rate/")
    } == (expected_kinds)
    assert (m["episode/turns_mean"], m["episode/turns_max"]) == (7 / 4, 3)  # turns 3, 1, 2, 1
    # Over all 5 trajectories: t2 by the response budget, t3 by the context (and a turn cut by
    # max_tokens), t4 by the episode timeout; none by the env's own max_turns.
    assert {b: m[f"episode/truncated/{b}"] for b in TRUNCATION_BUDGETS} == {
        "env": 0.0,
        "max_response_tokens": 0.2,
        "max_model_len": 0.2,
        "max_tokens": 0.2,
        "timeout": 0.2,
    }
    assert m["episode/truncated_frac"] == 3 / 5  # t2, t3, t4 ended by a budget
    # Reward by turns: 1 turn: t2 (0.0), t5 (1.0); 2 turns: t3 (0.5); 3 turns: t1 (1.0).
    assert {k: v for k, v in m.items() if k.startswith("reward/by_turns/")} == {
        "reward/by_turns/1": 0.5,
        "reward/by_turns/2": 0.5,
        "reward/by_turns/3": 1.0,
    }
    # GenRM: judged t1 (0.8) and t5 (unparseable) of 4.
    assert m["genrm/judged_frac"] == 0.5 and m["genrm/score_mean"] == 0.8
    assert m["genrm/unparseable_frac"] == 0.5 and m["genrm/judge_s_mean"] == 1.5
    assert m["reward/env_mean"] == pytest.approx(0.6) and m["reward/genrm_mean"] == 0.4


def test_prefix_and_step_metrics_carry_them():
    trajs = batch()
    plain, evald = multiturn_metrics(trajs), multiturn_metrics(trajs, prefix="eval/")
    assert evald == {f"eval/{k}": v for k, v in plain.items()}
    step = rollout_metrics(trajs, rollout_s=1.0)
    assert all(step[k] == v for k, v in plain.items())


def test_no_tool_calls_no_genrm():
    m = multiturn_metrics([traj(1, 1.0), traj(1, 0.0)])
    assert m["tools/calls_per_episode"] == 0.0 and m["tools/error_rate"] == 0.0
    assert all(m[f"tools/error_rate/{k}"] == 0.0 for k in TOOL_ERROR_KINDS)
    assert m["reward/by_turns/1"] == 0.5 and not any(k.startswith("genrm/") for k in m)
    assert multiturn_metrics([])["episode/turns_mean"] == 0.0


# ---- one collector run: a scripted policy on the real MathCalculator-v0 ----------------------------

IM_END = 2  # SmolLM2's <|im_end|>, the turn's EOS
SCRIPTS = {  # test split question -> the policy's turns (the last one repeats)
    "Calculate 26 - 28.": [
        "<tool_call>\n{not json}\n</tool_call>",  # parse_error
        call("sqrt", x=4),  # unknown_tool
        call("calculate", expression="26 - 28"),
        "<answer>-2</answer>",  # right: reward 1
    ],
    "Calculate 95 - 76.": ["<answer>19</answer>"],  # right at once
    "Calculate 31 - 42.": ["I think " * 60],  # cut by max_tokens=64; no answer: reward 0
    "Calculate 57 + 29.": [call("calculate", expression="1 / 0")],  # raised, until max_turns=4
    "Calculate 55 + 98.": [call("calculate", expression="55 + 98"), "<answer>153</answer>"],
}


def scripted_policy(tok):
    from chatgym.trainer.engines.replay import ReplayEngine, count_subsequence

    header = tok.encode("<|im_start|>assistant\n", add_special_tokens=False)

    def script(prompt_ids):
        text = tok.decode(prompt_ids)
        turns = next(v for q, v in SCRIPTS.items() if q in text)
        k = count_subsequence(prompt_ids, header) - 1
        return [*tok.encode(turns[min(k, len(turns) - 1)], add_special_tokens=False), IM_END]

    return ReplayEngine(script, tok)


@pytest.fixture(scope="module")
def tok():
    try:
        from chatgym.trainer.chat.tokenizer import get_tokenizer

        return get_tokenizer("smollm2")
    except ModuleNotFoundError as exc:  # the model package is a set-up step (scripts/setup.sh)
        pytest.skip(str(exc))


async def test_collector_run_on_math_calculator(tok):
    from chatgym.trainer.rollout.collector import Collector, RolloutConfig

    collector = Collector(scripted_policy(tok), tok, RolloutConfig(max_tokens=64, episode_timeout_s=60.0))
    trajs = await collector.collect("MathCalculator-v0", range(5), 1, env_kwargs={"split": "test"})
    collector.close()
    assert [t.error for t in trajs] == [None] * 5
    assert [t.num_turns for t in trajs] == [4, 1, 1, 4, 2]
    assert [t.reward for t in trajs] == [1.0, 1.0, 0.0, 0.0, 1.0]
    assert trajs[0].info["tool_errors_by_kind"] == {"parse_error": 1, "unknown_tool": 1}
    assert trajs[3].info["tool_errors_by_kind"] == {"raised": 4} and trajs[3].info["truncated_by"] == "env"
    assert trajs[2].info["turns"][0]["cut_by"] == "max_tokens" and trajs[2].finish_reasons == ["length"]

    m = rollout_metrics(trajs, rollout_s=1.0)
    assert m["reward/mean"] == 0.6
    # Calls: 3 + 0 + 0 + 4 + 1 = 8 over 5 episodes, 3 of which call a tool; errors 2 + 4 = 6.
    assert (m["tools/calls_per_episode"], m["tools/episodes_with_call_frac"]) == (1.6, 0.6)
    assert m["tools/error_rate"] == 0.75
    assert (m["tools/error_rate/parse_error"], m["tools/error_rate/unknown_tool"]) == (0.125, 0.125)
    assert (m["tools/error_rate/raised"], m["tools/error_rate/bad_arguments"]) == (0.5, 0.0)
    assert (m["episode/turns_mean"], m["episode/turns_max"]) == (2.4, 4)  # (4 + 1 + 1 + 4 + 2) / 5
    assert {b: m[f"episode/truncated/{b}"] for b in TRUNCATION_BUDGETS} == {
        "env": 0.2,  # task 3 ran into max_turns
        "max_response_tokens": 0.0,
        "max_model_len": 0.0,
        "max_tokens": 0.2,  # task 2's turn was cut
        "timeout": 0.0,
    }
    # 1 turn: tasks 1 (1.0) and 2 (0.0); 2 turns: task 4; 4 turns: tasks 0 (1.0) and 3 (0.0).
    assert {k: v for k, v in m.items() if k.startswith("reward/by_turns/")} == {
        "reward/by_turns/1": 0.5,
        "reward/by_turns/2": 1.0,
        "reward/by_turns/4": 0.5,
    }


def test_eval_cell_metrics_carry_calls_truncation_and_reward_by_turns():
    from chatgym.trainer.eval.scores import cell_metrics

    def row(task, reward, turns, calls, truncated, failed=0):
        return {
            "task_index": task,
            "reward": reward,
            "success": int(reward == 1.0),
            "turns": turns,
            "generated_tokens": 10,
            "tool_calls": calls,
            "tool_errors": 0,
            "failed": failed,
            "truncated": truncated,
        }

    rows = [row(0, 1.0, 2, 1, 0), row(0, 0.0, 4, 3, 1), row(1, 0.5, 2, 1, 0), row(1, 0.0, 1, 0, 0, failed=1)]
    m = cell_metrics(rows)
    assert m.tool_calls_per_episode == 5 / 4 and m.truncated_frac == 1 / 4
    assert m.reward_by_turns == {1: 0.0, 2: 0.75, 4: 0.0}  # 2 turns: (1.0 + 0.5) / 2


async def test_collector_names_the_budget_that_cut_each_turn(tok):
    from rollout_helpers import OkEnv

    from chatgym.trainer.engines.replay import ReplayEngine
    from chatgym.trainer.rollout.collector import Collector, RolloutConfig

    long_turn = tok.encode("word " * 80, add_special_tokens=False)  # never ends by itself
    engine = ReplayEngine(lambda ids: long_turn, tok)
    # Turn 1 may write min(30, 40) = 30 (per-turn budget), turn 2 min(30, 40 - 30) = 10 (response
    # budget), then nothing is left: the episode ends truncated by max_response_tokens.
    col = Collector(
        engine, tok, RolloutConfig(max_tokens=30, max_response_tokens=40, episode_timeout_s=30.0)
    )
    [t] = await col.collect(OkEnv, [0])
    assert [r["cut_by"] for r in t.info["turns"]] == ["max_tokens", "max_response_tokens"]
    assert t.info["truncated_by"] == "max_response_tokens"
    # A context 20 tokens longer than the prompt: turn 1 is cut by it, and the episode ends there.
    prompt_len = t.prompt_len
    col = Collector(
        engine, tok, RolloutConfig(max_tokens=30, max_model_len=prompt_len + 20, episode_timeout_s=30.0)
    )
    [t] = await col.collect(OkEnv, [0])
    assert [(r["completion_tokens"], r["cut_by"]) for r in t.info["turns"]] == [(20, "max_model_len")]
    assert t.info["truncated_by"] == "max_model_len"
    m = multiturn_metrics([t])
    assert (m["episode/truncated/max_model_len"], m["episode/truncated/max_tokens"]) == (1.0, 0.0)
