"""The training loop's parts (batching, reward placement, logprobs, update, checkpoints, schedule,
task sampling) and two real steps of the loop on a tiny random-init Llama with the transformers
engine. Values are derived by hand in comments or checked against an independent computation."""

from __future__ import annotations

import copy
import json
import math

import pytest
import torch
from train_helpers import (
    LETTERS_ENV_ID,
    OUTCOMES_ENV_ID,
    TINY_LLAMA,
    file_size_limit,
    record_collects,
    register,
)

from chatgym.trainer.algos import get_advantage_estimator
from chatgym.trainer.config.run import AlgoConfig, OptimConfig, load_config
from chatgym.trainer.eval.scores import cell_metrics
from chatgym.trainer.learner.batch import (
    collate,
    micro_batches,
    shared_prefix_batches,
    shared_prompt_micro_batches,
)
from chatgym.trainer.learner.checkpoint import latest_checkpoint, load_trainer_state
from chatgym.trainer.learner.forward import ForwardPlan, forward_logprobs, forward_logprobs_shared
from chatgym.trainer.learner.logprobs import logits_to_keep, token_logprobs
from chatgym.trainer.learner.optim import lr_factor
from chatgym.trainer.learner.prepare import informative_groups, shape_rewards, token_rewards
from chatgym.trainer.learner.update import UpdateState, update
from chatgym.trainer.logging.step_metrics import held_out_scores
from chatgym.trainer.rollout.types import Trajectory, hit_budget
from chatgym.trainer.sampler import tasks_for_step


def traj(ids, mask, *, reward=0.0, rewards=None, group=0, finish=("stop",), **kw) -> Trajectory:
    return Trajectory(
        env_id="test",
        task_id=f"t{group}",
        group_id=group,
        token_ids=list(ids),
        loss_mask=list(mask),
        engine_logprobs=[-0.5 if m else 0.0 for m in mask],
        reward=reward,
        rewards=list(rewards if rewards is not None else [reward]),
        finish_reasons=list(finish),
        **kw,
    )




# ---------------------------------------------------------------------------------- batch + rewards


def test_collate_pads_right_and_never_trains_position_zero():
    batch = collate([traj([5, 6, 7], [1, 1, 1]), traj([1, 2, 3, 4, 9], [0, 0, 1, 1, 0])], pad_id=0)
    assert batch.input_ids.tolist() == [[5, 6, 7, 0, 0], [1, 2, 3, 4, 9]]
    assert batch.attention_mask.tolist() == [[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]]
    # Token 0 has no prefix to be predicted from, so it is dropped from the loss even if generated.
    assert batch.loss_mask.tolist() == [[False, True, True, False, False], [False, False, True, True, False]]
    assert batch.engine_logprobs.tolist() == [[-0.5, -0.5, -0.5, 0, 0], [0, 0, -0.5, -0.5, 0]]
    # select() drops columns that are padding for every selected row.
    assert batch.select([0]).input_ids.tolist() == [[5, 6, 7]]
    with pytest.raises(ValueError, match="token_ids has 2 entries but loss_mask has 1"):
        collate(
            [Trajectory(env_id="x", task_id=3, token_ids=[1, 2], loss_mask=[1], engine_logprobs=[0.0, 0.0])],
            0,
        )


def test_micro_batches_group_similar_lengths():
    assert micro_batches([3, 9, 5, 9, 1], 2) == [[1, 3], [2, 0], [4]]


def test_token_rewards_on_each_turns_last_token():
    # Two assistant turns (generated runs at 2-3 and 6); turn rewards [0.5, 1.0]; the shaped reward is
    # 1.3 (a -0.2 penalty), so the last generated token gets 1.0 + (1.3 - 1.5) = 0.8.
    t = traj(
        [1, 2, 3, 4, 5, 6, 7, 8],
        [0, 0, 1, 1, 0, 0, 1, 0],
        reward=1.5,
        rewards=[0.5, 1.0],
        finish=("stop", "stop"),
    )
    # A row with no generated token keeps its reward on its last real position (outcome estimators sum rows).
    empty = traj([1, 2, 3], [0, 0, 0], reward=2.0)
    batch = collate([t, empty], pad_id=0)
    out = token_rewards([t, empty], torch.tensor([1.3, 2.0]), batch)
    assert out[0].tolist() == pytest.approx([0, 0, 0, 0.5, 0, 0, 0.8, 0])
    assert out[1].tolist() == [0, 0, 2.0, 0, 0, 0, 0, 0]


def test_prepare_batch_logs_the_share_of_groups_with_equal_rewards():
    # TRL's frac_reward_zero_std: the groups that give a GRPO step no gradient. Groups 0 (1, 1) and 2
    # (one sample) have zero spread, group 1 (0, 1) has some: 2 of 3. Group 3's only trajectory
    # failed: not a group of the step. Dynamic sampling keeps group 1 only, the share is the same.
    from chatgym.trainer.learner.forward import ForwardPlan
    from chatgym.trainer.learner.prepare import prepare_batch

    trajs = [
        traj([3, 4, 5], [0, 1, 1], reward=1.0, group=0),
        traj([3, 4, 6], [0, 1, 1], reward=1.0, group=0),
        traj([3, 4, 7], [0, 1, 1], reward=0.0, group=1),
        traj([3, 4, 8], [0, 1, 1], reward=1.0, group=1),
        traj([3, 4, 9], [0, 1, 1], reward=0.5, group=2),
        traj([3, 4, 9], [0, 1, 1], reward=0.0, group=3, error="env crashed"),
    ]
    for dynamic, kept in ((False, 3), (True, 1)):
        _, metrics = prepare_batch(
            trajs, AlgoConfig(dynamic_sampling=dynamic), max_response_tokens=8, pad_id=0, policy=None,
            plan=ForwardPlan(micro_batch_size=8),
        )  # fmt: skip
        assert metrics["batch/frac_reward_zero_std"] == pytest.approx(2 / 3)
        assert metrics["batch/groups_kept"] == kept


