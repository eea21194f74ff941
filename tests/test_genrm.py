"""GenRM rewards: an LLM judge scores an env's episodes (chatgym.envs.wrappers.genrm + trainer.genrm).

The env is the real MathCalculator-v0 (test task 0: "Calculate 26 - 28.", answer -2); the judge is a
scripted responder whose verdicts are fixed, so every reward is known by hand:
reward of the last step = env_weight * env step reward + judge_weight * judge score.
"""

from __future__ import annotations

import json

import gymnasium as gym
import pytest

import chatgym  # noqa: F401  (registers env ids)
from chatgym.envs import messages as M
from chatgym.envs.agents import RuleResponder, ScriptedResponder
from chatgym.envs.async_env import async_core
from chatgym.envs.core import load_prompt
from chatgym.envs.wrappers.genrm import GenRMEnv, VerdictParser, check_template

QUESTION, GOLD = "Calculate 26 - 28.", "-2"
CALL = '<tool_call>\n{"name": "calculate", "arguments": {"expression": "26 - 28"}}\n</tool_call>'


def math_env():
    return gym.make("MathCalculator-v0", split="test")


class RecordingJudge:
    """Replies with ``replies`` in order (the last one forever) and records each prompt it is shown."""

    def __init__(self, *replies: str):
        self.inner = ScriptedResponder(list(replies), then=replies[-1])
        self.prompts: list[str] = []

    async def respond(self, messages):
        assert len(messages) == 1 and messages[0]["role"] == "user"
        self.prompts.append(messages[0]["content"])
        return await self.inner.respond(messages)


async def test_scripted_judge_exact_rewards_over_a_tool_episode():
    judge = RecordingJudge("Right, and it used the tool. <score>8</score>")
    env = GenRMEnv(math_env(), judge, env_weight=0.5, judge_weight=2.0)
    obs, info = await env.areset(options={"task_index": 0})
    assert obs[-1] == M.user(QUESTION)

    # Turn 1: a calculator call; the episode goes on, so nothing is judged.
    obs, r1, term, trunc, info = await env.astep(CALL)
    assert (r1, term, trunc) == (0.0, False, False) and "genrm" not in info and judge.prompts == []
    assert obs[0]["content"] == "-2"

    # Turn 2: the right answer. env reward 1.0, judge 8/10 = 0.8 -> 0.5 * 1.0 + 2.0 * 0.8 = 2.1
    obs, r2, term, trunc, info = await env.astep("<answer>-2</answer>")
    assert term and not trunc
    assert r2 == pytest.approx(2.1, abs=1e-12)
    assert info["reward_components"] == {"correct": 1.0, "format": 1.0, "env": 1.0, "genrm": 0.8}
    g = info["genrm"]
    assert (g["score"], g["reward"], g["status"], g["error"], g["attempts"]) == (0.8, 0.8, "ok", None, 1)
    assert g["verdict"] == "Right, and it used the tool. <score>8</score>" and g["judge_s"] >= 0.0
    assert info["success"] is True  # the env's, untouched
    # The judge saw the shipped template filled with the task, the gold answer and the final turn.
    expected = (
        load_prompt("chatgym.envs.wrappers", "genrm_score.txt")
        .replace("{question}", QUESTION)
        .replace("{reference}", GOLD)
        .replace("{response}", "<answer>-2</answer>")
    )
    assert judge.prompts == [expected]
    await env.aclose()


async def test_wrong_answer_and_defaults_env_plus_judge():
    # Defaults: weights 1 and 1. Env reward 0 (wrong), judge 3/10 -> 0.3.
    env = GenRMEnv(math_env(), RuleResponder(lambda m: "<score>3</score>"))
    await env.areset(options={"task_index": 0})
    _, reward, term, _, info = await env.astep("<answer>54</answer>")
    assert term and reward == pytest.approx(0.3, abs=1e-12)
    assert info["reward_components"]["env"] == 0.0 and info["reward_components"]["genrm"] == 0.3
    assert info["success"] is False


