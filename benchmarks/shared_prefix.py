"""Forward+backward of one GRPO group: every sample forwarded with its prompt (plain) vs the prompt
forwarded once and its KV cache shared (``forward_logprobs_shared``). SmolLM2-135M, fp32, CPU.

    python benchmarks/shared_prefix.py --group 8 --prompt 60 --completion 40 --repeats 4

Alternates the two (paired runs, a busy shared machine drifts) and prints both medians and the ratio.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from chatgym.trainer.learner.batch import collate
from chatgym.trainer.learner.forward import forward_logprobs, forward_logprobs_shared
from chatgym.trainer.models.packaged import load_model
from chatgym.trainer.rollout.types import Trajectory


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--group", type=int, default=8)
    parser.add_argument("--prompt", type=int, default=60)
    parser.add_argument("--completion", type=int, default=40)
    parser.add_argument("--repeats", type=int, default=4)
    args = parser.parse_args()

    model = load_model("smollm2").train()
    gen = torch.Generator().manual_seed(0)
    prompt = torch.randint(0, 49152, (args.prompt,), generator=gen).tolist()
    trajectories = []
    for _ in range(args.group):
        ids = prompt + torch.randint(0, 49152, (args.completion,), generator=gen).tolist()
        mask = [0] * args.prompt + [1] * args.completion
        trajectories.append(
            Trajectory(
                env_id="bench",
                task_id=0,
                token_ids=ids,
                loss_mask=mask,
                engine_logprobs=[0.0] * len(ids),
                prompt_len=args.prompt,
            )
        )
    batch = collate(trajectories, pad_id=0)

    def once(shared: bool) -> float:
        t0 = time.perf_counter()
        if shared:
            logprobs, _ = forward_logprobs_shared(model, batch, args.prompt, with_entropy=True)
        else:
            logprobs, _ = forward_logprobs(model, batch, with_entropy=True)
        (logprobs * batch.loss_mask).sum().backward()
        model.zero_grad(set_to_none=True)
        return time.perf_counter() - t0

    once(False), once(True)  # warm-up
    times: dict[bool, list[float]] = {False: [], True: []}
    for _ in range(args.repeats):
        for shared in (False, True):
            times[shared].append(once(shared))
    plain, shared = statistics.median(times[False]), statistics.median(times[True])
    tokens_plain = args.group * (args.prompt + args.completion)
    tokens_shared = args.prompt + args.group * args.completion
    print(f"plain:  {plain:.2f} s ({tokens_plain} tokens forwarded)")
    print(f"shared: {shared:.2f} s ({tokens_shared} tokens forwarded)")
    print(f"ratio plain/shared: {plain / shared:.2f}x")


if __name__ == "__main__":
    main()