def test_hit_budget_groups_and_reward_shaping():
    assert hit_budget(traj([1, 2], [0, 1], finish=("stop", "length")))
    assert not hit_budget(traj([1, 2], [0, 1], truncated=True, info={"truncated_by": "env"}))
    assert hit_budget(traj([1, 2], [0, 1], truncated=True, info={"truncated_by": "max_model_len"}))
    # Groups 0 (1, 1) and 2 (one sample) carry no signal; group 1 (0, 1) does.
    assert informative_groups([0, 0, 1, 1, 2], torch.tensor([1.0, 1.0, 0.0, 1.0, 5.0])) == [2, 3]
    # L_max 20, L_cache 4: 18 tokens -> (16 - 18)/4 = -0.5; a no-EOS completion also loses 0.25.
    algo = AlgoConfig(missing_eos_penalty=0.25, overlong_buffer=4)
    trajs = [
        traj([0] * 19, [0] + [1] * 18, reward=1.0),
        traj([0] * 11, [0] + [1] * 10, reward=1.0, finish=("length",)),
    ]
    assert shape_rewards(trajs, algo, max_response_tokens=20).tolist() == [0.5, 0.75]


# ----------------------------------------------------------------------------------------- logprobs


def test_token_logprobs_alignment_and_logits_to_keep(tiny_model):
    ids = torch.randint(0, 49152, (2, 9), generator=torch.Generator().manual_seed(1))
    mask = torch.zeros(2, 9, dtype=torch.bool)
    mask[0, 6:] = True
    mask[1, 4:8] = True
    with torch.no_grad():
        full = torch.log_softmax(tiny_model(ids).logits.float(), dim=-1)
        # Independent reference: token t's logprob comes from the logits at t-1.
        expected = torch.zeros(2, 9)
        expected[:, 1:] = full[:, :-1].gather(-1, ids[:, 1:, None]).squeeze(-1)
        lp, ent = token_logprobs(tiny_model(ids).logits, ids, with_entropy=True)
        # First trained position is 4, so 9 - 4 + 1 = 6 trailing positions of logits are enough.
        assert logits_to_keep(mask) == 6
        batch = collate([traj(ids[i].tolist(), mask[i].int().tolist()) for i in range(2)], pad_id=0)
        kept, _ = forward_logprobs(tiny_model, batch, with_entropy=False)
    torch.testing.assert_close(lp, expected, rtol=0, atol=1e-5)
    torch.testing.assert_close(kept[mask], expected[mask], rtol=0, atol=1e-5)
    categorical = torch.distributions.Categorical(logits=full[:, :-1]).entropy()
    torch.testing.assert_close(ent[:, 1:], categorical, rtol=0, atol=1e-4)


def test_token_logprobs_backward_writes_the_logits_gradient_once_not_once_a_row():
    """Regression (H200 profile of the vs-TRL update, 2026-12-06): each row's slice wrote a zero
    gradient as large as all the logits and autograd added it into theirs, 64 fills and 63 adds of
    (64, 130, 49152) bf16 a micro-batch. Now: the one slice of the logits' positions (a zero gradient,
    then its part copied in), no add; the gradients stay log_softmax's."""
    generator = torch.Generator().manual_seed(0)
    logits = torch.randn(8, 6, 50, generator=generator, requires_grad=True)
    ids = torch.randint(0, 50, (8, 6), generator=generator)
    lp, ent = token_logprobs(logits, ids, with_entropy=True)
    with torch.profiler.profile(record_shapes=True) as prof:
        (lp.sum() + ent.sum()).backward()
    full_size = [e.name for e in prof.events() if [8, 6, 50] in [list(s) for s in e.input_shapes if isinstance(s, list)]]
    assert (full_size.count("aten::zero_"), full_size.count("aten::add_")) == (1, 0)
    plain = logits.detach().clone().requires_grad_()
    ref = torch.log_softmax(plain[:, :-1], -1)
    (ref.gather(-1, ids[:, 1:, None]).sum() - (ref.exp() * ref).sum()).backward()
    torch.testing.assert_close(logits.grad, plain.grad, rtol=0, atol=1e-6)


def test_token_logprobs_takes_an_empty_batch_and_refuses_bad_sizes():
    """Fresh-user walk: an empty batch raised an IndexError from the default chunk size; chunk_rows 0
    or -1 gave torch's split errors; K = 0 returned T + 1 columns."""
    lp, ent = token_logprobs(torch.randn(0, 5, 9), torch.zeros(0, 5, dtype=torch.long), with_entropy=True)
    assert lp.shape == ent.shape == (0, 5)
    ids = torch.zeros(2, 5, dtype=torch.long)
    for rows in (0, -1):
        with pytest.raises(ValueError, match=f"chunk_rows must be >= 1, got {rows}"):
            token_logprobs(torch.randn(2, 5, 9), ids, chunk_rows=rows)
    with pytest.raises(ValueError, match="logits cover no position"):
        token_logprobs(torch.randn(2, 0, 9), ids)


# ------------------------------------------------------------------------------------------- update


