"""The ``chatgym`` command: a table of subcommands, each implemented in its own package.

``chatgym <subcommand> [args...]`` imports the subcommand's module lazily (so ``chatgym --help``
never imports torch or faiss) and calls its ``main(argv) -> int`` with the remaining arguments. Add a
subcommand by adding a row to :data:`SUBCOMMANDS`.
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Sequence

# name -> (module whose main(argv) -> int runs it, one-line help)
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "rollout": (
        "chatgym.trainer.rollout.cli",
        "collect trajectories from an env with a model, as JSONL (progress bar, summary)",
    ),
    "train": (
        "chatgym.trainer.train_cli",
        "train a policy with GRPO/PPO from a YAML config (key.sub=value overrides, --resume)",
    ),
    "cotrain": (
        "chatgym.trainer.cotrain.loop",
        "co-train a policy and its judge / simulated user (two learners, two engines) from a YAML config",
    ),
    "eval": (
        "chatgym.trainer.eval.cli",
        "evaluate a model or the reference policy on envs into a SQLite results store (resumable)",
    ),
    "gateway": (
        "chatgym.trainer.gateway.cli",
        "serve a config's engine as an OpenAI-compatible chat API on 127.0.0.1, sessions -> trajectories JSONL",
    ),
    "leaderboard": (
        "chatgym.trainer.eval.leaderboard_cli",
        "print the models x envs leaderboard and write it as a static HTML page",
    ),
    "serve-retriever": (
        "chatgym.retrievers.server",
        "serve a BM25 / dense / hybrid index over HTTP (Search-R1 /retrieve shape)",
    ),
    "serve-sandbox": (
        "chatgym.sandboxes.fusion.service",
        "run untrusted code over HTTP, SandboxFusion API (/run_code, /run_jupyter); local/bwrap/docker",
    ),
}


def _usage() -> str:
    width = max(map(len, SUBCOMMANDS))
    rows = "\n".join(f"  {name:<{width}}  {help_}" for name, (_, help_) in sorted(SUBCOMMANDS.items()))
    return (f"usage: chatgym <subcommand> [args...] | chatgym --version\n\nsubcommands:\n{rows}\n\n"
            "'chatgym <subcommand> --help' for details.")


def main(argv: Sequence[str] | None = None) -> int:
    """Dispatch to a subcommand; returns its exit code (2 for an unknown subcommand)."""
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help"):
        print(_usage())
        return 0 if args else 2
    if args[0] in ("-V", "--version"):
        from chatgym import __version__

        print(f"chatgym {__version__}")
        return 0
    # vLLM's INFO lines (a config dump among them) drowned the progress bars, and went to stdout, where
    # rollout and eval print their JSON summaries; read when vLLM is imported. The caller's settings win.
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")
    name, rest = args[0], args[1:]
    if name not in SUBCOMMANDS:
        print(f"chatgym: unknown subcommand {name!r}\n\n{_usage()}", file=sys.stderr)
        return 2
    return int(importlib.import_module(SUBCOMMANDS[name][0]).main(rest) or 0)


if __name__ == "__main__":
    sys.exit(main())