async def test_unparseable_verdict_gives_the_configured_reward_after_retries():
    judge = RecordingJudge("I think it is fine.", "Score: 7")  # neither has <score>N</score>
    env = GenRMEnv(math_env(), judge, unparseable_reward=-0.5, judge_retries=1, judge_weight=2.0)
    await env.areset(options={"task_index": 0})
    _, reward, _, _, info = await env.astep("<answer>-2</answer>")
    # 1.0 * 1.0 (env) + 2.0 * -0.5 (unparseable) = 0.0
    assert reward == 0.0
    g = info["genrm"]
    assert (g["score"], g["reward"], g["status"], g["attempts"]) == (None, -0.5, "unparseable", 2)
    assert g["verdict"] == "Score: 7" and "no verdict matching" in g["error"]
    assert len(judge.prompts) == 2 and judge.prompts[0] == judge.prompts[1]


async def test_a_retry_that_parses_counts():
    judge = RecordingJudge("<score>eleven</score>", "<score>11</score>", "<score>4.5</score>")
    env = GenRMEnv(math_env(), judge, judge_retries=2, env_weight=0.0)
    await env.areset(options={"task_index": 0})
    _, reward, _, _, info = await env.astep("<answer>-2</answer>")
    assert reward == pytest.approx(0.45, abs=1e-12) and info["genrm"]["attempts"] == 3


async def test_episode_truncated_by_max_turns_is_judged_with_the_conversation():
    template = "Q: {question}\n---\n{conversation}\n---\nlast: {response}\nref: {reference}"
    judge = RecordingJudge("[[B]]")
    env = GenRMEnv(
        gym.make("MathCalculator-v0", split="test", max_turns=1),
        judge,
        template=template,
        verdict=VerdictParser.named("ab"),
    )
    await env.areset(options={"task_index": 0})
    _, reward, term, trunc, info = await env.astep(CALL)
    assert (term, trunc) == (False, True) and reward == 0.0 and info["genrm"]["score"] == 0.0
    assert judge.prompts == [
        f"Q: {QUESTION}\n---\nUser: {QUESTION}\n\nAssistant: {CALL}\n\nTool (calculate): -2\n---\n"
        f"last: {CALL}\nref: {GOLD}"
    ]


def test_sync_api_runs_on_the_envs_loop():
    env = GenRMEnv(math_env(), RuleResponder(lambda m: "<score>10</score>"))
    env.reset(options={"task_index": 0})
    _, reward, term, _, _ = env.step("<answer>-2</answer>")
    assert term and reward == 2.0
    env.close()


def test_wrapper_is_driven_async_and_keeps_the_env_id():
    env = GenRMEnv(math_env(), RuleResponder(lambda m: "<score>1</score>"))
    assert async_core(env) is env  # the collector awaits the wrapper's own areset/astep
    assert async_core(gym.wrappers.RecordEpisodeStatistics(env)) is None  # a sync wrapper on top
    assert env.spec.id == "MathCalculator-v0" and env.tools == env.unwrapped.tools
    env.close()


@pytest.mark.parametrize(
    "text, fmt, expected",
    [
        ("<score>2</score> on reflection <score>9</score>", "score", 0.9),  # the last match counts
        ("<score> 10 </score>", "score", 1.0),
        ("<score>0</score>", "score", 0.0),
        ("<score>11</score>", "score", None),  # outside 0..10
        ("<score>-1</score>", "score", None),
        ("Rating: [[1]]", "rating", 0.0),  # (1 - 1) / 9
        ("Rating: [[7]]", "rating", 6 / 9),
        ("[[A]]", "ab", 1.0),
        ("first [[A]] then [[B]]", "ab", 0.0),
        ("[[C]]", "ab", None),
        ("no verdict", "ab", None),
    ],
)
def test_verdict_formats(text, fmt, expected):
    score, error = VerdictParser.named(fmt).parse(text)
    if expected is None:
        assert score is None and error
    else:
        assert score == pytest.approx(expected, abs=1e-12) and error is None