def _update_batch(seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    trajs = []
    for i, (n_prompt, n_gen) in enumerate([(3, 4), (5, 2), (2, 6), (4, 3)]):
        ids = torch.randint(0, 49152, (n_prompt + n_gen,), generator=gen).tolist()
        trajs.append(traj(ids, [0] * n_prompt + [1] * n_gen, reward=float(i % 2), group=0))
    batch = collate(trajs, pad_id=0)
    batch.advantages = torch.where(batch.loss_mask, torch.tensor([[1.0], [-1.0], [0.5], [-0.5]]), 0.0)
    return batch


def _sgd_models(model, lr):
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    return UpdateState(model, opt, torch.optim.lr_scheduler.LambdaLR(opt, lambda _: 1.0))


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean"])
def test_update_gradient_accumulation_matches_one_big_batch(tiny_model, mode):
    # With global token/sequence counts, micro-batches of 1 and one micro-batch of 4 give the same
    # gradient, so plain SGD moves the weights identically.
    algo = AlgoConfig(loss_agg=mode, tis_cap=None)
    results = []
    for micro in (1, 4):
        model = copy.deepcopy(tiny_model)
        update(
            _sgd_models(model, 0.1),
            _update_batch(),
            algo,
            ForwardPlan(micro_batch_size=micro, device=torch.device("cpu")),
            max_grad_norm=None,
            generator=torch.Generator().manual_seed(0),
        )
        results.append(torch.cat([p.detach().flatten() for p in model.parameters()]))
    moved = (results[0] - torch.cat([p.detach().flatten() for p in tiny_model.parameters()])).abs().max()
    assert moved > 1e-4
    torch.testing.assert_close(results[0], results[1], rtol=0, atol=1e-6)


def _group_batch():
    """Two GRPO groups: 3 samples of prompt A (4 tokens), 2 of prompt B (6 tokens), then one lone row."""
    gen = torch.Generator().manual_seed(3)
    prompts = [
        torch.randint(0, 49152, (4,), generator=gen).tolist(),
        torch.randint(0, 49152, (6,), generator=gen).tolist(),
    ]
    trajs = []
    for group, n_gen in [(0, 5), (0, 2), (0, 4), (1, 3), (1, 6), (2, 3)]:
        prompt = prompts[group] if group < 2 else [7, 8, 9]
        ids = prompt + torch.randint(0, 49152, (n_gen,), generator=gen).tolist()
        trajs.append(traj(ids, [0] * len(prompt) + [1] * n_gen, group=group, prompt_len=len(prompt)))
    batch = collate(trajs, pad_id=0)
    batch.advantages = torch.where(
        batch.loss_mask, torch.tensor([[1.0], [-1.0], [0.5], [-0.5], [0.25], [2.0]]), 0.0
    )
    return batch


def test_shared_prefix_plan_groups_rows_by_prompt():
    batch = _group_batch()
    # Group 0 (rows 0-2, longest first: 0, 2, 1) in chunks of 2; group 1 (rows 4, 3); lone row 5 unshared.
    assert shared_prefix_batches(batch, 2) == [([0, 2], 4), ([1], 0), ([4, 3], 6), ([5], 0)]


def test_shared_prompt_micro_batches_merge_whole_groups():
    batch = _group_batch()
    # Lengths: rows 0-2 (prompt A, 4 tokens) 9, 6, 8; rows 3-4 (prompt B, 6 tokens) 9, 12; row 5: 6.
    # Chunks longest first: [4, 3] (12), [0, 2, 1] (9), [5] (6); merged while they fit in `size` rows.
    assert shared_prompt_micro_batches(batch, 4) == [([4, 3], 6), ([0, 2, 1, 5], 4)]
    assert shared_prompt_micro_batches(batch, 6) == [([4, 3, 0, 2, 1, 5], 6)]
    assert shared_prompt_micro_batches(batch, 1) == [([r], 0) for r in (4, 0, 3, 2, 1, 5)]


def test_shared_forward_of_several_groups_matches_plain_forwards(tiny_model):
    # One call over all groups (prompts of 4 and 6 tokens, a lone row, a row trained inside its
    # prompt) gives every trained token the plain forward's logprob and entropy.
    batch = _group_batch()
    batch.loss_mask[5, 2] = True  # row 5's prompt [7, 8, 9]: a trained prompt token shares nothing
    with torch.no_grad():
        plain, plain_ent = forward_logprobs(tiny_model, batch, with_entropy=True)
        order = [4, 3, 0, 2, 1, 5]
        mb = batch.select(order)
        shared, shared_ent = forward_logprobs_shared(tiny_model, mb, 6, with_entropy=True)
    mask = mb.loss_mask
    assert int(mask.sum()) == 5 + 2 + 4 + 3 + 6 + 3 + 1
    torch.testing.assert_close(
        shared[mask], plain[order][:, : mb.input_ids.shape[1]][mask], rtol=0, atol=1e-5
    )
    torch.testing.assert_close(
        shared_ent[mask], plain_ent[order][:, : mb.input_ids.shape[1]][mask], rtol=0, atol=1e-5
    )


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-sum"])
def test_shared_prefix_forward_gives_the_same_update(tiny_model, mode):
    # Forwarding a group's prompt once (KV cache repeated per sample) must not change logprobs or
    # gradients: compare the weights after one plain-SGD step with and without sharing.
    batch = _group_batch()
    with torch.no_grad():
        plain, _ = forward_logprobs(tiny_model, batch, with_entropy=False)
        group0 = batch.select([0, 1, 2])
        shared, _ = forward_logprobs_shared(tiny_model, group0, 4, with_entropy=False)
    torch.testing.assert_close(
        shared[group0.loss_mask],
        plain[[0, 1, 2]][:, : group0.input_ids.shape[1]][group0.loss_mask],
        rtol=0,
        atol=1e-5,
    )
    results = []
    for share, micro in ((False, 3), (True, 3), (True, 6)):
        model = copy.deepcopy(tiny_model)
        update(
            _sgd_models(model, 0.1),
            _group_batch(),
            AlgoConfig(loss_agg=mode, tis_cap=None),
            ForwardPlan(micro_batch_size=micro, device=torch.device("cpu"), share_prefix=share),
            max_grad_norm=None,
            generator=torch.Generator().manual_seed(0),
        )
        results.append(torch.cat([p.detach().flatten() for p in model.parameters()]))
    torch.testing.assert_close(results[0], results[1], rtol=0, atol=1e-6)
    torch.testing.assert_close(results[0], results[2], rtol=0, atol=1e-6)


def test_update_raises_positive_and_lowers_negative_advantage_sequences(tiny_model):
    model = copy.deepcopy(tiny_model)
    batch = _update_batch()
    with torch.no_grad():
        before, _ = forward_logprobs(model, batch, with_entropy=False)
    metrics = update(
        _sgd_models(model, 0.05),
        batch,
        AlgoConfig(),
        ForwardPlan(micro_batch_size=2, device=torch.device("cpu")),
        max_grad_norm=None,
        generator=torch.Generator().manual_seed(0),
    )
    with torch.no_grad():
        after, _ = forward_logprobs(model, batch, with_entropy=False)
    change = ((after - before) * batch.loss_mask).sum(dim=1)
    assert change[0] > 0 and change[2] > 0  # advantages +1, +0.5
    assert change[1] < 0 and change[3] < 0  # advantages -1, -0.5
    # Single update: old logprobs = current ones, so every ratio is exactly 1 and nothing is clipped.
    assert metrics["actor/ratio_max"] == 1.0 and metrics["actor/clip_frac"] == 0.0
    assert metrics["actor/optimizer_steps"] == 1
    assert all(math.isfinite(v) for v in metrics.values())


def test_gae_through_token_rewards():
    # End-to-end reward placement + GAE (gamma 1, lam 1, V = 0): every generated token's advantage is
    # the trajectory's reward to go: turn 1 tokens see 0.5 + 1.0, turn 2 tokens see 1.0.
    t = traj([1, 2, 3, 4, 5, 6], [0, 1, 1, 0, 1, 1], reward=1.5, rewards=[0.5, 1.0], finish=("stop", "stop"))
    batch = collate([t], pad_id=0)
    placed = token_rewards([t], torch.tensor([1.5]), batch)
    adv, _ = get_advantage_estimator("gae")(
        placed.double(),
        batch.loss_mask,
        values=torch.zeros(1, 6, dtype=torch.float64),
        gamma=1.0,
        lam=1.0,
        whiten=False,
    )
    assert adv.tolist() == [[0.0, 1.5, 1.5, 0.0, 1.0, 1.0]]


# --------------------------------------------------------------------------------- schedule, tasks


def test_lr_factor_warmup_then_linear_and_cosine():
    linear = OptimConfig(warmup_steps=2, schedule="linear")
    assert [lr_factor(s, 6, linear) for s in range(6)] == pytest.approx([0.5, 1.0, 1.0, 2 / 3, 1 / 3, 0.0])
    # cosine, min 0.1: progress p over 3 steps after warm-up -> 0.1 + 0.9 * (1 + cos(pi p)) / 2
    cosine = OptimConfig(warmup_steps=2, schedule="cosine", min_lr_ratio=0.1)
    expected = [0.5, 1.0, *[0.1 + 0.9 * (1 + math.cos(math.pi * p)) / 2 for p in (0, 1 / 3, 2 / 3, 1)][:4]]
    assert [lr_factor(s, 6, cosine) for s in range(6)] == pytest.approx(expected)


def test_tasks_for_step_is_a_pure_function_covering_each_epoch():
    steps = [tasks_for_step(s, 3, 5, seed=7) for s in range(5)]  # 15 draws = 3 epochs of 5 tasks
    flat = [i for s in steps for i in s]
    for epoch in range(3):
        assert sorted(flat[5 * epoch : 5 * epoch + 5]) == [0, 1, 2, 3, 4]
    assert tasks_for_step(3, 3, 5, seed=7) == steps[3]  # no state: a resumed run gets the same batch
    assert tasks_for_step(3, 3, 5, seed=8) != steps[3]


# ------------------------------------------------------------------------------------ the loop


def tiny_overrides(tmp_path, *extra: str, steps: int = 2) -> list[str]:
    """The overrides of :func:`tiny_config` (also a `chatgym train` command line); registers the env."""
    register()
    return [
        "model.random_init=true",
        "model.config_overrides=" + json.dumps(TINY_LLAMA),
        "engine.backend=hf",
        "engine.dtype=float32",
        f"env.id={LETTERS_ENV_ID}",
        "env.eval_tasks=3",
        "rollout.max_tokens=8",
        "rollout.max_response_tokens=8",
        "rollout.max_model_len=128",
        f"train.max_steps={steps}",
        "train.prompts_per_step=2",
        "train.group_size=4",
        "train.micro_batch_size=3",
        "train.trace_fraction=1.0",
        "train.progress=false",
        f"train.output_dir={tmp_path}",
        "optim.lr=1e-3",
        "algo.kl_coef=0.01",
        *extra,
    ]


def tiny_config(tmp_path, *extra: str, steps: int = 2):
    return load_config(None, tiny_overrides(tmp_path, *extra, steps=steps))


def test_two_training_steps_tiny_model(tmp_path, tiny_model):
    from chatgym.trainer.train import Trainer

    trainer = Trainer(tiny_config(tmp_path))
    try:
        initial = {n: p.detach().clone() for n, p in trainer.learner.policy.named_parameters()}
        summary = trainer.train()
        policy = dict(trainer.learner.policy.named_parameters())
        assert any(not torch.equal(initial[n], p) for n, p in policy.items()), "no parameter moved"
        # The engine holds exactly the trainer's weights after the last sync ...
        engine_model = trainer.engine.model
        for name, param in engine_model.named_parameters():
            assert torch.equal(param, policy[name]), name
        # ... so both give the same logits on a probe prompt.
        probe = torch.tensor(
            [
                trainer.tokenizer.apply_chat_template(
                    [{"role": "user", "content": "hi"}],
                    tokenize=True,
                    add_generation_prompt=True,
                    return_dict=False,
                )
            ]
        )
        with torch.no_grad():
            torch.testing.assert_close(
                engine_model(probe).logits, trainer.learner.policy(probe).logits, rtol=0, atol=1e-6
            )
    finally:
        trainer.close()

    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1, 2, 2]  # eval before, two steps, eval after
    for row in rows[1:3]:
        assert row["batch/trajectories"] == 8 and row["batch/failed"] == 0
        assert row["actor/optimizer_steps"] == 1
        assert row["actor/kl"] >= 0 and row["actor/entropy"] > 0
        assert all(v is None or math.isfinite(v) for v in row.values() if isinstance(v, float))
    assert rows[1]["actor/kl"] == pytest.approx(0.0, abs=1e-6)  # step 1 runs before any update
    assert (tmp_path / "learning_curve.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert list((tmp_path / "tensorboard").glob("events.out.tfevents.*"))
    assert len((tmp_path / "traces.jsonl").read_text().splitlines()) == 16
    ckpt = latest_checkpoint(tmp_path)
    assert ckpt is not None and ckpt.name == "step_000002" and load_trainer_state(ckpt)["step"] == 2
    assert summary["checkpoint"] == str(ckpt) and summary["eval_after"]["eval/tasks"] == 3


def test_resume_continues_with_the_same_batch_and_weights(tmp_path, tiny_model):
    from chatgym.trainer.train import Trainer

    # fp32: the resumed state is the whole contract here. In bf16 autocast (auto on an AVX-512 BF16
    # CPU) the two runs matched to 0.0 alone, but once differed by 3.4e-5 inside the full suite.
    def run(out, steps, resume):
        trainer = Trainer(
            tiny_config(out, "env.eval_tasks=0", "model.compute_dtype=float32", steps=steps), resume=resume
        )
        seen = record_collects(trainer)
        try:
            trainer.train()
            weights = {n: p.detach().clone() for n, p in trainer.learner.policy.named_parameters()}
        finally:
            trainer.close()
        return seen, weights

    full, full_weights = run(tmp_path / "full", 3, False)
    run(tmp_path / "split", 2, False)
    with pytest.raises(FileExistsError, match="--resume"):
        Trainer(tiny_config(tmp_path / "split", steps=3))
    resumed, resumed_weights = run(tmp_path / "split", 3, True)
    assert list(resumed) == [2]  # only step 3 (index 2) was run after resuming
    assert [t.task_id for t in resumed[2]] == [t.task_id for t in full[2]]
    assert [t.token_ids for t in resumed[2]] == [t.token_ids for t in full[2]]
    for name, value in full_weights.items():
        torch.testing.assert_close(resumed_weights[name], value, rtol=0, atol=1e-6)
    steps = [
        json.loads(line)["step"] for line in (tmp_path / "split" / "metrics.jsonl").read_text().splitlines()
    ]
    assert steps == [1, 2, 3]


def _held_out_run(out, steps, *extra):
    """A tiny run with the held-out evaluation (``env.eval_tasks`` 3), to ``steps``; a resume past step 1."""
    from chatgym.trainer.train import Trainer

    trainer = Trainer(tiny_config(out, "train.tensorboard=false", *extra, steps=steps), resume=steps > 1)
    try:
        return trainer.train()
    finally:
        trainer.close()


@pytest.fixture(scope="module")
def resumed_once(tmp_path_factory, tiny_model):
    """One held-out run of 1 step, then resumed to 2 with nothing changed: the summaries of both,
    ``summary.json`` as the resume left it, and the run's directory (a test may resume it further).
    The two tests below share these two runs (each ran the same two itself before)."""
    out = tmp_path_factory.mktemp("resumed_once")
    first = _held_out_run(out, 1)
    resumed = _held_out_run(out, 2)
    return first, resumed, (out / "summary.json").read_text(), out


def test_a_resumed_run_keeps_the_held_out_score_before_training(resumed_once, capsys):
    # Regression: the resumed run's summary.json had eval_before None ("held-out before: -"), though
    # the first run had logged it at step 0 of metrics.jsonl.
    from chatgym.trainer.train_cli import _print_summary

    first, resumed, summary_json, _ = resumed_once
    assert first["eval_before"]["eval/tasks"] == 3
    assert resumed["steps_run"] == 1 and resumed["eval_before"] == first["eval_before"]
    assert json.loads(summary_json)["eval_before"] == first["eval_before"]
    capsys.readouterr()
    _print_summary(resumed)
    before = [line for line in capsys.readouterr().out.splitlines() if "held-out before" in line]
    assert before == [f"  held-out before: score={first['eval_before']['eval/score']:.4g}"]


def test_a_resume_that_changes_the_held_out_evaluation_says_the_figures_are_not_comparable(resumed_once, capsys):
    # Regression (fresh-user walk): a resume with env.eval_split=train printed "held-out before" (the
    # first run's test split) and "held-out after" (the train split) with no word; only a change of
    # env.eval_tasks was flagged. The first run's config is what "before" was scored with.
    from chatgym.trainer.train_cli import _print_summary

    def printed(summary):
        capsys.readouterr()
        _print_summary(summary)
        return summary, [line for line in capsys.readouterr().out.splitlines() if "comparable" in line]

    first, resumed, _, out = resumed_once  # run(1), then run(2): a resume that changes nothing

    def run(steps, *extra):
        return printed(_held_out_run(out, steps, *extra))

    assert first["eval_changes"] == []
    summary, lines = printed(resumed)
    assert (summary["eval_changes"], lines) == ([], [])
    summary, lines = run(3, "env.eval_split=train")
    assert summary["eval_changes"] == ["env.eval_split"]
    assert lines == ["  (not comparable: env.eval_split changed between the run and its resume)"]
    summary, lines = run(4)  # back to the first run's split: comparable again, though the last config differed
    assert (summary["eval_changes"], lines) == ([], [])


def test_a_resume_with_a_changed_config_says_so_and_keeps_the_old_config(tmp_path, tiny_model, capsys):
    # Regression (a fresh user, README section 2): the resume command left out the first run's
    # algo.kl_coef=0.01 override, trained on without KL and overwrote config.yaml without a word.
    import yaml

    from chatgym.trainer.train import Trainer

    def run(steps, resume, *extra):
        trainer = Trainer(tiny_config(tmp_path, "env.eval_tasks=0", *extra, steps=steps), resume=resume)
        try:
            trainer.train()
        finally:
            trainer.close()

    run(1, False)
    first = (tmp_path / "config.yaml").read_text()
    run(2, True)  # only train.max_steps differs: nothing said, nothing kept
    assert "differs" not in capsys.readouterr().err and not list(tmp_path.glob("config.until_step_*"))
    run(3, True, "algo.kl_coef=0.0", "optim.lr=0.002")
    kept = tmp_path / "config.until_step_2.yaml"
    lines = [line for line in capsys.readouterr().err.splitlines() if "differs" in line]
    assert lines == [
        f"chatgym: resuming at step 2 with a config that differs from {tmp_path / 'config.yaml'}: "
        f"algo.kl_coef: 0.01 -> 0.0; optim.lr: 0.001 -> 0.002 (the steps from here use the new values; "
        f"the old config is kept in {kept})"
    ]
    assert kept.read_text() == first.replace("max_steps: 1", "max_steps: 2")
    assert yaml.safe_load((tmp_path / "config.yaml").read_text())["algo"]["kl_coef"] == 0.0


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_training_steps_on_cuda_in_bf16(tmp_path, tiny_model, monkeypatch):
    import chatgym.trainer.learner.learner as role
    from chatgym.trainer.train import Trainer

    # The update (forward and backward) runs without SDPA's cuDNN backend, which plans per new shape;
    # the flag is the process's again after it.
    cudnn_in_update = []
    plain_update = role.update

    def update(*args, **kwargs):
        cudnn_in_update.append(torch.backends.cuda.cudnn_sdp_enabled())
        return plain_update(*args, **kwargs)

    monkeypatch.setattr(role, "update", update)
    torch.backends.cuda.enable_cudnn_sdp(True)

    # fp32 master weights, bf16 autocast, gradient checkpointing, a bf16 engine on the same GPU.
    cfg = tiny_config(
        tmp_path,
        "model.device=cuda",
        "model.gradient_checkpointing=true",
        "engine.dtype=bfloat16",
        "env.eval_tasks=0",
    )
    trainer = Trainer(cfg)
    try:
        assert trainer.learner.device.type == "cuda"
        initial = {n: p.detach().clone() for n, p in trainer.learner.policy.named_parameters()}
        trainer.train()
        policy = dict(trainer.learner.policy.named_parameters())
        assert any(not torch.equal(initial[n], p) for n, p in policy.items())
        for name, param in trainer.engine.model.named_parameters():
            assert param.dtype == torch.bfloat16
            assert torch.equal(param, policy[name].detach().to(torch.bfloat16)), name
        assert cudnn_in_update == [False, False] and torch.backends.cuda.cudnn_sdp_enabled()
    finally:
        trainer.close()
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]
    assert all(math.isfinite(r["actor/grad_norm"]) and r["actor/entropy"] > 0 for r in rows)


