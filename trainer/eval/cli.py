"""``chatgym eval``: evaluate a model or the reference policy on envs into a results store.

chatgym eval --engine vllm --model smollm2 --env Math-v0 CodeSandbox-v0 --max-tasks 16
chatgym eval --engine reference --env all --max-tasks 16

``chatgym leaderboard`` (:mod:`.leaderboard_cli`) prints and renders what it stored.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import sys
from collections.abc import Sequence
from typing import Any

from chatgym.trainer.config.loader import ConfigError, check_env_seed, check_seed
from chatgym.trainer.rollout.cli import (
    add_rollout_flags,
    check_chat_template_flag,
    key_values,
    rollout_config,
)

DEFAULT_DB = "runs/eval/results.sqlite"


def build_parser() -> argparse.ArgumentParser:
    from chatgym.trainer.engines import ENGINES
    from chatgym.trainer.eval.config import REFERENCE

    p = argparse.ArgumentParser(
        prog="chatgym eval",
        description="Evaluate a model (or the scripted reference policy) on envs; one SQLite row per "
        "episode; rerunning the same command resumes an interrupted evaluation.",
    )
    p.add_argument("--engine", default="vllm", choices=[*sorted(ENGINES), REFERENCE],
                   help="inference engine (default vllm); reference: each env's scripted reference policy")
    p.add_argument(
        "--model",
        help="packaged name / local dir: the weights (vllm, hf; default smollm2), or the tokenizer of the model "
        "a vllm-server / sglang serves (required; vllm-server asks for the server's first /v1/models id unless "
        "--engine-arg served_model_name=...); the served model's name for openai (required)",
    )
    p.add_argument("--model-name", help="display name (default: --model)")
    p.add_argument("--model-hash", help="weights identity for server/API engines (default api:<engine>)")
    p.add_argument(
        "--env", nargs="+", required=True,
        help="env ids, or 'all' (every registered chatgym env: hours on a CPU without --max-tasks)",
    )
    p.add_argument("--env-arg", action="append", default=[], metavar="KEY=VALUE", help="gym.make keyword")
    p.add_argument("--engine-arg", action="append", default=[], metavar="KEY=VALUE", help="engine keyword")
    p.add_argument("--split", default="auto", help="split name; auto: test where the env has one")
    p.add_argument("-n", "--n-samples", type=int, default=1, help="samples per task (n of pass@k)")
    p.add_argument("--seed", type=int, default=0, help="seed of the episodes and the sampling (default 0)")
    p.add_argument("--max-tasks", type=int, help="first N tasks of the split (default: all)")
    p.add_argument("--db", default=DEFAULT_DB, help=f"SQLite results file (default {DEFAULT_DB})")
    p.add_argument("--traces-dir", help="JSONL traces (default: traces/ next to --db)")
    p.add_argument("--chat-template", default="auto", help="auto | model | chatml_tools | path.jinja")
    add_rollout_flags(p, temperature="0, greedy, with -n 1; else 1.0")  # --max-tokens, ... and rollout.KEY=VALUE
    p.add_argument(
        "--success-threshold",
        type=float,
        default=1.0,
        help="reward counted as a pass, only for envs whose info['success'] is None (judged)",
    )
    p.add_argument(
        "--agent",
        help="evaluate an agent program ('module:function' or 'path/file.py:function') through the "
        "gateway (docs/gateway.md; token engines)",
    )
    p.add_argument("--agent-reward", choices=["env", "program"], default="env", help="with --agent")
    p.add_argument("--retry-failed", action="store_true", help="run stored failed episodes again")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``chatgym eval``: prints a JSON report per env; 1 when nothing could be evaluated,
    2 for a bad argument (one line naming it, before any model loads), an env named by ``--env``
    included that cannot be built with ``--split`` / ``--env-arg``."""
    from chatgym.trainer.eval.config import EvalConfig
    from chatgym.trainer.eval.run import evaluate, report_dicts

    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_intermixed_args(argv)
    # ``--env`` takes several ids, so overrides written after it land in its list: move them back.
    args.overrides += [e for e in args.env if "=" in e]
    args.env = [e for e in args.env if "=" not in e] or ["all"]
    try:
        check_seed("--seed", args.seed)  # before rollout_config names it rollout.seed
        engine_kwargs = key_values(args.engine_arg, "--engine-arg")
        env_kwargs = key_values(args.env_arg, "--env-arg")
        check_env_seed(env_kwargs, "--env-arg seed")  # env.kwargs.seed's rule in chatgym train
        args.model = _model_for(args.engine, args.model, engine_kwargs, args.chat_template)
        check_chat_template_flag(args.chat_template)
        config = EvalConfig(
            engine=args.engine,
            model=args.model,
            model_name=args.model_name,
            model_hash=args.model_hash,
            envs=tuple(args.env),
            split=args.split,
            n_samples=args.n_samples,
            seed=args.seed,
            max_tasks=args.max_tasks,
            db=args.db,
            traces_dir=args.traces_dir,
            # Greedy for one sample per task unless a temperature is given (flag or override).
            rollout=rollout_config(args, temperature=0.0 if args.n_samples == 1 else 1.0, seed=args.seed),
            chat_template=args.chat_template,
            success_threshold=args.success_threshold,
            retry_failed=args.retry_failed,
            env_kwargs=env_kwargs,
            engine_kwargs=engine_kwargs,
            agent=args.agent,
            agent_reward=args.agent_reward,
        )
        from chatgym.trainer.eval.envs import resolve_env_ids

        resolve_env_ids(config.envs)
        if config.agent is not None:
            from chatgym.trainer.gateway.program import load_callable

            load_callable(config.agent, "--agent")  # a missing function fails here, not once the model has loaded
    except ValueError as exc:
        return _refuse(exc)
    try:
        reports = asyncio.run(evaluate(config, progress=not args.no_progress, argv=["chatgym", "eval", *argv]))
    except ConfigError as exc:  # the backend's start-up checks (the chat template), before the model loads
        return _refuse(exc)
    except ModuleNotFoundError as exc:  # the engine's optional package (vLLM, ...)
        from chatgym.trainer.config.loader import missing_package

        print(f"chatgym eval: {missing_package(exc)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(
            f"chatgym eval: interrupted; finished episodes are stored in {config.db} — run the same "
            "command again to resume",
            file=sys.stderr,
        )
        return 130
    print(json.dumps(report_dicts(reports), indent=2))
    ran = [r for r in reports if not r.skipped]
    if ran:
        _print_board(config.db, models=[], env_ids=[r.env_id for r in ran])
    if ran and all(r.ran and r.failed == r.ran for r in ran):
        # Every episode of this run failed: an engine/API outage, not a score (failed rows are re-run
        # with --retry-failed).
        print("chatgym eval: every episode failed (see the traces); rerun with --retry-failed", file=sys.stderr)
        return 1
    if not ran:  # each env skipped for its reason (above), before any model loaded: the command's to fix
        print("chatgym eval: nothing evaluated: every env was skipped (the reasons above)", file=sys.stderr)
        return 2
    return 0