def test_custom_regex_with_labels_and_range():
    p = VerdictParser(pattern=r"Verdict:\s*(CORRECT|INCORRECT)", labels={"CORRECT": 1.0, "INCORRECT": 0.25})
    assert p.parse("... Verdict: INCORRECT") == (0.25, None)
    q = VerdictParser(pattern=r"(\d+)/5", score_range=(1, 5))
    assert q.parse("I give it 4/5") == (0.75, None)  # (4 - 1) / (5 - 1)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"pattern": "(unclosed"}, "pattern .* is not a valid regex"),
        ({"pattern": r"\d+"}, "pattern .* needs a capture group"),
        ({"score_range": (5, 5)}, "score_range must be"),
        ({"labels": {"A": 2.0}}, r"labels\['A'\] must be in \[0, 1\]"),
    ],
)
def test_verdict_parser_errors(kwargs, match):
    with pytest.raises(ValueError, match=match):
        VerdictParser(**kwargs)


def test_template_checks():
    check_template(load_prompt("chatgym.envs.wrappers", "genrm_score.txt"))
    with pytest.raises(ValueError, match=r"\{answer\} is not one of"):
        check_template("{question} {answer}")
    with pytest.raises(ValueError, match=r"must contain \{response\} or \{conversation\}"):
        check_template("Judge {question}")
    with pytest.raises(ValueError, match="judge_retries"):
        GenRMEnv(math_env(), RuleResponder(str), judge_retries=-1)
    with pytest.raises(TypeError, match="async respond"):
        GenRMEnv(math_env(), object())  # type: ignore[arg-type]


def test_judge_output_is_json_serialisable_in_info():
    env = GenRMEnv(math_env(), RuleResponder(lambda m: "<score>5</score>"))
    env.reset(options={"task_index": 0})
    *_, info = env.step("<answer>-2</answer>")
    json.dumps(info["genrm"])
    env.close()


# ---- the run config's reward section -----------------------------------------------------------


@pytest.mark.parametrize(
    "override, match",
    [
        ("reward.model=judge", r"^reward\.model: must be one of"),
        ("reward.template=/no/such/template.txt", r"^reward\.template: no such file"),
        ("reward.verdict=stars", r"^reward\.verdict: unknown 'stars'"),
        ("reward.pattern=(unclosed", r"^reward\.pattern .* is not a valid regex"),
        (r"reward.pattern=\d+", r"^reward\.pattern .* needs a capture group"),
        ("reward.score_range=[3,3]", r"^reward\.score_range must be"),
        ("reward.labels={A: 2}", r"^reward\.labels\['A'\] must be in \[0, 1\]"),
        ("reward.judge_retries=-1", r"^reward\.judge_retries must be >= 0"),
        ("reward.judge_backend=nope", r"^reward\.judge_backend: unknown 'nope'"),
        ("reward.max_tokens=0", r"^reward\.max_tokens must be >= 1"),
        ("reward.prefill=5", r"^reward\.prefill: expected a string, got 5"),
        ("reward.prefill=[<score>]", r"^reward\.prefill: expected a string, got \['<score>'\]"),
    ],
)
def test_bad_reward_config_fails_at_load_naming_the_field(override, match):
    from chatgym.trainer.config.run import ConfigError, load_config

    with pytest.raises(ConfigError, match=match):
        load_config(None, [override])


def test_prefill_of_a_wrong_type_or_for_a_chat_judge_fails_at_load():
    from chatgym.trainer.config.reward import RewardConfig
    from chatgym.trainer.config.run import ConfigError, load_config

    with pytest.raises(ConfigError, match=r"^reward\.prefill needs a token engine for the judge"):
        load_config(None, ["reward.judge_backend=openai", "reward.prefill=<score>"])

    with pytest.raises(ValueError, match=r"^reward\.prefill must be a string, got 5$"):
        RewardConfig(model="genrm", prefill=5)


@pytest.mark.parametrize(
    "text, match",
    [
        ("Judge this: {question}", r"must contain \{response\} or \{conversation\}"),
        ("{response} versus {gold}", r"\{gold\} is not one of"),
    ],
)
def test_bad_template_file_fails_at_load(tmp_path, text, match):
    from chatgym.trainer.config.run import ConfigError, load_config

    path = tmp_path / "judge.txt"
    path.write_text(text)
    with pytest.raises(ConfigError, match=rf"^reward\.template: {path}: .*{match}"):
        load_config(None, [f"reward.template={path}"])


