"""``trainer.rollout_source: gateway``: a rollout request run by agent programs through the real gateway
server and the real ``openai`` client gives the collector's trajectories (order, groups, rewards,
token ids) on the same scripted replies; crashes fail one trajectory; segments join their group."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from rollout_helpers import ASSISTANT_HEADER, TASKS, AddEnv, tool_call_text

from chatgym.trainer.config.gateway import GatewayConfig
from chatgym.trainer.config.run import ConfigError, load_config
from chatgym.trainer.engines.replay import ReplayEngine, turn_script
from chatgym.trainer.gateway import Gateway
from chatgym.trainer.rollout.collector import Collector, RolloutConfig
from chatgym.trainer.rollout.source import LocalRollout, RolloutRequest

openai = pytest.importorskip("openai")
ROOT = Path(__file__).resolve().parent.parent
IM_END = 2
REPLIES = [tool_call_text("add", a=2, b=3), tool_call_text("add", a=5, b=4), "The answer is 9"]


@pytest.fixture(scope="module")
def tok():
    try:
        from chatgym.trainer.chat.tokenizer import get_tokenizer

        return get_tokenizer("smollm2")
    except ModuleNotFoundError as exc:
        pytest.skip(str(exc))


def enc(tok, text):
    return tok.encode(text, add_special_tokens=False)


class SeedRecorder(ReplayEngine):
    """Replays the script; records each call's (prompt length, seed)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.seeds: list[int | None] = []

    async def generate(self, prompt_ids, params):
        self.seeds.append(params.seed)
        return await super().generate(prompt_ids, params)

    def update_weights(self, weights):
        list(weights)


def engine_for(tok, replies=REPLIES):
    turns = [[*enc(tok, t), IM_END] for t in replies]
    return SeedRecorder(turn_script(turns, enc(tok, ASSISTANT_HEADER)), tok)


def add(a, b):
    return str(a + b)


# ---- agent programs (module-level: loaded by "tests/test_gateway_source.py:<name>") --------------


def env_agent(base_url, api_key, task):
    """Plays AddEnv's own loop over the OpenAI API: the env's messages and tools, the add tool run here."""
    client = openai.OpenAI(base_url=base_url, api_key=api_key, max_retries=0)
    messages = list(task["messages"])
    for _ in range(8):
        message = client.chat.completions.create(model="m", messages=messages, tools=task["tools"]).choices[0].message
        messages.append(message.model_dump(exclude_none=True))
        if not message.tool_calls:
            return float(task["group_id"] * 10 + task["sample_index"])
        for call in message.tool_calls:
            messages.append({"role": "tool", "tool_call_id": call.id, "content": add(**json.loads(call.function.arguments))})
    return None


def crashing_agent(base_url, api_key, task):
    if (task["group_id"], task["sample_index"]) == (1, 0):
        openai.OpenAI(base_url=base_url, api_key=api_key, max_retries=0).chat.completions.create(
            model="m", messages=task["messages"]
        )
        raise RuntimeError("agent bug")
    return env_agent(base_url, api_key, task)


def rewriting_agent(base_url, api_key, task):
    """Two requests; the second drops the first exchange (a summarising agent): two segments."""
    client = openai.OpenAI(base_url=base_url, api_key=api_key, max_retries=0)
    client.chat.completions.create(model="m", messages=task["messages"])
    client.chat.completions.create(model="m", messages=[{"role": "user", "content": "again: " + task["prompt"]}])
    return 0.5 + task["sample_index"]


def collector_trajs(tok, request):
    engine = engine_for(tok)
    source = LocalRollout(engine, Collector(engine, tok, RolloutConfig(episode_timeout_s=30.0, seed=5)))
    return source, engine


def gateway_source(tok, agent, reward="program", segments="all", **rollout):
    from chatgym.trainer.gateway.source import GatewayRollout, gateway_collector

    engine = engine_for(tok)
    cfg = GatewayConfig(agent=f"tests/test_gateway_source.py:{agent}", reward=reward, concurrency=4, segments=segments)
    rollout = RolloutConfig(episode_timeout_s=30.0, seed=5, **rollout)
    return GatewayRollout(engine, gateway_collector(engine, tok, rollout, cfg, env_id="add")), engine


REQUEST = RolloutRequest("add", tasks=(0, 1), group_size=2, reset_seed=3, sampling_seed=11)


@pytest.fixture
def in_root(monkeypatch):
    monkeypatch.chdir(ROOT)
    monkeypatch.syspath_prepend(str(ROOT / "tests"))