def test_ppo_with_critic_and_several_updates(tmp_path, tiny_model):
    from chatgym.trainer.train import Trainer

    cfg = tiny_config(
        tmp_path,
        "model.value_head=true",
        "algo.advantage=gae",
        "algo.ppo_epochs=2",
        "algo.mini_batches=2",
        "algo.kl_in_reward=true",
        "algo.kl_estimator=k1",
        "env.eval_tasks=0",
        steps=1,
    )
    trainer = Trainer(cfg)
    try:
        critic_before = {n: p.detach().clone() for n, p in trainer.learner.critic.named_parameters()}
        trainer.train()
        assert any(not torch.equal(critic_before[n], p) for n, p in trainer.learner.critic.named_parameters())
    finally:
        trainer.close()
    (row,) = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    # 2 epochs x 2 mini-batches = 4 optimizer steps; after the first, ratios leave 1.
    assert row["actor/optimizer_steps"] == 4
    assert row["actor/ratio_max"] > 1.0
    for key in ("critic/value_loss", "critic/grad_norm", "critic/clip_frac", "reward/kl_penalty"):
        assert math.isfinite(row[key]), key
    assert (tmp_path / "checkpoints" / "step_000001" / "critic" / "config.json").is_file()


def test_lora_policy_syncs_merged_weights(tmp_path, tiny_model):
    from chatgym.trainer.learner.policy import export_weights
    from chatgym.trainer.train import Trainer

    cfg = tiny_config(tmp_path, "lora.enabled=true", "lora.r=4", "optim.lr=1e-2", "env.eval_tasks=0", steps=1)
    trainer = Trainer(cfg)
    try:
        base_before = {n: p.detach().clone() for n, p in export_weights(trainer.learner.policy)}
        trainer.train()
        merged = dict(export_weights(trainer.learner.policy))
        engine = dict(trainer.engine.model.named_parameters())
        assert set(merged) == set(engine)
        for name, value in merged.items():
            assert torch.equal(engine[name], value), name
        # Only adapters train: the merged q_proj moved, the (un-adapted) embedding did not.
        q = "model.layers.0.self_attn.q_proj.weight"
        assert not torch.equal(merged[q], base_before[q])
        assert torch.equal(merged["model.embed_tokens.weight"], base_before["model.embed_tokens.weight"])
        # The KL reference is the base model with adapters off, not a copy.
        assert (
            trainer.learner.reference.adapters_off
            and trainer.learner.reference.model is trainer.learner.policy
        )
    finally:
        trainer.close()
    assert (tmp_path / "checkpoints" / "step_000001" / "policy" / "adapter_config.json").is_file()


