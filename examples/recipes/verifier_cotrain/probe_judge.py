"""Can a SmolLM2-135M judge learn to check an arithmetic answer against its reference? A CPU probe
of the judge's side of verifier co-training, without the policy and without the engines.

Each step takes 8 train tasks of Judge-v0's arithmetic questions and rates two answers to each, the
gold (reference rating 10, scored here as 9: see below) and another task's gold (1), through the
judge's real prompt (``rubric_prompt``, the chat template, the ``Rating: [[`` prefill). The action is
the first token after the prefill, restricted to the digits 1..9 (``"10"`` starts with the token
``"1"``, so the probe's top rating is 9); the reward is agreement ``1 - |r - r_ref| / 8``.

* ``--mode grpo``: ``--group`` sampled ratings a prompt, the trainer's GRPO advantages per group
  (:func:`~chatgym.trainer.algos.advantages.grpo_advantages`, arXiv:2402.03300), loss
  ``-mean(A * log p)``; one forward a prompt serves its group.
* ``--mode exact``: the expected agreement's exact gradient over the digit distribution (no sampling).

Held-out every 10 steps: greedy agreement on the first ``--eval-tasks`` test tasks (gold and the next
task's gold each), the distinct greedy ratings, and the mean rating of right and wrong answers.
What it leaves out: answers in the policy's own words, a reply that is not a digit (the real run
scores it 0), and the second token of ``"10"``. ~13 s a step on 2 cores.

    python examples/recipes/verifier_cotrain/probe_judge.py --mode grpo --seed 0 --steps 50
"""

from __future__ import annotations

import argparse
import random
import time

import torch


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mode", choices=("grpo", "exact"), default="grpo")
    parser.add_argument("--lr", type=float, default=1e-5)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--group", type=int, default=8)
    parser.add_argument("--eval-tasks", type=int, default=50)
    args = parser.parse_args()

    from transformers import AutoModelForCausalLM, AutoTokenizer

    from chatgym.envs.judge.arithmetic import load_arithmetic
    from chatgym.envs.judge.env import rubric_prompt
    from chatgym.trainer.algos.advantages import grpo_advantages
    from chatgym.trainer.models.packaged import load_model_path

    torch.manual_seed(args.seed)
    path = load_model_path("smollm2")
    tok = AutoTokenizer.from_pretrained(path)
    tok.padding_side = "left"
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    train, test = load_arithmetic("train"), load_arithmetic("test", args.eval_tasks)
    digits = torch.tensor([tok.encode(str(d), add_special_tokens=False)[0] for d in range(1, 10)])

    def text(task: dict, answer: str) -> str:
        messages = [{"role": "user", "content": rubric_prompt(task, [f"<answer>{answer}</answer>"])}]
        return tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True) + "Rating: [["

    def pairs(tasks: list[dict], rows: list[dict]) -> list[tuple[str, float]]:
        out = []
        for task in tasks:
            other = rows[(rows.index(task) + 1) % len(rows)]["reference"][0]
            out.append((text(task, task["reference"][0]), 9.0))
            if other != task["reference"][0]:
                out.append((text(task, other), 1.0))
        return out

    def logp(texts: list[str]) -> torch.Tensor:
        batch = tok(texts, return_tensors="pt", padding=True, add_special_tokens=False)
        return torch.log_softmax(model(**batch).logits[:, -1][:, digits].float(), -1)

    held = pairs(test, test)
    ratings = torch.arange(1, 10).float()

    def evaluate() -> str:
        model.eval()
        with torch.no_grad():
            lp = torch.cat([logp([h[0] for h in held[i : i + 20]]) for i in range(0, len(held), 20)])
        model.train()
        ref = torch.tensor([h[1] for h in held])
        greedy = lp.argmax(-1).float() + 1
        mean = (lp.exp() * ratings).sum(-1)
        return (
            f"held-out greedy agreement {(1 - (greedy - ref).abs() / 8).mean():.4f} "
            f"distinct {len(set(greedy.tolist()))} mean rating right {mean[ref == 9].mean():.3f} "
            f"wrong {mean[ref == 1].mean():.3f}"
        )

    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0)
    rng = random.Random(args.seed)
    start = time.time()
    print(f"step 0 {evaluate()} ({len(held)} held-out prompts)", flush=True)
    for step in range(1, args.steps + 1):
        batch = pairs(rng.sample(train, 8), train)
        lp = logp([b[0] for b in batch])
        ref = torch.tensor([b[1] for b in batch])
        if args.mode == "exact":
            agreement = 1 - (ratings[None, :] - ref[:, None]).abs() / 8
            loss = -(lp.exp() * agreement).sum(-1).mean()
            sampled = -loss.item()
        else:
            with torch.no_grad():
                samples = torch.multinomial(lp.exp(), args.group, replacement=True)
                reward = 1 - ((samples.float() + 1) - ref[:, None]).abs() / 8
                groups = torch.arange(len(batch)).repeat_interleave(args.group)
                flat = grpo_advantages(reward.reshape(-1, 1), torch.ones(reward.numel(), 1), group_ids=groups)
                advantage = flat.advantages[:, 0].reshape(reward.shape)
            loss = -(advantage * lp.gather(1, samples)).mean()
            sampled = reward.mean().item()
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if step % 10 == 0:
            print(f"step {step} train agreement {sampled:.3f} {evaluate()} {time.time() - start:.0f}s", flush=True)


if __name__ == "__main__":
    main()