async def run(source, request, env=AddEnv):
    try:
        collector = source.collector
        return await collector.collect(
            env, list(request.tasks), request.group_size, seed=request.reset_seed,
            sampling_seed=request.sampling_seed,
        )
    finally:
        await source.aclose()


async def test_gateway_trajectories_equal_the_collectors(tok, in_root):
    ref_source, ref_engine = collector_trajs(tok, REQUEST)
    expected = await run(ref_source, REQUEST)
    source, engine = gateway_source(tok, "env_agent")
    got = await run(source, REQUEST)
    assert [(t.group_id, t.sample_index) for t in got] == [(0, 0), (0, 1), (1, 0), (1, 1)]
    assert [t.error for t in got] == [None] * 4
    # The program's reward: 10 * group + sample (env_agent returns it).
    assert [t.reward for t in got] == [0.0, 1.0, 10.0, 11.0]
    assert [t.rewards for t in got] == [[0.0, 0.0, r] for r in (0.0, 1.0, 10.0, 11.0)]
    for a, b in zip(got, expected, strict=True):
        assert a.token_ids == b.token_ids
        assert a.loss_mask == b.loss_mask
        assert a.engine_logprobs == b.engine_logprobs
        assert a.prompt_len == b.prompt_len
        assert a.finish_reasons == b.finish_reasons == ["stop", "stop", "stop"]
        assert a.task_id == b.task_id == TASKS[a.group_id]["task_id"]
        assert a.info["segments"] == 1 and a.info["reward_source"] == "program"
    # The same sampling seeds, request by request (group, sample, turn), as the collector's.
    assert sorted(engine.seeds) == sorted(ref_engine.seeds)
    assert len(set(engine.seeds)) == 12


async def test_a_runs_gateway_takes_the_rollout_budgets_and_refuses_a_bad_observation_budget(tok, in_root):
    # Regression: the gateway rendered without rollout.chat_template_kwargs and with the engine's EOS
    # ids whatever rollout.eos_token_ids said, so its trajectories could differ from the collector's.
    source, engine = gateway_source(tok, "env_agent", max_model_len=2048, max_observation_tokens=7,
                                    chat_template_kwargs={"enable_thinking": False}, eos_token_ids=(2, 7))
    try:
        gateway = source.collector.gateway
        r = gateway.rendering
        assert (r.max_model_len, r.max_response_tokens, r.max_observation_tokens) == (2048, 2048, 7)
        assert r.renderer.template_kwargs == {"enable_thinking": False}
        assert gateway.eos_token_ids == (2, 7)
    finally:
        await source.aclose()
    with pytest.raises(ValueError, match=r"^max_observation_tokens must be an int >= 1, got 0$"):
        Gateway(engine, tok, max_observation_tokens=0)


async def test_reward_env_scores_the_last_reply_with_the_envs_scorer(tok, in_root):
    source, _ = gateway_source(tok, "env_agent", reward="env")
    got = await run(source, REQUEST)
    # "The answer is 9": right for task 0 (2 + 3 + 4), wrong for task 1 (60) — AddEnv's own scorer.
    assert [t.reward for t in got] == [1.0, 1.0, 0.0, 0.0]
    assert [t.info["program_reward"] for t in got] == [0.0, 1.0, 10.0, 11.0]


async def test_a_crashing_agent_fails_its_trajectory_only(tok, in_root):
    source, _ = gateway_source(tok, "crashing_agent")
    got = await run(source, REQUEST)
    assert [(t.group_id, t.sample_index) for t in got] == [(0, 0), (0, 1), (1, 0), (1, 1)]
    assert [t.info.get("error_kind") for t in got] == [None, None, "agent_error", None]
    assert got[2].error == "agent_error: RuntimeError: agent bug"
    assert got[2].num_turns == 1  # what its session recorded before the crash
    assert [t.reward for t in got if not t.failed] == [0.0, 1.0, 11.0]


@pytest.mark.parametrize("segments", ["all", "last"])
async def test_segments_carry_their_sessions_reward_and_group(tok, in_root, segments):
    source, _ = gateway_source(tok, "rewriting_agent", segments=segments)
    got = await run(source, RolloutRequest("add", tasks=(0,), group_size=2, reset_seed=3, sampling_seed=1))
    keys = [(t.group_id, t.sample_index, t.info["segment"]) for t in got]
    if segments == "all":
        assert keys == [(0, 0, 0), (0, 0, 1), (0, 1, 0), (0, 1, 1)]
        assert [t.reward for t in got] == [0.5, 0.5, 1.5, 1.5]
    else:
        assert keys == [(0, 0, 1), (0, 1, 1)]
        assert [t.reward for t in got] == [0.5, 1.5]
    assert all(t.info["segments"] == 2 and t.error is None for t in got)