# EvalConfig's messages name its fields; the command names the flags that set them.
FLAGS = {
    "agent": "--agent",
    "n_samples": "-n/--n-samples",
    "max_tasks": "--max-tasks",
    "envs": "--env",
    "split": "--split",
    "env_kwargs": "--env-arg",
    "success_threshold": "--success-threshold",
}


def _refuse(exc: Exception) -> int:
    text = str(exc)
    fields = re.match(r"\w+(?: and \w+)*", text)  # "split and env_kwargs: ..." names two
    if fields and all(f in FLAGS for f in fields.group().split(" and ")):
        text = " and ".join(FLAGS[f] for f in fields.group().split(" and ")) + text[fields.end() :]
    print(f"chatgym eval: {text}", file=sys.stderr)
    return 2


def _model_for(engine: str, model: str | None, engine_kwargs: dict[str, Any], chat_template: str = "auto") -> str:
    """The model to evaluate; server/API engines must be told which one (and, for the OpenAI API,
    where it is), so that an unreachable default never lands in the store as a model's score.

    Raises:
        ValueError: a missing ``--model`` or, for ``openai``, no base URL and no API key; for
            ``reference`` (the envs' scripted policies: no model, no engine, no chat template) any
            ``--model``, ``--engine-arg`` or ``--chat-template``, which it would ignore.
    """
    from chatgym.trainer.eval.config import REFERENCE

    if engine == REFERENCE:
        given = [flag for flag, value in (("--model", model), ("--engine-arg", engine_kwargs),
                                          ("--chat-template", chat_template != "auto")) if value]
        if given:
            flags, them = (given[0], "it") if len(given) == 1 else (f"{', '.join(given[:-1])} and {given[-1]}", "them")
            raise ValueError(f"--engine reference plays each env's scripted reference policy, with no model or "
                             f"engine: {flags} would be ignored; leave {them} out")
    if engine in ("vllm-server", "sglang", "openai") and not model:
        what = "the served model's name" if engine == "openai" else "the served model, a packaged name or local dir"
        raise ValueError(f"--engine {engine} needs --model ({what})")
    if engine == "openai" and not (
        engine_kwargs.get("base_url") or os.environ.get("OPENAI_BASE_URL") or os.environ.get("OPENAI_API_KEY")
    ):
        raise ValueError(
            "--engine openai needs $OPENAI_BASE_URL (an OpenAI-compatible server) or $OPENAI_API_KEY "
            "(api.openai.com), or --engine-arg base_url=..."
        )
    return model or "smollm2"


def _print_board(db: str, **filters: Any) -> Any:
    from rich.console import Console

    from chatgym.trainer.eval.leaderboard import build_leaderboard, rich_tables
    from chatgym.trainer.eval.store import ResultsStore

    with ResultsStore(db) as store:
        board = build_leaderboard(store, **filters)
    # On stderr: stdout carries the JSON report alone, for a pipe (`chatgym eval ... | jq`).
    console = Console(stderr=True, width=200)
    for table in rich_tables(board):
        console.print(table)
    return board