def test_reward_section_round_trips_through_config_yaml(tmp_path):
    from chatgym.trainer.config.run import load_config, save_config

    template = tmp_path / "judge.txt"
    template.write_text("Is this right? {response}\nAnswer [[A]] or [[B]].")
    cfg = load_config(
        None,
        ["reward.model=genrm", f"reward.template={template}", "reward.verdict=ab", "reward.judge_weight=0.5"],
    )
    save_config(cfg, tmp_path / "config.yaml")
    assert load_config(tmp_path / "config.yaml") == cfg
    assert cfg.reward.verdict_parser().parse("[[B]]") == (0.0, None)
    assert load_config(None).reward.model == "none"


# ---- through the rollout side: the policy's own engine is the judge ----------------------------


def judged_policy(tok):
    """A scripted engine serving both the policy and the judge: the judge (its prompt is the shipped
    template) says [[A]] iff the final response equals the reference; the policy answers task 0
    right (-2) and task 1 wrong."""
    from chatgym.trainer.engines.replay import ReplayEngine

    def script(prompt_ids):
        text = tok.decode(prompt_ids)
        if "[Reference answer]" in text:
            ref = text.split("[Reference answer]\n")[1].split("\n")[0]
            response = text.split("[Assistant's final response]\n")[1].split("\n")[0]
            reply = "[[A]]" if response == f"<answer>{ref}</answer>" else "[[B]]"
        else:
            reply = "<answer>-2</answer>" if "26 - 28" in text else "<answer>5</answer>"
        return [*tok.encode(reply, add_special_tokens=False), 2]  # 2: <|im_end|>

    return ReplayEngine(script, tok)


@pytest.fixture(scope="module")
def tok():
    try:
        from chatgym.trainer.chat.tokenizer import get_tokenizer

        return get_tokenizer("smollm2")
    except ModuleNotFoundError as exc:
        pytest.skip(str(exc))


async def judged_rollout(cfg, engine, tok):
    """MathCalculator-v0 test tasks 0 and 1, 2 samples each, through LocalRollout with the GenRM hook
    of ``cfg`` on ``engine``."""
    from chatgym.trainer.rewards.genrm import genrm_env_source
    from chatgym.trainer.rollout.collector import Collector, RolloutConfig
    from chatgym.trainer.rollout.source import LocalRollout, RolloutRequest

    hook = genrm_env_source(cfg, engine=engine, tokenizer=tok)
    rollout = LocalRollout(
        engine, Collector(engine, tok, RolloutConfig(episode_timeout_s=60.0)), env_source=hook
    )
    request = RolloutRequest("MathCalculator-v0", tasks=(0, 1), group_size=2, env_kwargs={"split": "test"})
    try:
        return await rollout.collect(request)
    finally:
        rollout.close()


async def test_policy_engine_judges_through_local_rollout(tok):
    from chatgym.trainer.config.run import load_config
    from chatgym.trainer.logging.step_metrics import rollout_metrics

    cfg = load_config(None, ["reward.model=genrm", "reward.verdict=ab", "reward.judge_weight=0.5"])
    engine = judged_policy(tok)
    trajs = await judged_rollout(cfg, engine, tok)
    assert [t.error for t in trajs] == [None] * 4 and [t.env_id for t in trajs] == ["MathCalculator-v0"] * 4
    # Task 0 right: 1.0 + 0.5 * 1 ([[A]]); task 1 wrong: 0.0 + 0.5 * 0 ([[B]]).
    assert [t.reward for t in trajs] == [1.5, 1.5, 0.0, 0.0]
    assert [t.info["reward_components"]["genrm"] for t in trajs] == [1.0, 1.0, 0.0, 0.0]
    assert [t.success for t in trajs] == [True, True, False, False]
    assert len(engine.calls) == 8  # 4 policy turns + 4 verdicts, on the one engine
    # The judge's tokens are not in the policy's trajectory.
    assert all(
        t.response_tokens == len(tok.encode(t.messages[-1]["content"], add_special_tokens=False)) + 1
        for t in trajs
    )
    m = rollout_metrics(trajs, rollout_s=1.0)
    assert (m["genrm/judged_frac"], m["genrm/score_mean"], m["genrm/unparseable_frac"]) == (1.0, 0.5, 0.0)
    assert (m["reward/env_mean"], m["reward/genrm_mean"], m["reward/mean"]) == (0.5, 0.5, 0.75)


