"""Co-training (trainer/cotrain/loop.py, trainer/cotrain/party.py): the policy and its judge / simulated user as two learners.

Scripted parties (ReplayEngine) for both sides; every reward below is derived by hand in a comment.
The learners are tiny random-init Llamas (train_helpers.TINY_LLAMA), so a step runs in seconds.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import torch
from rollout_helpers import ASSISTANT_HEADER, tool_call_text
from train_helpers import TINY_LLAMA

from chatgym.envs.messages import assistant, system, user
from chatgym.trainer.config.cotrain import CoTrainConfig, load_cotrain_config
from chatgym.trainer.cotrain.calibration import calibration_answer, calibration_order
from chatgym.trainer.cotrain.loop import CoTrainer
from chatgym.trainer.cotrain.party import (
    VersionedResponder,
    best_constant_agreement,
    facts,
    faithfulness,
    judge_agreement,
    judge_constant_baseline,
    party_trajectories,
    trace_trajectory,
    user_checks,
)
from chatgym.trainer.engines.replay import ReplayEngine, count_subsequence, replay_logprob, turn_script
from chatgym.trainer.rollout.collector import Collector, RolloutConfig
from chatgym.trainer.rollout.source import LocalRollout, RolloutRequest

IM_END = 2  # SmolLM2's <|im_end|>


@pytest.fixture(scope="module")
def tok():
    try:
        from chatgym.trainer.chat.tokenizer import get_tokenizer

        return get_tokenizer("smollm2")
    except ModuleNotFoundError as exc:
        pytest.skip(str(exc))


def needs_smollm2():
    """Skip the test where the packaged SmolLM2 (the party's tokenizer and chat template) is missing."""
    try:
        from chatgym.trainer.models.packaged import load_model_path

        load_model_path("smollm2")
    except ModuleNotFoundError as exc:
        pytest.skip(str(exc))


def enc(tok, text):
    return tok.encode(text, add_special_tokens=False)


class WeightSink(ReplayEngine):
    """A fake engine: a ReplayEngine (scripted replies) that accepts weight updates and records the
    names it got, standing in for a real engine whose sampling the test must script."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.loaded: list[list[str]] = []

    def update_weights(self, weights):
        self.loaded.append([name for name, _ in weights])


# ---- the party's trajectory -----------------------------------------------------------------------


def test_trace_trajectory_is_token_exact():
    trace = {
        "prompt_ids": [5, 6, 7],
        "token_ids": [8, 9, IM_END],
        "logprobs": [-0.1, -0.2, -0.3],
        "finish_reason": "stop",
        "stop_reason": IM_END,
        "text": "ok",
        "messages": [user("rate")],
        "weight_version": 4,
    }
    t = trace_trajectory(trace, 0.25, env_id="Judge-v0", task_id="q", group_id=3, sample_index=1)
    assert t.token_ids == [5, 6, 7, 8, 9, IM_END]
    assert t.loss_mask == [0, 0, 0, 1, 1, 1]
    assert t.engine_logprobs == [0.0, 0.0, 0.0, -0.1, -0.2, -0.3]
    assert t.weight_versions == [-1, -1, -1, 4, 4, 4]
    assert (t.prompt_len, t.rewards, t.reward, t.group_id, t.sample_index) == (3, [0.25], 0.25, 3, 1)
    assert t.finish_reasons == ["stop"] and t.terminated and not t.truncated
    assert t.messages[-1] == assistant("ok")
    with pytest.raises(ValueError, match="3 sampled ids and 0 logprobs"):
        trace_trajectory({**trace, "logprobs": []}, 0.0, env_id="x", task_id="q", group_id=0, sample_index=0)


async def test_prefill_is_prompt_and_starts_the_reply(tok):
    from chatgym.envs.agents import ask
    from chatgym.envs.judge.env import parse_rating

    engine = ReplayEngine(lambda prompt: [*enc(tok, "7]] fine"), IM_END], tok)
    engine.weight_version = 3
    responder = VersionedResponder(engine, tok, prefill="Rating: [[")
    view = [user("Rate: 2+2=4")]
    message, trace = await ask(responder, view)
    assert message == assistant("Rating: [[7]] fine") and parse_rating(message["content"]) == (7.0, None)
    # The prefill ids follow the generation prompt (template rendered independently) as prompt ids.
    header = tok.apply_chat_template(view, add_generation_prompt=True, tokenize=True, return_dict=False)
    assert engine.calls[0][0] == trace["prompt_ids"] == [*header, *enc(tok, "Rating: [[")]
    assert trace["token_ids"] == [*enc(tok, "7]] fine"), IM_END] and trace["weight_version"] == 3
    t = trace_trajectory(trace, 1.0, env_id="Judge-v0", task_id="q", group_id=0, sample_index=0)
    assert t.loss_mask == [0] * len(trace["prompt_ids"]) + [1] * len(trace["token_ids"])
    assert t.messages[-1] == assistant("Rating: [[7]] fine")


async def test_judge_agreement_against_the_reference_rating():
    from chatgym.envs.judge.env import JudgeEnv

    env = JudgeEnv(split="reference")
    await env.areset(options={"task_index": 3})  # mtbench/104: reference "David has only one brother."
    right = [user(env.judge_prompt("David has only one brother."))]  # F1 1 -> reference rating 10
    wrong = [user(env.judge_prompt("zzzq"))]  # F1 0 -> reference rating 1
    traces = [
        {"messages": right, "rating": 10.0},  # 1 - 0/9 = 1
        {"messages": right, "rating": 7.0},  # 1 - 3/9 = 2/3
        {"messages": wrong, "rating": 4.0},  # 1 - 3/9 = 2/3
        {"messages": wrong, "rating": None},  # no valid rating: 0
        {"messages": [user("Rate this answer: 42 [[5]]")], "rating": 5.0},  # no reference: unscored
    ]
    assert await judge_agreement(traces) == pytest.approx([1.0, 2 / 3, 2 / 3, 0.0, None])
    env.close()


def test_best_constant_agreement_is_the_median_rating():
    # refs 2, 2, 9: c=2 -> (1 + 1 + 2/9) / 3 = 20/27; c=3 -> (8/9 + 8/9 + 3/9) / 3 = 19/27; c=1 -> 18/27.
    assert best_constant_agreement([2.0, 2.0, 9.0]) == (pytest.approx(20 / 27), 2.0)
    # refs 1, 10: every c gives (1 - (c-1)/9 + 1 - (10-c)/9) / 2 = 1/2; the lowest c wins the tie.
    assert best_constant_agreement([1.0, 10.0]) == (pytest.approx(0.5), 1.0)
    with pytest.raises(ValueError, match="at least one reference rating"):
        best_constant_agreement([])


def test_best_constant_agreement_breaks_ties_on_the_lowest_rating_in_any_order():
    # Ten references 10 and ten at most 4: every c in 4..10 is 100 - 50 = 50 rating points away in all,
    # agreement 1 - 50 / 9 / 20 = 0.6; the lowest is 4. In this order the float means had picked 8.
    refs = [10.0, 10.0, 10.0, 4.0, 2.0, 10.0, 3.0, 3.0, 10.0, 2.0, 2.0, 3.0, 10.0, 3.0, 10.0, 2.0, 10.0, 10.0, 10.0, 4.0]
    assert best_constant_agreement(refs) == (pytest.approx(0.6), 4.0)
    assert best_constant_agreement(sorted(refs)) == (pytest.approx(0.6), 4.0)


async def test_judge_constant_baseline_over_the_samples_with_a_reference():
    from chatgym.envs.judge.env import JudgeEnv
    from chatgym.trainer.rollout.types import Trajectory

    env = JudgeEnv(split="reference")
    await env.areset(options={"task_index": 3})
    right = [user(env.judge_prompt("David has only one brother."))]  # reference rating 10
    wrong = [user(env.judge_prompt("zzzq"))]  # reference rating 1
    env.close()
    ok = Trajectory(env_id="Judge-v0", task_id="a", info={"judge_traces": [
        {"messages": right, "rating": 10.0},  # agreement 1
        {"messages": wrong, "rating": 10.0},  # 0
        {"messages": [user("Rate this answer: 42 [[5]]")], "rating": 5.0},  # no reference: left out
    ]})
    unparsed = Trajectory(env_id="Judge-v0", task_id="b", info={"judge_traces": [{"messages": wrong, "rating": None}]})
    failed = Trajectory(env_id="Judge-v0", task_id="c", error="timeout", info={"judge_traces": [{"messages": right, "rating": 1.0}]})
    got = await judge_constant_baseline([ok, unparsed, failed])
    # refs 10, 1, 1 -> best constant 1: (0 + 1 + 1) / 3 = 2/3; the judge's mean agreement (1 + 0 + 0) / 3 = 1/3.
    assert got == {
        "judge/rating_distinct": 1.0,
        "judge/best_constant_agreement": pytest.approx(2 / 3),
        "judge/best_constant_rating": 1.0,
        "judge/agreement_over_constant": pytest.approx(1 / 3 - 2 / 3),
    }
    assert await judge_constant_baseline([failed]) == {}


async def test_judge_constant_baseline_on_the_arithmetic_rubric_scores_as_the_reward():
    from chatgym.trainer.rollout.types import Trajectory

    # rating_top 9: the judge's [[10]] agrees 0 (as judge_agreement rewards it), its 9 on a right answer
    # 8/9, its 1 on a wrong one 1: (0 + 8/9 + 1) / 3 = 17/27. Refs 10, 10, 1: constant 9 ->
    # (8/9 + 8/9 + 1/9) / 3 = 17/27 beats constant 1 -> (0 + 0 + 1) / 3 (10, over 1..10, would give 18/27).
    traces = [{"rating": 10.0, "reference_rating": 10.0, "rating_top": 9},
              {"rating": 9.0, "reference_rating": 10.0, "rating_top": 9},
              {"rating": 1.0, "reference_rating": 1.0, "rating_top": 9}]
    got = await judge_constant_baseline([Trajectory(env_id="Judge-v0", task_id="a", info={"judge_traces": traces})])
    assert got == {
        "judge/rating_distinct": 3.0,
        "judge/best_constant_agreement": pytest.approx(17 / 27),
        "judge/best_constant_rating": 9.0,
        "judge/agreement_over_constant": pytest.approx(0.0),
    }
    assert best_constant_agreement([10.0, 10.0, 1.0], top=9) == (pytest.approx(17 / 27), 9.0)
    assert best_constant_agreement([10.0, 10.0, 1.0]) == (pytest.approx(18 / 27), 10.0)


# ---- Judge-v0: both sides of a scripted step, then the update of both learners ---------------------

ANSWERS = {
    # kind -> (turn-1 answer, turn-2 answer). "ref" answers MT-bench's references word for word.
    "ref": (
        "David has only one brother.",
        "If each of David's sisters has two brothers, then David would have two brothers.",
    ),
    "bad": ("zzzq", "zzzq"),
}


# A tiny random policy on Judge-v0's reference split, one question of two samples a step, on the CPU.
JUDGE_OVERRIDES = [
    "model.random_init=true",
    "model.config_overrides=" + json.dumps(TINY_LLAMA),
    "model.device=cpu",
    "engine.backend=hf",
    "engine.dtype=float32",
    "env.id=Judge-v0",
    "env.train_split=reference",
    "env.eval_split=reference",
    "env.eval_tasks=0",
    "rollout.max_tokens=64",
    "rollout.max_response_tokens=128",
    "rollout.max_model_len=2048",
    "train.prompts_per_step=1",
    "train.group_size=2",
    "train.progress=false",
    "train.tensorboard=false",
]


def judge_fixture_trainer(tmp_path, tok, calibration=(), stop=(), judge_tail=""):
    """A CoTrainer on Judge-v0 task mtbench/104 (2 samples), tiny random policy and judge learners,
    scripted engines: the policy answers the reference answers in one sample and "zzzq" in the
    other; the judge says [[4]] of any prompt holding "zzzq", [[10]] otherwise."""
    header = enc(tok, ASSISTANT_HEADER)
    first_turns = []

    def policy_script(prompt):
        if count_subsequence(prompt, header) == 1:  # turn 1: the first call answers right, the next wrong
            kind = "ref" if not first_turns else "bad"
            first_turns.append(kind)
            return [*enc(tok, ANSWERS[kind][0]), IM_END]
        kind = "bad" if "zzzq" in tok.decode(prompt) else "ref"
        return [*enc(tok, ANSWERS[kind][1]), IM_END]

    def judge_script(prompt):
        rating = 4 if "zzzq" in tok.decode(prompt) else 10
        return [*enc(tok, f"Short answer.\nRating: [[{rating}]]{judge_tail}"), IM_END]

    from chatgym.trainer.config.run import load_config

    cfg = load_config(
        None,
        [
            *JUDGE_OVERRIDES,
            "train.max_steps=1",
            "train.micro_batch_size=4",
            f"train.output_dir={tmp_path}",
            "optim.lr=1e-3",
            "algo.tis_cap=null",
        ],
    )
    co = CoTrainConfig(
        party="judge", model_path="smollm2", lr=1e-3, max_tokens=32, tasks=(3,), calibration=calibration,
        stop=stop,
    )
    policy_engine = WeightSink(policy_script, tok)
    judge_engine = WeightSink(judge_script, tok)
    return CoTrainer(cfg, co, engine=policy_engine, party_engine=judge_engine), policy_engine, judge_engine


@pytest.fixture(scope="module")
def judge_step(tmp_path_factory, tok):
    needs_smollm2()
    trainer, policy_engine, judge_engine = judge_fixture_trainer(tmp_path_factory.mktemp("cotrain"), tok)
    policy_trajs, judge_trajs, metrics = trainer.rollouts(0)
    yield trainer, policy_engine, judge_engine, policy_trajs, judge_trajs, metrics
    trainer.close()


def kind_of(traj):
    return "bad" if "zzzq" in traj.messages[-1]["content"] else "ref"


def test_policy_rewards_and_masks(judge_step, tok):
    _, _, _, policy_trajs, _, metrics = judge_step
    assert [t.error for t in policy_trajs] == [None, None]
    by_kind = {kind_of(t): t for t in policy_trajs}
    assert set(by_kind) == {"ref", "bad"}
    # Judge-v0: each of the 2 question turns gives (rating - 1) / 9 / 2 when it closes.
    # ref: rated 10 twice -> 9/18 + 9/18 = 1.0; bad: rated 4 twice -> 3/18 + 3/18 = 1/3.
    assert by_kind["ref"].rewards == pytest.approx([0.5, 0.5]) and by_kind["ref"].reward == pytest.approx(1.0)
    assert by_kind["bad"].rewards == pytest.approx([1 / 6, 1 / 6]) and by_kind["bad"].reward == pytest.approx(
        1 / 3
    )
    for kind, t in by_kind.items():
        # Loss mask 1 exactly on the policy's own sampled ids: both answers, each closed by <|im_end|>.
        generated = [tid for tid, m in zip(t.token_ids, t.loss_mask, strict=True) if m]
        assert generated == [*enc(tok, ANSWERS[kind][0]), IM_END, *enc(tok, ANSWERS[kind][1]), IM_END]
        assert [v for v, m in zip(t.weight_versions, t.loss_mask, strict=True) if m] == [0] * len(generated)
    assert metrics["reward/mean"] == pytest.approx((1.0 + 1 / 3) / 2)
    # The fixed yardstick: the reference judge rates ref 10, 10 (-> 1.0) and bad 1, 1 (-> 0.0).
    assert metrics["policy/reference_reward"] == pytest.approx(0.5)
    assert metrics["policy/judge_error_episodes"] == 0


def test_held_out_evaluation_counts_a_failed_policy_episode_as_a_miss(tmp_path, tok):
    """Regression: eval/score and eval/policy/reference_reward were over the episodes that did not
    fail (1.0 and 1.0 here). Two held-out episodes of task 3; the policy's engine fails the second
    first-turn call, so one episode fails and the other answers the reference answers (judge [[10]]
    twice: reward 1.0, reference-judged 1.0)."""
    import dataclasses

    needs_smollm2()
    trainer, policy_engine, _ = judge_fixture_trainer(tmp_path, tok)
    trainer.co = dataclasses.replace(trainer.co, eval_task_ids=(3, 3))
    header, first_turns = enc(tok, ASSISTANT_HEADER), []
    generate = policy_engine.generate

    async def failing_second_first_turn(prompt_ids, params, **kwargs):
        if count_subsequence(prompt_ids, header) == 1:
            first_turns.append(prompt_ids)
            if len(first_turns) == 2:
                raise RuntimeError("the engine failed")
        return await generate(prompt_ids, params, **kwargs)

    policy_engine.generate = failing_second_first_turn
    try:
        metrics = trainer.evaluate(2)
    finally:
        trainer.close()
    assert (metrics["eval/failed"], metrics["eval/tasks"]) == (1, 2)
    assert metrics["eval/score"] == pytest.approx((1.0 + 0.0) / 2)
    assert metrics["eval/policy/reference_reward"] == pytest.approx((1.0 + 0.0) / 2)
    assert "eval/accuracy" not in metrics  # Judge-v0 rates answers: it states no success


def test_judge_rewards_masks_and_groups(judge_step, tok):
    _, _, judge_engine, _, judge_trajs, metrics = judge_step
    # Every judge sample of every question turn of both episodes reached the judge's batch: 2 x 2.
    assert len(judge_trajs) == 4 == len(judge_engine.calls)
    prompts = [call[0] for call in judge_engine.calls]
    for t in judge_trajs:
        prompt = t.token_ids[: t.prompt_len]
        assert prompt in prompts  # the ids the judge engine was sent, exactly
        rating = 4 if "zzzq" in tok.decode(prompt) else 10
        reply = [*enc(tok, f"Short answer.\nRating: [[{rating}]]"), IM_END]
        assert t.token_ids[t.prompt_len :] == reply
        assert t.loss_mask == [0] * t.prompt_len + [1] * len(reply)
        assert t.engine_logprobs == [0.0] * t.prompt_len + [replay_logprob(i) for i in reply]
        assert t.weight_versions == [-1] * t.prompt_len + [0] * len(reply)
        # Reference ratings: the reference answers have F1 1 -> 10, "zzzq" F1 0 -> 1.
        # Agreement: [[10]] vs 10 -> 1.0; [[4]] vs 1 -> 1 - 3/9 = 2/3.
        assert t.reward == pytest.approx(1.0 if rating == 10 else 2 / 3) and t.rewards == [t.reward]
    # Groups: (policy group 0, question turn 0) and (0, 1), two samples each (one per episode).
    assert sorted((t.group_id, t.sample_index) for t in judge_trajs) == [(0, 0), (0, 1), (1, 0), (1, 1)]
    for g in (0, 1):
        assert sorted(t.reward for t in judge_trajs if t.group_id == g) == pytest.approx([2 / 3, 1.0])
    assert metrics["judge/reward_mean"] == pytest.approx((2 / 3 + 1.0) / 2)
    assert (
        metrics["judge/samples"] == 4
        and metrics["judge/unscored"] == 0
        and metrics["judge/parse_rate"] == 1.0
    )


def test_a_step_updates_both_learners(judge_step):
    trainer, policy_engine, judge_engine, policy_trajs, judge_trajs, _ = judge_step
    before = {
        "policy": {n: p.detach().clone() for n, p in trainer.learner.policy.named_parameters()},
        "judge": {n: p.detach().clone() for n, p in trainer.party.learner.policy.named_parameters()},
    }
    assert (trainer.learner.version, trainer.party.learner.version) == (0, 0)
    synced = (len(policy_engine.loaded), len(judge_engine.loaded))
    metrics = trainer.update(policy_trajs, judge_trajs)
    assert (trainer.learner.version, trainer.party.learner.version) == (1, 1)
    assert (metrics["policy/version"], metrics["judge/version"]) == (1, 1)
    assert trainer.sync_weights() > 0  # both learners' versions moved: both engines are due
    assert (policy_engine.weight_version, judge_engine.weight_version) == (1, 1)
    # One more weight sync each, of every parameter of its own model.
    assert (len(policy_engine.loaded), len(judge_engine.loaded)) == (synced[0] + 1, synced[1] + 1)
    assert sorted(policy_engine.loaded[-1]) == sorted(before["policy"])
    assert sorted(judge_engine.loaded[-1]) == sorted(before["judge"])
    for side, learner in (("policy", trainer.learner), ("judge", trainer.party.learner)):
        after = dict(learner.policy.named_parameters())
        assert any(not torch.equal(before[side][n], p) for n, p in after.items()), f"{side}: nothing moved"
    # Two optimizers, two metric families.
    assert trainer.learner.state.optimizer is not trainer.party.learner.state.optimizer
    assert metrics["policy/actor/optimizer_steps"] == 1 and metrics["judge/actor/optimizer_steps"] == 1
    assert (
        metrics["policy/batch/trajectories_trained"] == 2 and metrics["judge/batch/trajectories_trained"] == 4
    )


def test_train_runs_the_trainer_loop_with_both_learners(tmp_path, tok):
    """``CoTrainer.train`` is ``Trainer``'s loop: one step updates both learners, each engine gets its
    learner's weights at start and after the step (nothing else), both sides are checkpointed."""
    needs_smollm2()
    trainer, policy_engine, judge_engine = judge_fixture_trainer(tmp_path, tok)
    try:
        assert (len(policy_engine.loaded), len(judge_engine.loaded)) == (1, 1)  # the first sync
        summary = trainer.train()
        assert (len(policy_engine.loaded), len(judge_engine.loaded)) == (2, 2)
        assert (policy_engine.weight_version, judge_engine.weight_version) == (1, 1)
    finally:
        trainer.close()
    (row,) = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert row["step"] == 1 and (row["policy/version"], row["judge/version"]) == (1, 1)
    assert row["batch/trajectories"] == 2 and row["judge/samples"] == 4
    assert row["policy/batch/trajectories_trained"] == 2 and row["judge/batch/trajectories_trained"] == 4
    checkpoints = summary["checkpoints"]
    assert checkpoints["policy"] == summary["checkpoint"] == str(tmp_path / "checkpoints" / "step_000001")
    assert checkpoints["judge"] == str(tmp_path / "judge" / "checkpoints" / "step_000001")
    assert (tmp_path / "judge" / "checkpoints" / "step_000001").is_dir()


def test_chatgym_cotrain_on_a_stalled_run_prints_one_line_returns_1_and_closes(
    tmp_path, tok, monkeypatch, capsys
):
    """Regression: `chatgym cotrain` let TrainingStalled out as a traceback. A run whose policy engine
    is out of GPU memory (every episode fails) with train.max_failed_steps=2: rc 1, the error in one
    `chatgym cotrain:` line, step 0's warning once, the trainer closed."""
    needs_smollm2()
    import chatgym.trainer.cotrain.loop as loop

    class OutOfMemory(WeightSink):
        async def generate(self, *args, **kwargs):
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.81 GiB.")

    closed = []

    class StallingCoTrainer(CoTrainer):  # what main builds, with scripted engines
        def __init__(self, config, co):
            never = WeightSink(lambda prompt: [IM_END], tok)
            super().__init__(config, co, engine=OutOfMemory(lambda prompt: [IM_END], tok), party_engine=never)

        def close(self):
            closed.append(True)
            super().close()

    monkeypatch.setattr(loop, "CoTrainer", StallingCoTrainer)
    config = tmp_path / "cotrain.yaml"
    config.write_text(
        "cotrain:\n  party: judge\n  model_path: smollm2\n  lr: 0.001\n  max_tokens: 32\n  tasks: [3]\n"
    )
    overrides = [*JUDGE_OVERRIDES, "train.max_failed_steps=2"]
    rc = loop.main([str(config), *overrides, "--max-steps", "3", "--output-dir", str(tmp_path / "run")])
    captured = capsys.readouterr()
    assert rc == 1 and closed == [True]
    failed = (
        "all 2 episodes failed, nothing was trained "
        "(2 of them: engine_error: OutOfMemoryError: CUDA out of memory. Tried to allocate 2.81 GiB.)"
    )
    error = (
        "chatgym cotrain: 2 steps in a row had every episode fail (train.max_failed_steps=2); stopping. "
        f"The last: step 2: {failed}"
    )
    assert [line for line in captured.err.splitlines() if line.startswith("chatgym cotrain:")] == [error]
    assert [line for line in captured.err.splitlines() if "episodes failed" in line] == [
        f"chatgym: step 1: {failed}",
        error,
    ]
    assert captured.out == ""  # no summary


def test_chatgym_cotrain_on_sigterm_closes_names_both_checkpoints_and_returns_143(tmp_path, tok, monkeypatch, capsys):
    """Regression: Ctrl-C or SIGTERM ended `chatgym cotrain` with a traceback (or killed it where it
    stood) without saying which checkpoints were saved. A real SIGTERM to this process in step 2, after
    step 1's checkpoints (train.save_every=1): rc 143, one line naming the policy's and the judge's
    checkpoints, the trainer closed, the handler gone afterwards."""
    needs_smollm2()
    import os
    import signal

    from train_helpers import interrupt_in_second_step

    import chatgym.trainer.cotrain.loop as loop

    closed = []

    class ScriptedCoTrainer(CoTrainer):  # what main builds, with scripted engines
        def __init__(self, config, co):
            super().__init__(
                config,
                co,
                engine=WeightSink(lambda prompt: [IM_END], tok),
                party_engine=WeightSink(lambda prompt: [IM_END], tok),
            )

        def close(self):
            closed.append(True)
            super().close()

    monkeypatch.setattr(loop, "CoTrainer", ScriptedCoTrainer)
    interrupt_in_second_step(monkeypatch, lambda: os.kill(os.getpid(), signal.SIGTERM))
    config = tmp_path / "cotrain.yaml"
    config.write_text(
        "cotrain:\n  party: judge\n  model_path: smollm2\n  lr: 0.001\n  max_tokens: 32\n  tasks: [3]\n"
    )
    out = tmp_path / "run"
    before = signal.getsignal(signal.SIGTERM)
    rc = loop.main([str(config), *JUDGE_OVERRIDES, "train.save_every=1", "--max-steps", "3", "--output-dir", str(out)])
    assert rc == 143 and closed == [True]
    step1 = "checkpoints/step_000001"
    assert capsys.readouterr().err.endswith(
        f"chatgym cotrain: terminated (SIGTERM); the last checkpoints are {out / step1} and {out / 'judge' / step1}\n"
    )
    assert signal.getsignal(signal.SIGTERM) is before


# ---- calibration answers: judge samples of set quality beside the policy's --------------------------


def test_calibration_answer_cuts_the_reference_by_words():
    from chatgym.envs.judge.mtbench import load_mtbench

    rows = load_mtbench("reference")
    david, other = rows[3], rows[4]  # mtbench/104 ("David has only one brother.", 5 words) and the next
    assert calibration_answer(david, 1.0, other) == "David has only one brother."
    assert calibration_answer(david, 0.5, other) == "David has only"  # ceil(2.5) = 3 words
    assert calibration_answer(david, 0.2, other) == "David"  # ceil(1.0) = 1, not 2
    assert calibration_answer(david, 0.01, other) == "David"  # at least one word
    assert calibration_answer(david, 0.0, other) == other["reference"][0]  # an answer to another question
    ref = rows[0]["reference"][0]
    half = calibration_answer(rows[0], 0.5, david)  # a longer reference: its own text, newlines kept
    assert ref.startswith(half) and len(half.split()) == -(-len(ref.split()) // 2)
    with pytest.raises(ValueError, match=r"calibration fraction must be in \[0, 1\], got 1.5"):
        calibration_answer(david, 1.5, other)
    with pytest.raises(ValueError, match="mtbench/81 has no reference answer"):
        calibration_answer({"task_id": "mtbench/81", "reference": None}, 0.5, other)


async def test_rubric_prompt_is_the_envs_judge_prompt():
    from chatgym.envs.judge.env import JudgeEnv, rubric_prompt

    env = JudgeEnv(split="reference")
    await env.areset(options={"task_index": 3})
    assert rubric_prompt(env.task, ["zzzq"]) == env.judge_prompt("zzzq")
    assert "[The Start of Reference Answer]\nDavid has only one brother.\n" in env.judge_prompt("zzzq")
    with pytest.raises(ValueError, match="question turn 1 or 2: got 3 answers"):
        rubric_prompt(env.task, ["a", "b", "c"])
    env.close()


@pytest.fixture(scope="module")
def calibration_step(tmp_path_factory, tok):
    needs_smollm2()
    out = tmp_path_factory.mktemp("calib")
    (out / "eval_calibration.jsonl").write_text('{"judge_version": 9}\n')  # an earlier run's: replaced
    trainer, _, judge_engine = judge_fixture_trainer(out, tok, calibration=(1.0, 0.5))
    policy_trajs, judge_trajs, metrics = trainer.rollouts(0)
    yield trainer, judge_engine, policy_trajs, judge_trajs, metrics
    trainer.close()


def test_calibration_samples_join_the_judges_batch_in_their_own_groups(calibration_step, tok):
    _, judge_engine, policy_trajs, judge_trajs, metrics = calibration_step
    # 2 episodes x 2 question turns of policy answers, then 2 fractions x group_size 2 calibration samples.
    assert len(judge_trajs) == 8 == len(judge_engine.calls) and len(policy_trajs) == 2
    calib = [t for t in judge_trajs if t.group_id >= 2]
    assert sorted((t.group_id, t.sample_index) for t in calib) == [(2, 0), (2, 1), (3, 0), (3, 1)]
    for t in calib:
        prompt = tok.decode(t.token_ids[: t.prompt_len])
        answer = prompt.split("[The Start of Assistant's Answer]\n")[1].split("\n[The End")[0]
        # The scripted judge says [[10]] (no "zzzq"). References: the whole answer F1 1 -> 10, agreement 1;
        # "David has only": P 3/3, R 3/5, F1 0.75 -> 1 + round(6.75) = 8, agreement 1 - 2/9 = 7/9.
        assert (t.group_id, answer) in {(2, "David has only one brother."), (3, "David has only")}
        assert t.reward == pytest.approx(1.0 if t.group_id == 2 else 7 / 9)
        assert t.loss_mask == [0] * t.prompt_len + [1] * (len(t.token_ids) - t.prompt_len)
    assert metrics["judge/calibration/reward_mean"] == pytest.approx((1 + 1 + 7 / 9 + 7 / 9) / 4)
    assert metrics["judge/calibration/samples"] == 4 and metrics["judge/calibration/parse_rate"] == 1.0
    assert metrics["judge/reward_mean"] == pytest.approx((2 / 3 + 1.0) / 2)  # the policy answers' alone, as before


def test_calibration_in_the_evaluation_is_one_greedy_sample_each(calibration_step):
    trainer, judge_engine, policy_trajs, _, _ = calibration_step
    calls = len(judge_engine.calls)
    got = trainer.loop.run_until_complete(trainer._eval_extras(policy_trajs))
    assert len(judge_engine.calls) == calls + 2  # one per fraction
    # refs 10 and 8, the judge 10 and 10: agreement (1 + 7/9) / 2 = 8/9; any constant in 8..10 agrees
    # 1 - 2/18 = 8/9 too (8 the lowest): over the constant 0; one distinct rating.
    assert got["eval/judge/calibration/reward_mean"] == pytest.approx(8 / 9)
    assert got["eval/judge/calibration/best_constant_agreement"] == pytest.approx(8 / 9)
    assert got["eval/judge/calibration/best_constant_rating"] == 8.0
    assert got["eval/judge/calibration/agreement_over_constant"] == pytest.approx(0.0)
    assert got["eval/judge/calibration/rating_distinct"] == 1.0
    # One pair with different references (10 > 8), rated 10 and 10: a tie, so not in order.
    assert got["eval/judge/calibration/order_accuracy"] == 0.0
    assert got["eval/judge/calibration/order_pairs"] == 1.0
    rows = [json.loads(line) for line in (trainer.out / "eval_calibration.jsonl").read_text().splitlines()]
    assert rows == [
        {"judge_version": 0, "task_id": "mtbench/104", "fraction": 1.0, "rating": 10.0, "reference_rating": 10.0},
        {"judge_version": 0, "task_id": "mtbench/104", "fraction": 0.5, "rating": 10.0, "reference_rating": 8.0},
    ]
    # The policy answers' names are unchanged: refs 10, 10 (ref episode) and 1, 1 ("zzzq"); judge 10, 10, 4, 4.
    assert got["eval/judge/best_constant_agreement"] == pytest.approx(0.5)
    assert got["eval/judge/agreement_over_constant"] == pytest.approx((1 + 1 + 2 / 3 + 2 / 3) / 4 - 0.5)


# ---- Judge-v0's arithmetic questions: a verifier judge co-trained with the policy --------------------


@pytest.mark.parametrize("judge_view", ["reply", "final_answer"])
def test_arithmetic_cotraining_step_scores_the_judge_on_answers_and_calibration(tmp_path, tok, judge_view):
    """Task 0 of a 4-task arithmetic train split, 2 policy samples (the gold, then gold + 1), calibration
    ``(1.0, 0.0)`` (the gold; task 1's gold). The scripted judge says [[9]] of an answer shown as
    ``Sum: <answer>gold</answer>`` (``judge_view="reply"``) / ``<answer>gold</answer>`` (``"final_answer"``:
    the policy's and the calibration answers alike) and [[3]] otherwise."""
    from chatgym.envs.judge.arithmetic import load_arithmetic
    from chatgym.trainer.config.run import load_config

    needs_smollm2()
    rows = load_arithmetic("train", 4)
    gold, other = rows[0]["reference"][0], rows[1]["reference"][0]
    assert gold != other
    header = enc(tok, ASSISTANT_HEADER)
    answers = iter([f"Sum: <answer>{gold}</answer>", f"Sum: <answer>{int(gold) + 1}</answer>"])
    prefix = "Sum: " if judge_view == "reply" else ""

    def shown(value):  # what the judge sees of an answer whose final answer is value
        return f"{prefix}<answer>{value}</answer>"

    def policy_script(prompt):
        assert count_subsequence(prompt, header) == 1
        return [*enc(tok, next(answers)), IM_END]

    def judge_script(prompt):
        block = tok.decode(prompt).split("[The Start of Assistant's Answer]\n")[1].split("\n[The End")[0]
        return [*enc(tok, f"Rating: [[{9 if block == shown(gold) else 3}]]"), IM_END]

    overrides = [o for o in JUDGE_OVERRIDES if "split" not in o]
    cfg = load_config(None, [
        *overrides, f'env.kwargs={{"questions": "arithmetic", "size": 4, "judge_view": "{judge_view}"}}',
        "env.train_split=train",
        "env.eval_split=test", "train.max_steps=1", "train.micro_batch_size=4", f"train.output_dir={tmp_path}",
    ])
    co = CoTrainConfig(party="judge", model_path="smollm2", lr=1e-3, max_tokens=16, tasks=(0,), calibration=(1.0, 0.0))
    trainer = CoTrainer(cfg, co, engine=WeightSink(policy_script, tok), party_engine=WeightSink(judge_script, tok))
    try:
        policy_trajs, judge_trajs, metrics = trainer.rollouts(0)
        # train_on_answers=False: the same ratings, but the judge's batch is the calibration twins alone.
        answers = iter([f"Sum: <answer>{gold}</answer>", f"Sum: <answer>{int(gold) + 1}</answer>"])
        trainer.co = dataclasses.replace(co, train_on_answers=False)
        _, twins_only, twins_metrics = trainer.rollouts(0)
        # calibration_negative="policy": both policy answers now wrong (the same: which sample the
        # engine serves first is not fixed), so the 0.0 twin is that answer as written (reference 1),
        # not task 1's gold.
        answers = iter([f"Sum: <answer>{int(gold) + 1}</answer>"] * 2)
        trainer.co = dataclasses.replace(co, train_on_answers=False, calibration_negative="policy")
        _, own_negatives, _ = trainer.rollouts(0)
    finally:
        trainer.close()
    negatives = {tok.decode(t.token_ids[: t.prompt_len]).split("[The Start of Assistant's Answer]\n")[1].split("\n[The End")[0]
                 for t in own_negatives if t.group_id == 2}
    assert negatives == {shown(int(gold) + 1)}
    assert [round(9 * t.reward, 9) for t in own_negatives if t.group_id == 2] == [7.0, 7.0]  # [[3]] against 1
    assert sorted(t.group_id for t in twins_only) == [1, 1, 2, 2]
    assert twins_metrics["judge/reward_mean"] == metrics["judge/reward_mean"] == pytest.approx((8 / 9 + 7 / 9) / 2)
    # The policy: judged [[9]] -> (9 - 1) / 9 and [[3]] -> 2/9; the reference judge: 10 and 1.
    assert sorted(t.reward for t in policy_trajs) == pytest.approx([2 / 9, 8 / 9])
    assert metrics["policy/reference_reward"] == pytest.approx(0.5)
    answer_of = {t.group_id * 10 + t.sample_index: tok.decode(t.token_ids[: t.prompt_len]) for t in judge_trajs}
    assert len(judge_trajs) == 6  # 2 policy answers, then 2 calibration answers x group_size 2
    calib = {}
    for t in judge_trajs:
        block = answer_of[t.group_id * 10 + t.sample_index].split("[The Start of Assistant's Answer]\n")[1]
        calib.setdefault(t.group_id, set()).add((block.split("\n[The End")[0], round(9 * t.reward, 9)))
    # Agreement 1 - |rating - reference| / 9: the gold rated 9 (reference 10) -> 8/9; a wrong answer
    # rated 3 (reference 1) -> 7/9 (nine times each reward below). Group 0: the policy's answers;
    # 1: calibration 1.0, 2: calibration 0.0, both written from the policy's first answer to the task
    # (its first sample's, the gold) with the final answer set to the gold / to task 1's gold.
    assert calib == {
        0: {(shown(gold), 8.0), (shown(int(gold) + 1), 7.0)},
        1: {(shown(gold), 8.0)},
        2: {(shown(other), 7.0)},
    }
    assert metrics["judge/calibration/reward_mean"] == pytest.approx((8 / 9 + 8 / 9 + 7 / 9 + 7 / 9) / 4)


async def test_arithmetic_calibration_gives_a_judges_10_no_agreement():
    from chatgym.envs import messages as M
    from chatgym.trainer.cotrain.calibration import calibration_episodes
    from chatgym.trainer.cotrain.party import judge_agreement

    class Says:  # one scripted reply per call, in order
        def __init__(self, replies):
            self.replies = iter(replies)

        async def respond_with_trace(self, view):
            return M.assistant(next(self.replies)), {"token_ids": [1]}

    rows = {
        "arithmetic/train/0": {"task_id": "arithmetic/train/0", "category": "arithmetic", "turns": ["Calculate 55 + 98."], "reference": ["153"]},
        "arithmetic/train/1": {"task_id": "arithmetic/train/1", "category": "arithmetic", "turns": ["Calculate 1 + 1."], "reference": ["2"]},
    }
    episodes = await calibration_episodes(
        ["arithmetic/train/0"], [1.0, 0.0], Says(["Rating: [[10]]", "Rating: [[9]]", "Rating: [[1]]", "Rating: [[10]]"]),
        samples=2, tasks=rows, policy_answers={"arithmetic/train/0": "It is <answer>150</answer>"},
    )
    traces = [t for e in episodes for t in e.info["judge_traces"]]
    assert [(t["rating"], t["reference_rating"], t["rating_top"]) for t in traces] == [
        (10.0, 10.0, 9), (9.0, 10.0, 9), (1.0, 1.0, 9), (10.0, 1.0, 9)
    ]
    assert await judge_agreement(traces) == pytest.approx([0.0, 8 / 9, 1.0, 0.0])


def test_arithmetic_calibration_answers_are_the_policys_answer_with_the_final_answer_set():
    from chatgym.trainer.cotrain.calibration import with_final_answer

    task = {"task_id": "arithmetic/train/0", "category": "arithmetic", "turns": ["Calculate 55 + 98."], "reference": ["153"]}
    other = {"task_id": "arithmetic/train/1", "category": "arithmetic", "turns": ["Calculate 1 + 1."], "reference": ["2"]}
    policy = "55 + 98 = 143, so <answer>143</answer>."
    assert calibration_answer(task, 1.0, other, policy) == "55 + 98 = 143, so <answer>153</answer>."
    assert calibration_answer(task, 0.5, other, policy) == "55 + 98 = 143, so <answer>153</answer>."  # one number: all of it
    assert calibration_answer(task, 0.0, other, policy) == "55 + 98 = 143, so <answer>2</answer>."
    assert calibration_answer(task, 1.0, other) == "<answer>153</answer>"  # no policy answer (a failed episode)
    # The last closed tag's content is set, every other tag marker dropped; without a tag one is appended.
    assert with_final_answer("<answer>1</answer> then <ANSWER>\n7 </ANSWER>!", "9") == "1 then <answer>9</answer>!"
    assert with_final_answer("It is 143.\n\n", "153") == "It is 143.\n<answer>153</answer>"
    assert with_final_answer("  ", "153") == "<answer>153</answer>"
    assert with_final_answer("a <answer>1</answer> b <answer> c", "9") == "a <answer>9</answer> b  c"


@pytest.mark.parametrize("text", [
    "13 + 6 = 7\n\nThe answer is inside <answer> tags.",  # the three policy answers (GPU runs, held-out)
    "74 + 37 = 10 <<answer>",                             # whose "gold" twins read otherwise before the fix
    "The answer is inside the <answer> tag.",
    "I think <answer> the answer: <answer>7</answer>",
    "<answer>1</answer> and <answer>2</answer> so </answer> x",
    "The answer is 12. \\boxed{12}",
    "",
    "<answer<answer>>",  # removing a marker joins its neighbours into another (a reviewer's fuzzing)
    "<ans</answer>wer>12 ",
    "<answer<answer>>x<answer>1</answer>",
])
def test_a_calibration_twin_reads_as_the_value_it_was_given(text):
    from chatgym.envs.math.answer import extract_answer
    from chatgym.trainer.cotrain.calibration import with_final_answer

    assert extract_answer(with_final_answer(text, "19")) == ("19", True)
    assert extract_answer(with_final_answer(text, "-2")) == ("-2", True)


def test_policy_negatives_are_the_policys_wrong_answers_as_written():
    task = {"task_id": "arithmetic/train/0", "category": "arithmetic", "turns": ["Calculate 55 + 98."], "reference": ["153"]}
    other = {"task_id": "arithmetic/train/1", "category": "arithmetic", "turns": ["Calculate 1 + 1."], "reference": ["2"]}
    wrong, right, none = "55 + 98 = 143, so <answer>143</answer>.", "It is <answer>153.0</answer>", "I like sums."
    assert calibration_answer(task, 0.0, other, wrong, negative="policy") == wrong
    assert calibration_answer(task, 0.0, other, none, negative="policy") == none  # no final answer: wrong
    # a right answer (153.0 is 153 to Math-v0): another task's gold, as with "other_gold"
    assert calibration_answer(task, 0.0, other, right, negative="policy") == "It is <answer>2</answer>"
    assert calibration_answer(task, 0.0, other, None, negative="policy") == "<answer>2</answer>"  # a failed episode
    assert calibration_answer(task, 1.0, other, wrong, negative="policy") == "55 + 98 = 143, so <answer>153</answer>."
    with pytest.raises(ValueError, match=r"^negative must be 'other_gold' or 'policy', got 'mine'$"):
        calibration_answer(task, 0.0, other, wrong, negative="mine")


async def test_policy_negatives_show_the_judge_an_answer_without_a_final_answer():
    from chatgym.envs import messages as M
    from chatgym.trainer.cotrain.calibration import calibration_episodes

    class Says:
        def __init__(self):
            self.prompts = []

        async def respond_with_trace(self, view):
            self.prompts.append(view[-1]["content"])
            return M.assistant("Rating: [[9]]"), {"token_ids": [1]}

    rows = {
        "arithmetic/train/0": {"task_id": "arithmetic/train/0", "category": "arithmetic", "turns": ["Calculate 55 + 98."], "reference": ["153"]},
        "arithmetic/train/1": {"task_id": "arithmetic/train/1", "category": "arithmetic", "turns": ["Calculate 1 + 1."], "reference": ["2"]},
    }
    judge = Says()
    episodes = await calibration_episodes(
        ["arithmetic/train/0"], [1.0, 0.0], judge, samples=1, tasks=rows, judge_view="final_answer",
        policy_answers={"arithmetic/train/0": "I like sums."}, negative="policy",
    )
    shown = [p.split("[The Start of Assistant's Answer]\n")[1].split("\n[The End")[0] for p in judge.prompts]
    assert shown == ["<answer>153</answer>", "(no final answer)"]
    traces = [t for e in episodes for t in e.info["judge_traces"]]
    assert [(t["calibration"], t["rating"], t["reference_rating"]) for t in traces] == [(1.0, 9.0, 10.0), (0.0, 9.0, 1.0)]


def test_first_answers_are_each_tasks_first_unfailed_policy_answer():
    from chatgym.trainer.cotrain.calibration import first_answers
    from chatgym.trainer.rollout.types import Trajectory

    def episode(task_id, answer, error=None):
        return Trajectory(env_id="Judge-v0", task_id=task_id, error=error,
                          messages=[system("s"), user("q"), assistant(answer), user("next"), assistant("later")])

    trajs = [episode("a", "a0", error="boom"), episode("a", "a1"), episode("a", "a2"), episode("b", "b0")]
    assert first_answers(trajs) == {"a": "a1", "b": "b0"}


def test_calibration_order_counts_pairs_ranked_as_the_reference_ranks_them():
    from chatgym.trainer.rollout.types import Trajectory

    def episode(task_id, samples):
        traces = [{"reference_rating": ref, "rating": rating} for ref, rating in samples]
        return Trajectory(env_id="Judge-v0", task_id=task_id, group_id=0, sample_index=0, info={"judge_traces": traces})

    episodes = [
        # refs 10, 7, 3 rated 8, 8, 2: (10, 7) a tie, a miss; (10, 3) and (7, 3) in order.
        episode("a", [(10.0, 8.0), (7.0, 8.0), (3.0, 2.0)]),
        # refs 5, 5: equal, no pair; (5, 9) rated 6 and None: unparsed, a miss; (5, 9) rated 4, 9: right.
        episode("b", [(5.0, 6.0), (5.0, 4.0), (9.0, None)]),
        episode("c", [(9.0, 9.0), (2.0, 9.0)]),  # a tie: a miss
        episode("d", [(2.0, 3.0), (9.0, 1.0)]),  # reversed: a miss
    ]
    # Pairs: a 3 (2 right), b 2 (0 right), c 1 (0), d 1 (0): 2 of 7. Pairs never cross tasks.
    assert calibration_order(episodes) == {"judge/order_accuracy": 2 / 7, "judge/order_pairs": 7.0}
    assert calibration_order([episode("e", [(4.0, 1.0), (4.0, 9.0)])]) == {}  # no pair of different references


def test_party_stop_strings_end_the_judges_reply_at_its_rating(tmp_path, tok):
    needs_smollm2()
    trainer, _, judge_engine = judge_fixture_trainer(tmp_path, tok, stop=("]]",), judge_tail=" I hope this helps.")
    try:
        _, judge_trajs, metrics = trainer.rollouts(0)
    finally:
        trainer.close()
    assert judge_engine.calls and all(params.stop == ("]]",) for _, params in judge_engine.calls)
    for t in judge_trajs:
        rating = 4 if "zzzq" in tok.decode(t.token_ids[: t.prompt_len]) else 10
        # The scripted reply goes on after "]]"; the engine stops on the token that completes it.
        assert tok.decode(t.token_ids[t.prompt_len :]) == f"Short answer.\nRating: [[{rating}]]"
        assert t.finish_reasons == ["stop"]
    assert metrics["judge/parse_rate"] == 1.0


def test_calibration_config_is_checked_at_load():
    from chatgym.trainer.config.run import ConfigError

    _, co = load_cotrain_config(None, ["cotrain.calibration=[1.0, 0.5, 0.0]"])
    assert co.calibration == (1.0, 0.5, 0.0)
    with pytest.raises(ConfigError, match=r"cotrain.*calibration must be fractions in \[0, 1\], got \[1.0, 2.0\]"):
        load_cotrain_config(None, ["cotrain.calibration=[1.0, 2.0]"])
    with pytest.raises(ConfigError, match=r"cotrain.*stop must hold non-empty strings, got \['\]\]', ''\]"):
        load_cotrain_config(None, ["cotrain.stop=[']]', '']"])
    with pytest.raises(ConfigError, match=r"^cotrain\.calibration: answers for a judge to rate; party 'user' takes none$"):
        load_cotrain_config(None, ["cotrain.party=user", "cotrain.calibration=[1.0]"])
    with pytest.raises(ConfigError, match=r"^cotrain\.train_on_answers: false leaves the party nothing to train on without cotrain\.calibration$"):
        load_cotrain_config(None, ["cotrain.train_on_answers=false"])
    arithmetic = "env.kwargs={questions: arithmetic}"
    _, co = load_cotrain_config(None, [arithmetic, "cotrain.calibration=[1.0, 0.0]", "cotrain.calibration_negative=policy"])
    assert co.calibration_negative == "policy"
    with pytest.raises(ConfigError, match=r"^cotrain\.calibration_negative: policy needs Judge-v0's arithmetic questions"):
        load_cotrain_config(None, ["cotrain.calibration=[1.0, 0.0]", "cotrain.calibration_negative=policy"])
    with pytest.raises(ConfigError, match=r"cotrain.*calibration_negative: policy sets the 0\.0 calibration answer; cotrain\.calibration has none \(got \[1\.0\]\)"):
        load_cotrain_config(None, [arithmetic, "cotrain.calibration=[1.0]", "cotrain.calibration_negative=policy"])
    with pytest.raises(ConfigError, match=r"cotrain\.calibration_negative"):
        load_cotrain_config(None, [arithmetic, "cotrain.calibration=[1.0, 0.0]", "cotrain.calibration_negative=mine"])


# ---- UserSim-v0: faithfulness of a scripted simulated user ---------------------------------------

USER_REPLIES = [
    "Hi, I want to cancel reservation EHGLP3.",
    "It is emma_kim_9957 and my booking is 777XYZ.",
]


def usersim_rollout(tok, policy_turns, **env_kwargs):
    header = enc(tok, ASSISTANT_HEADER)
    # The agent's prompt already holds one assistant turn (tau2's greeting): its first reply is k=1.
    policy = ReplayEngine(
        turn_script([[IM_END]] + [[*enc(tok, t), IM_END] for t in policy_turns], header), tok
    )
    user_engine = ReplayEngine(turn_script([[*enc(tok, t), IM_END] for t in USER_REPLIES], header), tok)
    responder = VersionedResponder(user_engine, tok)
    collector = Collector(policy, tok, RolloutConfig(max_model_len=32768, episode_timeout_s=60.0))
    request = RolloutRequest(
        "UserSim-v0", (0,), 1, {"domain": "airline", "split": "train", "user": responder, **env_kwargs}
    )
    return LocalRollout(policy, collector).collect(request)


def test_faithfulness_by_hand():
    scenario = (
        "Known info:\n\tYou are Emma Kim.\n\tYour user id is emma_kim_9957.\nTask instructions:\n\tbe nice"
    )
    view = [system(f"<scenario>\n{scenario}\n</scenario>"), user("Hi! How can I help you today?")]
    traces = [
        {"messages": view, "text": "I need help."},  # states no fact: grounded 1
        {"messages": [*view, user("Your order #W42 is here")], "text": "Order #W42 and id 99X"},
    ]
    assert facts("Order #W42 and id 99X.") == {"w42", "99x"}
    # Known facts {emma_kim_9957}; never stated -> coverage 0.
    # reply 0: 0.5 * 1 + 0.5 * 0 = 0.5; reply 1: w42 grounded (the agent said it), 99x not -> 0.5 * 1/2.
    assert faithfulness(traces) == pytest.approx([0.5, 0.25])


def test_user_checks_split_faithfulness_and_compare_a_scenario_blind_user():
    from chatgym.trainer.rollout.types import Trajectory

    def view(known):
        return [system(f"<scenario>\nKnown info:\n\t{known}\nTask instructions:\n\tbe nice\n</scenario>")]

    emma = view("Your user id is emma_kim_9957.")
    a = [  # known {emma_kim_9957}, stated in reply 1 -> coverage 1; reply 1 also states 99x, unseen
        {"messages": emma, "text": "I need help."},
        {"messages": emma, "text": "I am emma_kim_9957, order 99X."},
    ]
    b = [{"messages": view("You are Noah."), "text": "I need help."}]  # no known facts: coverage 1
    eps = [Trajectory(env_id="UserSim-v0", task_id=i, info={"user_traces": tr}) for i, tr in enumerate((a, b))]
    eps.append(Trajectory(env_id="UserSim-v0", task_id=2, error="crash", info={"user_traces": a}))  # failed: left out
    got = user_checks(eps)
    # grounded per reply: 1, 1/2 (a), 1 (b) -> 5/6; coverage per episode 1, 1 -> 1.
    # faithfulness: a 1.0, 0.75; b 1.0 -> mean 11/12. Blind: a's replies 0.5 each (known facts), b's 1.0.
    assert got == pytest.approx({
        "user/grounded": 5 / 6,
        "user/coverage": 1.0,
        "user/blind_faithfulness": 2 / 3,
        "user/faithfulness_over_blind": 11 / 12 - 2 / 3,
        "user/opening_distinct": 0.5,  # both openings are "I need help."
    })
    assert user_checks([]) == {}


async def test_usersim_user_traces_and_faithfulness(tok):
    from chatgym.envs.usersim import data

    assert (
        "emma_kim_9957"
        in data.load_tasks("airline", "train")[0]["user_scenario"]["instructions"]["known_info"]
    )
    turns = [
        tool_call_text("get_user_details", user_id="emma_kim_9957"),
        "Please give me your user id.",
        "###STOP###",
    ]
    [traj] = await usersim_rollout(tok, turns)
    assert traj.error is None and traj.num_turns == 3 and traj.info["termination"] == "agent_stop"
    user_trajs, metrics = await party_trajectories([traj], "user", _async(faithfulness))
    assert [t.messages[-1]["content"] for t in user_trajs] == USER_REPLIES
    # Known facts {emma_kim_9957}, stated in reply 1 -> coverage 1.
    # Reply 0 states {ehglp3}, in the scenario -> grounded 1 -> 0.5 + 0.5 = 1.0.
    # Reply 1 states {emma_kim_9957, 777xyz}; 777xyz is in neither scenario nor dialogue -> 0.5 * 1/2 + 0.5.
    assert [t.reward for t in user_trajs] == pytest.approx([1.0, 0.75])
    assert [(t.group_id, t.sample_index) for t in user_trajs] == [(0, 0), (1, 0)]
    for t, text in zip(user_trajs, USER_REPLIES, strict=True):
        reply = [*enc(tok, text), IM_END]
        assert t.token_ids[t.prompt_len :] == reply and t.loss_mask == [0] * t.prompt_len + [1] * len(reply)
    assert metrics == {"user/reward_mean": pytest.approx(0.875), "user/samples": 2, "user/unscored": 0}


async def test_usersim_episode_ending_on_a_tool_call_keeps_the_opening_user_turn(tok):
    # Regression: the opening user turn (sampled at reset) was only in the info of steps that reach
    # the user; an episode truncated right after a tool call lost it. Now every step carries the list.
    [traj] = await usersim_rollout(tok, [tool_call_text("get_user_details", user_id="x")], max_turns=1)
    assert traj.truncated and traj.num_turns == 1
    user_trajs, _ = await party_trajectories([traj], "user", _async(faithfulness))
    assert [t.messages[-1]["content"] for t in user_trajs] == USER_REPLIES[:1]


def _async(fn):
    async def wrapped(traces):
        return fn(traces)

    return wrapped


# ---- config ----------------------------------------------------------------------------------------


def test_example_config_loads_and_bad_keys_are_named(tmp_path):
    from chatgym.trainer.config.run import ConfigError

    cfg, co = load_cotrain_config("examples/configs/cotrain_judge_cpu.yaml", ["cotrain.lr=2e-5"])
    assert cfg.env.id == "Judge-v0" and co.party == "judge" and co.lr == 2e-5
    with pytest.raises(ConfigError, match=r"cotrain\.lrr: unknown config key; did you mean cotrain\.lr\?"):
        load_cotrain_config("examples/configs/cotrain_judge_cpu.yaml", ["cotrain.lrr=1"])
    with pytest.raises(ConfigError, match=r"cotrain.*lr must be > 0"):
        load_cotrain_config(None, ["cotrain.lr=0"])


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_chatgym_cotrain_start_up_errors_are_one_line_rc_2(tmp_path, capsys):
    from chatgym.trainer.cotrain.loop import main

    rc = main(["examples/configs/cotrain_judge_cpu.yaml", "model.device=cuda", "--output-dir", str(tmp_path / "a")])
    err = capsys.readouterr().err
    assert rc == 2 and err.startswith("chatgym cotrain: model.device") and "CUDA" in err
    assert err.count("\n") == 1 and "Traceback" not in err


def test_chatgym_cotrain_into_a_used_output_dir_offers_no_resume(tmp_path, capsys):
    # cotrain has no --resume: the checkpoint check is told so (it was the train hint, string-edited).
    from chatgym.trainer.cotrain.loop import main
    from chatgym.trainer.learner.checkpoint import STATE_FILE

    ckpt = tmp_path / "checkpoints" / "step_000001"
    ckpt.mkdir(parents=True)
    (ckpt / STATE_FILE).write_bytes(b"")
    assert main(["examples/configs/cotrain_judge_cpu.yaml", "--output-dir", str(tmp_path)]) == 2
    assert capsys.readouterr().err == f"chatgym cotrain: {tmp_path} already holds checkpoints; choose another --output-dir\n"


def test_chatgym_cotrain_refuses_a_chat_template_in_one_line_before_the_models_load(tmp_path, monkeypatch, capsys):
    # Regression: chatgym cotrain ran none of chatgym train's start-up checks, so a template the
    # collector refuses was a traceback after both models had loaded.
    from cli_refusals import NO_EOS_REASON, NO_EOS_TEMPLATE

    from chatgym.trainer.cotrain import loop

    monkeypatch.setattr(loop, "CoTrainer", None)  # building one would fail the test
    no_eos = tmp_path / "no_eos.jinja"
    no_eos.write_text(NO_EOS_TEMPLATE)
    out = tmp_path / "run"
    assert loop.main(["examples/configs/cotrain_judge_cpu.yaml", f"rollout.chat_template={no_eos}",
                      "--output-dir", str(out)]) == 2  # fmt: skip
    assert capsys.readouterr().err == f"chatgym cotrain: rollout.chat_template: {NO_EOS_REASON}\n"
    assert not out.exists()


def test_chatgym_cotrain_checks_the_env_in_one_line_before_the_models_load(tmp_path, monkeypatch, capsys):
    # Regression: a misspelt env.kwargs key or a split the env lacks was a traceback (status 1) once
    # both models had loaded (count_tasks), the output dir left behind; an env.id without the party's
    # keyword failed every episode. (An unknown env.id was already refused at load.)
    from chatgym.trainer.cotrain import loop

    monkeypatch.setattr(loop, "CoTrainer", None)  # building one would fail the test
    out = tmp_path / "run"

    def refusal(*overrides: str) -> str:
        config = "examples/configs/cotrain_judge_cpu.yaml"
        assert loop.main([config, *overrides, "--output-dir", str(out)]) == 2
        assert not out.exists()
        return capsys.readouterr().err

    assert refusal("env.kwargs.max_turnz=2") == (
        "chatgym cotrain: env.kwargs: cannot build the env: TypeError: ChatEnv.__init__() got an unexpected "
        "keyword argument 'max_turnz' was raised from the environment creator for Judge-v0 with kwargs "
        "({'split': 'reference', 'max_turnz': 2})\n"
    )
    bogus = "cannot build the env: ValueError: split must be 'all' or 'reference', got 'bogus'"
    assert refusal("env.train_split=bogus") == f"chatgym cotrain: env.train_split: {bogus}\n"
    assert refusal("env.eval_split=bogus") == f"chatgym cotrain: env.eval_split: {bogus}\n"
    assert refusal("env.id=Math-v0", "env.train_split=train", "env.eval_split=test") == (
        "chatgym cotrain: cotrain.party: 'judge' answers through the env's judge= keyword, which env.id "
        "'Math-v0' does not take (Judge-v0 takes judge=, UserSim-v0 user=)\n"
    )
    # Fresh user: task indices outside their split failed every episode (cotrain.tasks) or sat silent
    # (cotrain.eval_task_ids), and a missing party model was a traceback, once the policy had loaded.
    assert refusal("cotrain.tasks=[3,999]") == (
        "chatgym cotrain: cotrain.tasks: [999] out of range for split 'reference' (30 tasks: 0..29)\n"
    )
    assert refusal("cotrain.eval_task_ids=[5,-1,30]") == (
        "chatgym cotrain: cotrain.eval_task_ids: [-1, 30] out of range for split 'reference' (30 tasks: 0..29)\n"
    )
    assert refusal("cotrain.model_path=/nonexistent").startswith(
        "chatgym cotrain: cotrain.model_path: model '/nonexistent' is neither"
    )


def test_chatgym_cotrain_with_an_engine_package_missing_is_one_line(tmp_path, monkeypatch, capsys):
    # Fresh user: without vLLM, engine.backend=vllm (examples/configs/cotrain_usersim.yaml's) was a
    # ModuleNotFoundError traceback from the start-up option check, status 1. vLLM is installed here,
    # so its import is blocked: it then fails as if missing.
    import sys

    from chatgym.trainer.cotrain import loop

    monkeypatch.setitem(sys.modules, "vllm", None)
    monkeypatch.setattr(loop, "CoTrainer", None)  # building one would fail the test
    out = tmp_path / "run"
    config = "examples/configs/cotrain_judge_cpu.yaml"
    assert loop.main([config, "engine.backend=vllm", "--output-dir", str(out)]) == 2
    assert capsys.readouterr().err.startswith("chatgym cotrain: VLLMEngine needs vLLM: ")
    assert not out.exists()


def test_every_example_cotrain_config_passes_the_env_check():
    from chatgym.trainer.cotrain.loop import check_party_env

    paths = sorted(Path("examples/configs").glob("cotrain_*.yaml"))
    assert len(paths) == 5
    for path in paths:
        check_party_env(*load_cotrain_config(path, []))  # a refusal raises ConfigError
