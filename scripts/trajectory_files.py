"""The chatgym files one training step runs code in, in the order it first enters them.

    .venv/bin/python scripts/trajectory_files.py [--engine hf]

Runs one GRPO step of the main job (``examples/configs/math_grpo.yaml``: SmolLM2-135M, Math-v0),
scaled down to 2 prompts x 2 samples of at most 16 tokens, no held-out evaluation, under a profiler
that records each function call (module and class bodies, i.e. imports, are not counted), and prints the
repository-relative path of every library file entered. ``docs/architecture.md`` lists these files;
``tests/test_docs.py`` checks that it still does. The default engine is ``hf`` (the vLLM engine's
path differs only in ``trainer/engines/``: ``vllm_inproc.py`` in place of the ``hf*.py`` files).
"""

from __future__ import annotations

import argparse
import inspect
import sys
import tempfile
import threading
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LIBRARY = ("chatgym", "envs", "sandboxes", "retrievers", "trainer")


def trajectory_files(engine: str = "hf") -> list[str]:
    """Repository-relative paths of the library files one step enters, first entry first."""
    from chatgym.trainer.config.run import load_config
    from chatgym.trainer.train import Trainer

    seen: dict[str, None] = {}
    roots = tuple(str(ROOT / d) + "/" for d in LIBRARY)

    def profile(frame, event, arg):
        # Functions only: module and class bodies (imports) have no CO_OPTIMIZED, and whether a
        # module is first imported inside the step depends on what the process imported before.
        if event == "call" and frame.f_code.co_flags & inspect.CO_OPTIMIZED:
            name = frame.f_code.co_filename
            if name.startswith(roots):
                seen.setdefault(str(Path(name).relative_to(ROOT)), None)

    with tempfile.TemporaryDirectory() as out:
        overrides = [f"engine.backend={engine}", "engine.options={}", "engine.dtype=float32",
                     "env.eval_tasks=0", "train.max_steps=1", "rollout.max_tokens=16",
                     "rollout.max_response_tokens=16", "train.prompts_per_step=2", "train.group_size=2",
                     f"train.output_dir={out}", "train.tensorboard=false"]
        cfg = load_config(ROOT / "examples" / "configs" / "math_grpo.yaml", overrides)
        sys.setprofile(profile)
        threading.setprofile(profile)
        try:
            trainer = Trainer(cfg)
            try:
                trainer.train()
            finally:
                trainer.close()
        finally:
            sys.setprofile(None)
            threading.setprofile(None)
    return list(seen)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--engine", default="hf", help="engine.backend of the step (default hf)")
    args = p.parse_args(argv)
    print("\n".join(trajectory_files(args.engine)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
