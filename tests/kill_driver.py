"""The driver the kill -9 tests start and kill: one ``trainer.pipeline: async`` run on a real local Ray
cluster (two rollout workers with scripted engines, one learner with the tiny random-init Llama),
from nothing or resumed from its newest checkpoint.

    python tests/kill_driver.py OUT MAX_STEPS MAX_STALENESS SAVE_EVERY [--resume]

The env is ``SleepTool-v0`` of :mod:`chatgym.testing` (64 tasks; one ``wait`` tool call, then the
answer; the call's latency is log-normal, median 0.05 s, capped at 1.5 s); each engine turn takes
0.02 s, so a killed worker takes episodes with it and groups finish out of order.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

PROMPTS, GROUP, NUM_TASKS, SEED = 2, 2, 64, 11


def overrides(out: str, max_steps: int, max_staleness: int, save_every: int) -> list[str]:
    from train_helpers import TINY_LLAMA

    return [
        "model.random_init=true",
        "model.config_overrides=" + json.dumps(TINY_LLAMA),
        "model.device=cpu",
        "model.dtype=float32",
        "model.compute_dtype=float32",
        "engine.dtype=float32",
        "env.id=SleepTool-v0",
        "env.eval_tasks=0",
        # Heavy-tailed tool latency (median 0.05 s, a few near 1.5 s): groups finish out of order,
        # some are in flight at every kill and when a run ends.
        'env.kwargs={"sleep_s": 0.05, "sigma": 1.5, "cap_s": 1.5, "latency_seed": 3}',
        'engine.options={"delay_s": 0.02, "tool_turns": 1}',
        "rollout.max_tokens=32",
        "rollout.max_response_tokens=64",
        "rollout.max_model_len=512",
        f"train.max_steps={max_steps}",
        f"train.prompts_per_step={PROMPTS}",
        f"train.group_size={GROUP}",
        f"train.seed={SEED}",
        f"train.save_every={save_every}",
        "train.progress=false",
        "train.tensorboard=false",
        "train.trace_fraction=0.0",
        f"train.output_dir={out}",
        "trainer.backend=ray",
        "trainer.pipeline=async",
        f"trainer.max_staleness={max_staleness}",
        # Nothing is dropped by design: every group issued is trained exactly once.
        "trainer.stale=importance_sampling",
        "trainer.ray.num_rollout_workers=2",
        "trainer.ray.engine_factory=chatgym.testing:scripted_engine",
        "trainer.ray.worker_num_cpus=0.5",
        "trainer.ray.learner_num_cpus=0.5",
        "trainer.ray.num_cpus=4",
        # The test kills workers far more often than a real run loses them.
        "trainer.ray.max_restarts=1000",
        "trainer.ray.episode_retries=1000",
    ]


def main(argv: list[str]) -> int:
    import chatgym.testing  # noqa: F401  (registers SleepTool-v0)
    from chatgym.trainer.config.run import load_config
    from chatgym.trainer.train import Trainer

    out, max_steps, max_staleness, save_every = argv[0], int(argv[1]), int(argv[2]), int(argv[3])
    cfg = load_config(None, overrides(out, max_steps, max_staleness, save_every))
    t0 = time.monotonic()
    trainer = Trainer(cfg, resume="--resume" in argv)
    print(f"kill_driver: built in {time.monotonic() - t0:.1f} s", flush=True)
    try:
        trainer.train()
        print(f"kill_driver: trained at {time.monotonic() - t0:.1f} s", flush=True)
    finally:
        trainer.close()
    print(f"kill_driver: closed at {time.monotonic() - t0:.1f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