@pytest.mark.parametrize("freeze", [True, False])
def test_training_steps_run_with_the_start_up_heap_frozen(tmp_path, tiny_model, monkeypatch, freeze):
    """train.gc_freeze: the steps see the objects alive at start frozen (gc.get_freeze_count() > 0)
    and train() leaves the collector as it found it (0 frozen); off, nothing is ever frozen."""
    import gc

    from chatgym.trainer.train import Trainer

    gc.unfreeze()  # another test may have left objects frozen
    trainer = Trainer(
        tiny_config(tmp_path, f"train.gc_freeze={str(freeze).lower()}", "env.eval_tasks=0", steps=1)
    )
    frozen_in_step = []
    train_on = trainer.learner.train_on
    monkeypatch.setattr(
        trainer.learner, "train_on", lambda t: frozen_in_step.append(gc.get_freeze_count()) or train_on(t)
    )
    try:
        trainer.train()
    finally:
        trainer.close()
    assert len(frozen_in_step) == 1
    assert (frozen_in_step[0] > 0) is freeze
    assert gc.get_freeze_count() == 0


def test_frozen_gc_leaves_a_callers_freeze_in_place():
    import gc

    from chatgym.trainer.train import frozen_gc

    gc.unfreeze()
    gc.freeze()
    before = gc.get_freeze_count()
    assert before > 0
    try:
        with frozen_gc():
            assert gc.get_freeze_count() > before // 2
        # Not unfrozen (that would make it 0): the caller froze first. Frozen objects are still freed
        # by reference counting, so a daemon thread left by an earlier test may lower the count by a
        # few (seen: 538,426 -> 538,424); ">= before" failed then.
        assert gc.get_freeze_count() > before // 2
    finally:
        gc.unfreeze()
    assert gc.get_freeze_count() == 0