async def test_prefilled_judge_on_the_policy_engine_scores_prefill_plus_reply(tok):
    # reward.prefill "<score>": the judge's prompt ends with the ids of "<score>" after the assistant
    # header, the engine samples only "7</score>", and the parser reads "<score>" + "7</score>" = 7/10.
    from chatgym.trainer.chat.delta import ChatRenderer
    from chatgym.trainer.config.run import load_config
    from chatgym.trainer.engines.replay import ReplayEngine

    def script(prompt_ids):
        text = tok.decode(prompt_ids)
        if "[Reference answer]" in text:
            reply = "7</score>"
        else:
            reply = "<answer>-2</answer>" if "26 - 28" in text else "<answer>5</answer>"
        return [*tok.encode(reply, add_special_tokens=False), 2]  # 2: <|im_end|>

    cfg = load_config(
        None,
        [
            "reward.model=genrm",
            "reward.verdict=score",
            "reward.prefill=<score>",
            "reward.env_weight=2.0",
            "reward.judge_weight=0.5",
        ],
    )
    assert cfg.reward.prefill == "<score>"
    engine = ReplayEngine(script, tok)
    trajs = await judged_rollout(cfg, engine, tok)
    assert [t.error for t in trajs] == [None] * 4
    for t in trajs:
        g = t.info["genrm"]
        assert (g["verdict"], g["score"], g["reward"], g["status"]) == ("<score>7</score>", 0.7, 0.7, "ok")
    # Task 0 right (env 1.0), task 1 wrong (env 0.0): 2.0 * env + 0.5 * 0.7.
    assert [t.reward for t in trajs] == [2.0 * 1.0 + 0.5 * 0.7] * 2 + [2.0 * 0.0 + 0.5 * 0.7] * 2
    assert [t.reward for t in trajs] == pytest.approx([2.35, 2.35, 0.35, 0.35], abs=1e-12)

    # The judge's prompts: the shipped template rendered as one user turn, then the prefill's ids.
    prefill_ids = tok.encode("<score>", add_special_tokens=False)
    judge_calls = [ids for ids, _ in engine.calls if "[Reference answer]" in tok.decode(ids)]
    assert len(engine.calls) == 8 and len(judge_calls) == 4  # 4 policy turns + 4 verdicts
    header_ids = tok.encode("<|im_start|>assistant\n", add_special_tokens=False)
    for ids in judge_calls:
        assert ids[-len(prefill_ids) :] == prefill_ids
        assert ids[-len(prefill_ids) - len(header_ids) : -len(prefill_ids)] == header_ids
    # Task 0's judge prompt exactly: the template filled with its question, gold answer and response.
    prompt = (
        load_prompt("chatgym.envs.wrappers", "genrm_score.txt")
        .replace("{question}", QUESTION)
        .replace("{reference}", GOLD)
        .replace("{response}", "<answer>-2</answer>")
    )
    # (rendered by the plain ChatRenderer, the same as a responder without prefill renders it)
    header = ChatRenderer(tok).prompt_ids([M.user(prompt)])
    task0 = [ids for ids in judge_calls if QUESTION in tok.decode(ids)]
    assert task0 == [[*header, *prefill_ids]] * 2
    # The judge's tokens (prefill included) are not in the policy's trajectory.
    for t in trajs:
        assert t.response_tokens == len(tok.encode(t.messages[-1]["content"], add_special_tokens=False)) + 1
        policy_text = tok.decode(t.token_ids)
        assert "<score>" not in policy_text and "[Reference answer]" not in policy_text


# ---- one real-model run (slow): SmolLM2 judges its own Math-v0 answers through the hf engine ------


