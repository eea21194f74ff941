"""Real training steps with SmolLM2-135M-Instruct on Math-v0 (CPU, slow): parameters move, the engine
holds the trainer's weights after each sync, and a run resumed from the step-2 checkpoint draws the
same step-3 batch (tasks and sampled tokens) as the uninterrupted run and ends at the same weights."""

from __future__ import annotations

import json

import pytest
import torch

pytestmark = pytest.mark.slow


def real_config(out, *extra: str):
    from chatgym.trainer.config.run import load_config

    return load_config(
        None,
        [
            "model.path=smollm2",
            "engine.backend=hf",
            "engine.dtype=float32",
            "env.id=Math-v0",
            "env.eval_tasks=0",
            "rollout.max_tokens=24",
            "rollout.max_response_tokens=24",
            "rollout.max_model_len=256",
            "train.max_steps=3",
            "train.prompts_per_step=2",
            "train.group_size=4",
            "train.micro_batch_size=4",
            "train.progress=false",
            "train.tensorboard=false",
            f"train.output_dir={out}",
            "optim.lr=1e-5",
            *extra,
        ],
    )


def run(cfg, resume=False):
    from train_helpers import record_collects

    from chatgym.trainer.train import Trainer

    trainer = Trainer(cfg, resume=resume)
    seen = record_collects(trainer)
    return trainer, seen


def test_real_steps_sync_and_resume(tmp_path):
    pytest.importorskip("reasoning_gym")
    from chatgym.trainer.models.packaged import load_model_path

    try:
        load_model_path("smollm2")
    except ModuleNotFoundError as exc:
        pytest.skip(str(exc))

    full, full_seen = run(real_config(tmp_path / "full", "train.save_every=1", "train.keep_checkpoints=3"))
    try:
        initial = {n: p.detach().clone() for n, p in full.learner.policy.named_parameters()}
        full.train()
        policy = dict(full.learner.policy.named_parameters())
        moved = [n for n, p in policy.items() if not torch.equal(initial[n], p)]
        assert len(moved) == len(policy), "every parameter of a full fine-tune moves"
        engine_model = full.engine.model
        for name, param in engine_model.named_parameters():
            assert torch.equal(param, policy[name]), name
        probe = full.tokenizer.apply_chat_template(
            [{"role": "user", "content": "What is 12 + 7?"}],
            add_generation_prompt=True,
            tokenize=True,
            return_dict=False,
        )
        with torch.no_grad():
            ids = torch.tensor([probe])
            torch.testing.assert_close(engine_model(ids).logits, full.learner.policy(ids).logits, rtol=0, atol=1e-5)
        final = {n: p.detach().clone() for n, p in policy.items()}
    finally:
        full.close()
    rows = [json.loads(line) for line in (tmp_path / "full" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert all(r["batch/trajectories"] == 8 and r["batch/failed"] == 0 for r in rows)

    resumed, resumed_seen = run(
        real_config(tmp_path / "resumed"), resume=tmp_path / "full" / "checkpoints" / "step_000002"
    )
    try:
        assert resumed.start_step == 2
        resumed.train()
        resumed_final = {n: p.detach().clone() for n, p in resumed.learner.policy.named_parameters()}
    finally:
        resumed.close()
    assert list(resumed_seen) == [2]
    assert [t.task_id for t in resumed_seen[2]] == [t.task_id for t in full_seen[2]]
    assert [t.token_ids for t in resumed_seen[2]] == [t.token_ids for t in full_seen[2]]
    for name, value in final.items():
        torch.testing.assert_close(resumed_final[name], value, rtol=0, atol=1e-6)