async def test_a_command_program_reports_its_reward_on_its_last_stdout_line(tok, in_root, tmp_path):
    from chatgym.trainer.gateway.source import GatewayRollout, gateway_collector

    script = tmp_path / "agent.py"
    script.write_text(
        "import json, os, openai\n"
        "task = json.load(__import__('sys').stdin)\n"
        "c = openai.OpenAI(base_url=os.environ['OPENAI_BASE_URL'], api_key=os.environ['OPENAI_API_KEY'], max_retries=0)\n"
        "c.chat.completions.create(model='m', messages=task['messages'])\n"
        "if task['sample_index'] == 1: raise SystemExit(3)\n"
        "print('log line'); print(0.25 + task['group_id'])\n"
    )
    engine = engine_for(tok, ["The answer is 9"])
    cfg = GatewayConfig(command=(sys.executable, str(script)))
    source = GatewayRollout(engine, gateway_collector(engine, tok, RolloutConfig(episode_timeout_s=60.0), cfg))
    got = await run(source, REQUEST)
    assert [t.reward for t in got if not t.failed] == [0.25, 1.25]
    assert [t.info.get("error_kind") for t in got] == [None, "agent_error", None, "agent_error"]
    assert "exited with status 3" in got[1].error


def test_bad_gateway_config_values_fail_at_load_with_the_field_name():
    with pytest.raises(ConfigError, match=r"^trainer\.rollout_source: must be one of"):
        load_config(None, ["trainer.rollout_source=gatway"])
    with pytest.raises(ConfigError, match=r"^trainer\.gateway\.agent: rollout_source gateway needs"):
        load_config(None, ["trainer.rollout_source=gateway"])
    with pytest.raises(ConfigError, match=r"^trainer\.gateway\.agent: no such file 'nope/agent\.py'"):
        load_config(None, ["trainer.gateway.agent=nope/agent.py:run"])
    with pytest.raises(ConfigError, match=r"^trainer\.gateway\.reward: must be one of \['program', 'env'\]"):
        load_config(None, ["trainer.gateway.reward=judge"])
    with pytest.raises(ConfigError, match=r"^trainer\.gateway\.concurrency must be an int >= 1, got 0"):
        load_config(None, ["trainer.gateway.concurrency=0"])
    ray = ["trainer.rollout_source=gateway", "trainer.backend=ray", "trainer.gateway.agent=examples/gateway_agent/agent.py:run"]
    # A Ray rollout worker returns all of an episode's segments (tests/test_ray_rollout.py).
    assert load_config(None, ray).trainer.gateway.segments == "all"
    cfg = load_config(ROOT / "examples/configs/gateway_math.yaml")
    assert (cfg.trainer.rollout_source, cfg.trainer.gateway.reward) == ("gateway", "env")


async def test_the_example_agent_runs_an_episode_on_math_v0(tok, in_root):
    """examples/gateway_agent/agent.py, unchanged, on a Math-v0 task: a calculator call, then the answer,
    scored by Math-v0's own scorer (reward: env)."""
    from chatgym.trainer.gateway.source import GatewayRollout, gateway_collector

    call = tool_call_text("calculator", expression="17 + 25")
    engine = engine_for(tok, [call, "<answer>42</answer>"])
    cfg = GatewayConfig(agent="examples/gateway_agent/agent.py:run", reward="env")
    source = GatewayRollout(engine, gateway_collector(engine, tok, RolloutConfig(episode_timeout_s=60.0), cfg))
    row = {"task_id": "t", "question": "What is 17 + 25?", "answer": "42",
           "metadata": {"source_dataset": "basic_arithmetic"}}
    try:
        [traj] = await source.collector.collect("Math-v0", [row], 1)
    finally:
        await source.aclose()
    assert traj.error is None and traj.reward == 1.0 and traj.success is True
    assert traj.finish_reasons == ["stop", "stop"]
    tool_msg = [m for m in traj.messages if m["role"] == "tool"]
    assert [m["content"] for m in tool_msg] == ["42"]  # the agent's own calculator ran
    assert traj.messages[0]["content"].startswith("You solve arithmetic problems")