@pytest.mark.slow
async def test_real_model_judges_its_own_episodes(tok, tmp_path):
    import time

    from chatgym.trainer.config.run import load_config
    from chatgym.trainer.engines.hf import TransformersEngine
    from chatgym.trainer.logging.step_metrics import rollout_metrics
    from chatgym.trainer.models.packaged import load_model
    from chatgym.trainer.rewards.genrm import genrm_env_source
    from chatgym.trainer.rollout.collector import Collector, RolloutConfig
    from chatgym.trainer.rollout.source import LocalRollout, RolloutRequest

    model = load_model("smollm2", dtype="float32")
    engine = TransformersEngine(model, tok, max_batch_size=16)
    cfg = load_config(
        None,
        [
            "reward.model=genrm",
            "reward.max_tokens=48",
            "reward.judge_weight=0.5",
            "reward.unparseable_reward=0.1",
        ],
    )
    col_cfg = RolloutConfig(temperature=0.0, max_tokens=32, max_response_tokens=32, episode_timeout_s=3000)
    request = RolloutRequest("Math-v0", tasks=(0, 1), group_size=2, env_kwargs={"split": "test"})
    plain = LocalRollout(engine, Collector(engine, tok, col_cfg))
    judged = LocalRollout(
        engine,
        Collector(engine, tok, col_cfg),
        env_source=genrm_env_source(cfg, engine=engine, tokenizer=tok),
    )
    try:
        t0 = time.perf_counter()
        base = await plain.collect(request)
        plain_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        trajs = await judged.collect(request)
        judged_s = time.perf_counter() - t0
    finally:
        await engine.close()
        plain.close()
        judged.close()
    assert [t.error for t in trajs] == [None] * 4 and [t.error for t in base] == [None] * 4
    parser = cfg.reward.verdict_parser()
    for t in trajs:
        g, parts = t.info["genrm"], t.info["reward_components"]
        assert t.reward == 1.0 * parts["env"] + 0.5 * parts["genrm"]
        assert g["score"] == parser.parse(g["verdict"])[0]
        assert parts["genrm"] == (0.1 if g["score"] is None else g["score"])
    # Greedy policy and judge: the two samples of a group are one episode and one verdict.
    for a, b in zip(trajs[::2], trajs[1::2], strict=True):
        assert a.token_ids == b.token_ids and a.info["genrm"]["verdict"] == b.info["genrm"]["verdict"]

    m = rollout_metrics(trajs, rollout_s=judged_s)
    figures = {
        "plain_rollout_s": plain_s,
        "judged_rollout_s": judged_s,
        "judge_s_sum": sum(t.info["genrm"]["judge_s"] for t in trajs),
        **{k: v for k, v in m.items() if k.startswith(("genrm/", "reward/"))},
        "verdicts": [t.info["genrm"]["verdict"] for t in trajs[::2]],
        "answers": [t.messages[-1]["content"] for t in trajs[::2]],
    }
    print(json.dumps(figures, indent=1))

    # Independently: transformers' own greedy generate on the judge prompt gives the same verdict.
    t = trajs[0]
    prompt = (
        load_prompt("chatgym.envs.wrappers", "genrm_score.txt")
        .replace("{question}", t.messages[1]["content"])
        .replace("{reference}", str(gym.make("Math-v0", split="test").unwrapped.tasks[0]["answer"]))
        .replace("{response}", t.messages[-1]["content"])
    )
    import torch

    ids = tok.apply_chat_template(
        [{"role": "user", "content": prompt}], tokenize=True, add_generation_prompt=True, return_dict=False
    )
    with torch.no_grad():
        out = model.generate(torch.tensor([ids]), max_new_tokens=48, do_sample=False, eos_token_id=2)
    assert tok.decode(out[0, len(ids) :], skip_special_tokens=True).strip() == t.info["genrm"]["verdict"]