def test_a_failed_background_redraw_is_reported_at_the_end(tmp_path, tiny_model, monkeypatch, capsys):
    """The run goes on when a redraw of the curve fails (a child process draws it); the user hears of
    it once, at the end (draw_errors was kept but never shown)."""
    from chatgym.trainer.logging.writer import MetricsLogger
    from chatgym.trainer.train import Trainer

    def failing(self):
        self.draw_errors.append("OSError: [Errno 28] No space left on device")

    monkeypatch.setattr(MetricsLogger, "_draw_in_child", failing)
    trainer = Trainer(tiny_config(tmp_path, steps=1))
    try:
        trainer.train()
    finally:
        trainer.close()
    err = capsys.readouterr().err
    assert (
        "chatgym: 1 background redraw(s) of the learning curve failed; the last: "
        "OSError: [Errno 28] No space left on device\n"
    ) in err
    assert (tmp_path / "learning_curve.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"  # drawn at the end


def _engine_out_of_memory(trainer, monkeypatch):
    """Every generate of ``trainer``'s engine raises what torch raises when the GPU is full, while
    ``failing["on"]`` is true (the error the concurrent recipe runs hit on the H200)."""
    failing = {"on": True}
    real = trainer.engine.generate

    async def generate(*args, **kwargs):
        if failing["on"]:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.81 GiB.")
        return await real(*args, **kwargs)

    monkeypatch.setattr(trainer.engine, "generate", generate)
    return failing


OOM_ERROR = "engine_error: OutOfMemoryError: CUDA out of memory. Tried to allocate 2.81 GiB."


def all_failed_line(step: int) -> str:
    """The warning of a step of 8 episodes that all failed with :func:`_engine_out_of_memory`'s error."""
    return f"chatgym: step {step}: all 8 episodes failed, nothing was trained (8 of them: {OOM_ERROR})"


def failed_step_warnings(err: str) -> list[str]:
    return [line for line in err.splitlines() if "episodes failed" in line]


def test_a_run_whose_every_episode_fails_stops_after_max_failed_steps(
    tmp_path, tiny_model, monkeypatch, capsys
):
    """Regression: a run whose engine was out of GPU memory went on for 10 steps, each logging 'all
    128 episodes failed', and evaluated a model that never trained. Now the second such step in a
    row (train.max_failed_steps=2) stops the run with the step's error. Regression: the stopping
    step's warning was printed as well as carried by the error (twice on `chatgym train`'s stderr)."""
    from chatgym.trainer.train import Trainer, TrainingStalled

    trainer = Trainer(tiny_config(tmp_path, "train.max_failed_steps=2", "env.eval_tasks=0", steps=5))
    _engine_out_of_memory(trainer, monkeypatch)
    try:
        with pytest.raises(TrainingStalled) as err:
            trainer.train()
    finally:
        trainer.close()
    assert str(err.value) == (
        "2 steps in a row had every episode fail (train.max_failed_steps=2); stopping. "
        f"The last: step 2: all 8 episodes failed, nothing was trained (8 of them: {OOM_ERROR})"
    )
    assert failed_step_warnings(capsys.readouterr().err) == [all_failed_line(1)]  # step 2's is the error's
    assert trainer.learner.version == 0
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1]  # step 0's row; step 1 raised before its row was logged
    assert rows[0]["batch/failed"] == rows[0]["batch/trajectories"] == 8


