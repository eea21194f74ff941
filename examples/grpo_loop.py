"""Write your own training loop: GRPO on Math-v0 in ~60 lines, from the collector and the algorithms.

This is what ``chatgym train`` does, without the config, checkpoints, metrics and evaluation — read it
top to bottom. The engine is the transformers one, sharing the policy's weights (so there is no weight
sync to do); swap in ``make_engine("vllm", ...)`` and call ``engine.update_weights(...)`` after each
optimizer step for speed.

    python examples/grpo_loop.py --steps 3
"""

from __future__ import annotations

import argparse
import asyncio

import torch

import chatgym  # noqa: F401  (registers the env ids)
from chatgym.trainer.algos import aggregate_loss, get_advantage_estimator, get_policy_loss, place_rewards
from chatgym.trainer.chat.tokenizer import get_tokenizer
from chatgym.trainer.engines.hf import TransformersEngine
from chatgym.trainer.learner.batch import collate
from chatgym.trainer.learner.logprobs import token_logprobs
from chatgym.trainer.models.packaged import load_model
from chatgym.trainer.rollout.collector import Collector, RolloutConfig


def main(steps: int, prompts: int, group_size: int) -> None:
    torch.manual_seed(0)
    tokenizer = get_tokenizer("smollm2")
    policy = load_model("smollm2").train()  # fp32 weights, CPU
    engine = TransformersEngine(policy, tokenizer)  # generates with the very same weights
    collector = Collector(
        engine, tokenizer, RolloutConfig(max_tokens=48, max_response_tokens=48, temperature=1.0)
    )
    optimizer = torch.optim.AdamW(policy.parameters(), lr=2e-6)
    advantage_fn, loss_fn = get_advantage_estimator("grpo"), get_policy_loss("clip_higher")

    for step in range(steps):
        # 1. Rollouts: `prompts` tasks of the train split, `group_size` samples each (one GRPO group per task).
        tasks = list(range(step * prompts, (step + 1) * prompts))
        with torch.no_grad():
            trajectories = asyncio.run(
                collector.collect("Math-v0", tasks, group_size, env_kwargs={"split": "train"})
            )
        # 2. Rewards -> group-normalised advantages on every generated token.
        batch = collate(trajectories, pad_id=tokenizer.pad_token_id)
        rewards = torch.tensor([t.reward for t in trajectories])
        token_rewards = place_rewards(rewards, batch.loss_mask)
        group_ids = torch.tensor([t.group_id for t in trajectories])
        advantages, _ = advantage_fn(token_rewards, batch.loss_mask, group_ids=group_ids)
        # 3. One policy-gradient step: logprobs of the sampled tokens under the current weights.
        logits = policy(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits
        logprobs, _ = token_logprobs(logits, batch.input_ids)
        out = loss_fn(logprobs, logprobs.detach(), advantages, batch.loss_mask)  # on-policy: ratio 1
        loss = aggregate_loss(out.loss, batch.loss_mask, "token-mean")
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(policy.parameters(), 1.0)
        optimizer.step()
        print(
            f"step {step + 1}: reward {rewards.mean():.3f}, loss {loss.item():+.4f}, tokens {int(batch.loss_mask.sum())}"
        )
    collector.close()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--group-size", type=int, default=4)
    args = parser.parse_args()
    main(args.steps, args.prompts, args.group_size)