async def test_a_separate_judge_model_gets_its_own_engine(tok, tmp_path):
    # A tiny random Llama saved with SmolLM2's tokenizer: a real model directory the hf engine loads
    # in a second; its verdicts are noise, so only their handling is checked.
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from chatgym.trainer.config.run import load_config
    from chatgym.trainer.engines.hf import TransformersEngine
    from chatgym.trainer.rewards.genrm import genrm_env_source
    from chatgym.trainer.rollout.collector import Collector, RolloutConfig
    from chatgym.trainer.rollout.source import LocalRollout, RolloutRequest

    torch.manual_seed(0)
    small = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=2,
        eos_token_id=2,
    )
    LlamaForCausalLM(small).save_pretrained(tmp_path / "judge")
    tok.save_pretrained(tmp_path / "judge")
    cfg = load_config(
        None,
        [
            "reward.model=genrm",
            f"reward.judge={tmp_path / 'judge'}",
            "reward.judge_backend=hf",
            "reward.max_tokens=8",
            "reward.unparseable_reward=0.25",
            "reward.prefill=<score>",
            "engine.dtype=float32",
        ],
    )
    policy = judged_policy(tok)
    hook = genrm_env_source(cfg, engine=policy, tokenizer=tok)
    genrm = hook.genrm
    judge = genrm.owned_engine
    assert isinstance(judge, TransformersEngine) and genrm.responder.engine is judge
    # The separate judge's prompts end with the prefill's ids; its verdict text starts with the prefill.
    assert genrm.responder.prefill == "<score>"
    assert genrm.responder.renderer.ids == tok.encode("<score>", add_special_tokens=False)
    rollout = LocalRollout(
        policy, Collector(policy, tok, RolloutConfig(episode_timeout_s=120.0)), env_source=hook
    )
    try:
        [traj] = await rollout.collect(
            RolloutRequest("MathCalculator-v0", tasks=(0,), env_kwargs={"split": "test"})
        )
    finally:
        await rollout.aclose()
    # Regression: LocalRollout's close left the separate judge's engine (and its worker thread) running.
    assert genrm.owned_engine is None and judge._worker is None
    assert traj.error is None and len(policy.calls) == 1  # the policy's engine served the policy only
    g = traj.info["genrm"]
    assert g["score"] == cfg.reward.verdict_parser().parse(g["verdict"])[0]
    assert traj.reward == 1.0 + (0.25 if g["score"] is None else g["score"])
    assert g["verdict"].startswith("<score>")


@pytest.mark.slow
def test_training_run_with_genrm_logs_the_judges_figures(tmp_path):
    # chatgym train's own path (Trainer -> roles.build_local_rollout -> LocalRollout's env hook) on a
    # tiny random policy that also judges: its verdicts are noise, so each episode gets the
    # unparseable reward 0.5, weighted 2.0, on top of the env's letter share.
    from train_helpers import LETTERS_ENV_ID, TINY_LLAMA, register

    from chatgym.trainer.config.run import load_config
    from chatgym.trainer.rollout.trace import read_trace
    from chatgym.trainer.train import Trainer

    register()
    cfg = load_config(
        None,
        [
            "model.random_init=true",
            "model.config_overrides=" + json.dumps(TINY_LLAMA),
            "engine.backend=hf",
            "engine.dtype=float32",
            f"env.id={LETTERS_ENV_ID}",
            "env.eval_tasks=2",
            "rollout.max_tokens=8",
            "rollout.max_response_tokens=8",
            "rollout.max_model_len=512",
            "train.max_steps=1",
            "train.prompts_per_step=2",
            "train.group_size=2",
            "train.trace_fraction=1.0",
            "train.progress=false",
            f"train.output_dir={tmp_path}",
            "reward.model=genrm",
            "reward.max_tokens=4",
            "reward.unparseable_reward=0.5",
            "reward.judge_weight=2.0",
            "reward.pattern=<score>(\\d+)</score>",
        ],
    )
    trainer = Trainer(cfg)
    try:
        trainer.train()
    finally:
        trainer.close()
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1, 1]  # eval before, one step, eval after
    step = rows[1]
    assert step["batch/failed"] == 0 and step["genrm/judged_frac"] == 1.0
    assert step["reward/mean"] == pytest.approx(step["reward/env_mean"] + 2.0 * step["reward/genrm_mean"])
    assert (step["tools/calls_per_episode"], step["episode/turns_mean"], step["reward/by_turns/1"]) == (
        0.0,
        1.0,
        step["reward/mean"],
    )
    for row in (rows[0], rows[2]):
        assert row["eval/genrm/judged_frac"] == 1.0 and row["eval/episode/turns_mean"] == 1.0
    for rec in read_trace(tmp_path / "traces.jsonl"):
        parts, g = rec["info"]["reward_components"], rec["info"]["genrm"]
        assert parts["genrm"] == (0.5 if g["score"] is None else g["score"])
        assert rec["reward"] == pytest.approx(parts["letters"] + 2.0 * parts["genrm"], abs=1e-12)