def test_a_step_with_an_episode_that_did_not_fail_resets_the_failed_count(
    tmp_path, tiny_model, monkeypatch, capsys
):
    from chatgym.trainer.train import Trainer, TrainingStalled

    trainer = Trainer(tiny_config(tmp_path, "train.max_failed_steps=2", "env.eval_tasks=0", steps=5))
    failing = _engine_out_of_memory(trainer, monkeypatch)
    try:
        trainer.step(0)
        assert trainer.failed_steps_in_a_row == 1
        failing["on"] = False
        trainer.step(1)
        assert trainer.failed_steps_in_a_row == 0 and trainer.learner.version == 1
        failing["on"] = True
        trainer.step(2)
        assert trainer.failed_steps_in_a_row == 1
        with pytest.raises(TrainingStalled):
            trainer.step(3)
        assert trainer.failed_steps_in_a_row == 2 and trainer.learner.version == 1
    finally:
        trainer.close()
    # Steps 0 and 2 (numbered 1 and 3, as metrics.jsonl numbers them) warned and went on; step 3
    # raised instead (its warning is the error's).
    assert failed_step_warnings(capsys.readouterr().err) == [all_failed_line(1), all_failed_line(3)]


def test_a_step_where_some_episodes_fail_says_so_and_trains_on_the_rest(tmp_path, tiny_model, monkeypatch, capsys):
    """Regression: a step whose episodes partly failed trained on the rest and only ``batch/failed``
    said so. The engine here fails its first 3 generate calls: 3 of the step's 8 one-turn episodes."""
    from chatgym.trainer.train import Trainer

    trainer = Trainer(tiny_config(tmp_path, "env.eval_tasks=0", steps=1))
    calls = {"n": 0}
    real = trainer.engine.generate

    async def generate(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] <= 3:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.81 GiB.")
        return await real(*args, **kwargs)

    monkeypatch.setattr(trainer.engine, "generate", generate)
    try:
        row = trainer.step(0)
    finally:
        trainer.close()
    assert failed_step_warnings(capsys.readouterr().err) == [
        f"chatgym: step 1: 3 of 8 episodes failed and were left out of the update (3 of them: {OOM_ERROR})"
    ]
    assert row["batch/failed"] == 3 and trainer.learner.version == 1


def test_held_out_evaluation_counts_a_failed_episode_as_a_miss_as_the_leaderboard_does(tmp_path, tiny_model):
    """Regression: eval/score and eval/accuracy were over the episodes that did not fail (here 0.75 and
    0.5), so a model whose evaluation episodes crash looked better. The four tasks, whatever the model
    writes: reward 1 and success; reward 0.5 and no success; a crash at reset; reward 0.25 on turn 1,
    then a crash on turn 2 (the leaderboard keeps the reward a failed episode had earned)."""
    from chatgym.trainer.train import Trainer

    outcomes = (f"env.id={OUTCOMES_ENV_ID}", "env.eval_tasks=4", "rollout.max_response_tokens=64")
    trainer = Trainer(tiny_config(tmp_path, *outcomes))
    trajs = []
    collect = trainer.rollout.collect

    async def recording(request):
        trajs.extend(await collect(request))
        return trajs

    trainer.rollout.collect = recording
    try:
        metrics = trainer.evaluate()
    finally:
        trainer.close()
    trajs.sort(key=lambda t: t.group_id)  # group g: task g
    # The episodes as they really ran (the second crash came on turn 2, after its turn-1 reward).
    assert [(t.reward, t.success, t.error) for t in trajs] == [
        (1.0, True, None),
        (0.5, False, None),
        (0.0, None, "env_error: RuntimeError: the env crashed at reset"),
        (0.25, None, "env_error: RuntimeError: the env crashed on turn 2"),
    ]
    assert (metrics["eval/score"], metrics["eval/accuracy"]) == ((1.0 + 0.5 + 0.0 + 0.25) / 4, 1 / 4)
    assert (metrics["eval/failed"], metrics["eval/tasks"]) == (2, 4)
    # The leaderboard's figures of the same episodes.
    rows = [
        {"task_index": t.group_id, "reward": t.reward, "success": int(bool(t.success) and not t.failed),
         "turns": t.num_turns, "generated_tokens": None, "tool_calls": 0, "tool_errors": 0, "failed": int(t.failed)}
        for t in trajs
    ]  # fmt: skip
    cell = cell_metrics(rows)
    assert (cell.mean_reward, cell.pass_at_1) == (metrics["eval/score"], metrics["eval/accuracy"])


def test_held_out_accuracy_is_absent_only_where_the_env_states_no_success():
    def episode(reward, success=None, error=None):
        return Trajectory(env_id="E-v0", task_id=0, reward=reward, success=success, error=error)

    crashed = episode(0.0, error="env_error: RuntimeError: boom")
    # Every episode failed: every one a miss.
    assert held_out_scores([crashed, crashed]) == {"eval/score": 0.0, "eval/accuracy": 0.0}
    # A rated env (no success): the failed episode counts in the score only.
    assert held_out_scores([episode(0.75), crashed]) == {"eval/score": 0.375}
    assert held_out_scores([]) == {"eval/score": 0.0}


def test_max_failed_steps_zero_never_stops_and_a_negative_one_is_refused(
    tmp_path, tiny_model, monkeypatch, capsys
):
    from chatgym.trainer.train import Trainer

    trainer = Trainer(tiny_config(tmp_path, "train.max_failed_steps=0", "env.eval_tasks=0", steps=3))
    _engine_out_of_memory(trainer, monkeypatch)
    try:
        summary = trainer.train()
    finally:
        trainer.close()
    assert summary["steps_run"] == 3 and trainer.failed_steps_in_a_row == 3
    # Once each: no step stopped the run.
    assert failed_step_warnings(capsys.readouterr().err) == [all_failed_line(s) for s in (1, 2, 3)]
    with pytest.raises(ValueError, match=r"^train.max_failed_steps must be >= 0, got -1$"):
        tiny_config(tmp_path, "train.max_failed_steps=-1")


def test_chatgym_train_on_a_disk_that_refuses_the_checkpoint_prints_one_line_and_returns_1(
    tmp_path, tiny_model, monkeypatch, capsys
):
    """Regression: a full disk at the checkpoint save ended `chatgym train` with safetensors' raw
    traceback. The save runs under a real 1 MB file size limit (RLIMIT_FSIZE, SIGXFSZ ignored: the
    write fails with EFBIG as it would with ENOSPC): one `chatgym train:` line naming the checkpoint,
    rc 1, no partial checkpoint, the trainer closed."""
    import chatgym.trainer.train as train_module
    from chatgym.trainer.train_cli import main

    closed = []

    class DiskFullTrainer(train_module.Trainer):
        def save(self, steps_done):
            with file_size_limit(1_000_000):
                return super().save(steps_done)

        def close(self):
            closed.append(True)
            super().close()

    monkeypatch.setattr(train_module, "Trainer", DiskFullTrainer)  # train_cli imports it at run time
    out = tmp_path / "run"
    rc = main(tiny_overrides(out, "env.eval_tasks=0", "train.save_every=1", steps=2))
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("chatgym train:")]
    assert rc == 1 and closed == [True]
    assert len(err) == 1 and err[0].startswith(
        f"chatgym train: could not write checkpoint {out / 'checkpoints' / 'step_000001'}: File too large ("
    )
    assert err[0].endswith(" GB free on that disk; no earlier checkpoint)")
    assert list((out / "checkpoints").iterdir()) == []


def test_chatgym_train_on_a_run_whose_every_episode_fails_prints_one_line_and_returns_1(
    tmp_path, tiny_model, monkeypatch, capsys
):
    """`chatgym train` (trainer/train_cli.py's main) on a stalled run: rc 1, the error in one
    `chatgym train:` line, the stopping step's warning not printed a second time, the trainer closed."""
    import chatgym.trainer.train as train_module
    from chatgym.trainer.train_cli import main

    closed = []

    class OutOfMemoryTrainer(train_module.Trainer):  # the CLI's Trainer, its engine out of GPU memory
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            _engine_out_of_memory(self, monkeypatch)

        def close(self):
            closed.append(True)
            super().close()

    monkeypatch.setattr(train_module, "Trainer", OutOfMemoryTrainer)  # train_cli imports it at run time
    rc = main(tiny_overrides(tmp_path / "run", "train.max_failed_steps=2", "env.eval_tasks=0", steps=5))
    captured = capsys.readouterr()
    assert rc == 1 and closed == [True]
    error = (
        "chatgym train: 2 steps in a row had every episode fail (train.max_failed_steps=2); stopping. "
        f"The last: step 2: all 8 episodes failed, nothing was trained (8 of them: {OOM_ERROR})"
    )
    assert [line for line in captured.err.splitlines() if line.startswith("chatgym train:")] == [error]
    # Step 1's warning, then step 2's inside the error only (it was printed twice).
    assert failed_step_warnings(captured.err) == [all_failed_line(1), error]
    assert captured.out == ""  # no summary
