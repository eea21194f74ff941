"""``chatgym rollout``: collect trajectories from an env with a model and write them as JSONL.

    chatgym rollout --env CodeSandbox-v0 --engine vllm --model smollm2 -n 16 --out t.jsonl
    chatgym rollout --env Math-v0 --out t.jsonl rollout.max_tokens=64 rollout.top_k=20

The collector's settings are the ``rollout`` section of ``chatgym train``'s config, given as the same
dotted overrides (``rollout.KEY=VALUE``); ``--max-tokens`` and the other budget/sampling flags are
shortcuts for them, with ``RolloutConfig``'s defaults.

Runs tasks ``0..n-1`` of the env's split (``-g`` samples each) through the collector with a progress
bar, writes one JSON line per trajectory (the trace format of :mod:`chatgym.trainer.rollout.trace`) and
prints a summary (:class:`~chatgym.trainer.rollout.CollectStats`) as JSON on stdout.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import sys
from collections.abc import Sequence
from typing import Any

import yaml

from chatgym.trainer.config.loader import ConfigError, apply_overrides, from_dict
from chatgym.trainer.engines import ENGINES
from chatgym.trainer.rollout.config import RolloutConfig


def key_values(items: Sequence[str], flag: str, prog: str = "chatgym rollout") -> dict[str, Any]:
    """``["a=1", "b=x"]`` -> ``{"a": 1, "b": "x"}`` (values parsed as YAML scalars).

    Raises:
        SystemExit: an item without ``=`` (the message names ``prog`` and ``flag``).
    """
    out: dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise SystemExit(f"{prog}: {flag} expects key=value, got {item!r}")
        out[key] = yaml.safe_load(value)
    return out


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="chatgym rollout", description=__doc__.split("\n\n")[0])
    p.add_argument("--env", required=True, help="Gymnasium env id, e.g. CodeSandbox-v0")
    p.add_argument("--env-arg", action="append", default=[], metavar="KEY=VALUE", help="gym.make keyword")
    p.add_argument(
        "--engine", default="vllm", choices=sorted(ENGINES), help="inference engine (default vllm)"
    )
    p.add_argument("--engine-arg", action="append", default=[], metavar="KEY=VALUE", help="engine keyword")
    p.add_argument("--model", default="smollm2", help="packaged model name or local model directory")
    p.add_argument("--chat-template", default="auto", help="auto | model | chatml_tools | path.jinja")
    p.add_argument("-n", "--num-tasks", type=int, default=16, help="tasks 0..n-1 of the split")
    p.add_argument("-g", "--group-size", type=int, default=1, help="samples per task")
    p.add_argument("--out", required=True, help="JSONL file for the trajectories (appended)")
    p.add_argument("--seed", type=int, default=0)
    add_rollout_flags(p)
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    return p


# Flag -> RolloutConfig field: the flags are shortcuts for ``rollout.<field>=<value>`` overrides, with
# no default of their own (the one default is RolloutConfig's).
ROLLOUT_FLAGS: dict[str, tuple[str, type, str]] = {
    "--temperature": ("temperature", float, "sampling temperature (0: greedy)"),
    "--top-p": ("top_p", float, "nucleus sampling"),
    "--max-tokens": ("max_tokens", int, "generated tokens per turn"),
    "--max-response-tokens": ("max_response_tokens", int, "generated tokens per trajectory"),
    "--max-model-len": ("max_model_len", int, "context, tokens"),
    "--max-observation-tokens": ("max_observation_tokens", int, "tokens per observation message"),
    "--episode-timeout": ("episode_timeout_s", float, "seconds per episode"),
    "--max-concurrent": ("max_concurrent_episodes", int, "episodes in flight"),
}


def add_rollout_flags(parser: argparse.ArgumentParser) -> None:
    """The collector's flags (:data:`ROLLOUT_FLAGS`) and positional ``rollout.<field>=<value>``
    overrides, as in ``chatgym train``'s ``rollout`` section."""
    defaults = RolloutConfig()
    for flag, (name, kind, text) in ROLLOUT_FLAGS.items():
        parser.add_argument(
            flag, type=kind, default=None, help=f"{text}; rollout.{name} (default {getattr(defaults, name)})"
        )
    parser.add_argument(
        "overrides", nargs="*", metavar="rollout.KEY=VALUE", help="collector settings, e.g. rollout.top_k=20"
    )


def rollout_config(args: argparse.Namespace, prog: str, **base: Any) -> RolloutConfig:
    """The :class:`RolloutConfig` of a CLI call: ``base`` values, then ``args.overrides``, then the
    flags given (a flag wins over an override of the same field).

    Raises:
        SystemExit: a bad override or value, naming the dotted field (``rollout.max_tokens: ...``).
    """
    items = list(args.overrides)
    for flag, (name, _, _) in ROLLOUT_FLAGS.items():
        value = getattr(args, flag.lstrip("-").replace("-", "_"))
        if value is not None:
            items.append(f"rollout.{name}={value}")
    try:
        bad = [i for i in items if not i.startswith("rollout.")]
        if bad:
            raise ConfigError(f"override {bad[0]!r}: expected rollout.KEY=VALUE")
        data = apply_overrides({"rollout": dict(base)}, items)
        return from_dict(RolloutConfig, data["rollout"], prefix="rollout")
    except ConfigError as exc:
        raise SystemExit(f"{prog}: {exc}") from None


async def _run(args: argparse.Namespace) -> dict[str, Any]:
    from tqdm import tqdm

    import chatgym  # noqa: F401  (registers the env ids)
    from chatgym.trainer.chat.tokenizer import get_tokenizer
    from chatgym.trainer.engines import make_engine
    from chatgym.trainer.models.packaged import processor_for
    from chatgym.trainer.rollout.collector import Collector
    from chatgym.trainer.rollout.trace import TraceWriter

    if args.num_tasks < 1:
        raise SystemExit(f"chatgym rollout: -n/--num-tasks must be >= 1, got {args.num_tasks}")
    engine_kwargs = key_values(args.engine_arg, "--engine-arg")
    env_kwargs = key_values(args.env_arg, "--env-arg")
    config = rollout_config(args, "chatgym rollout", seed=args.seed)
    tokenizer = get_tokenizer(args.model, args.chat_template)
    engine = make_engine(args.engine, args.model, **engine_kwargs)
    collector = Collector(engine, tokenizer, config, processor=processor_for(args.model, tokenizer))
    writer = TraceWriter(args.out, 1.0, args.seed, tokenizer)
    bar = tqdm(total=args.num_tasks * args.group_size, unit="ep", disable=args.no_progress, file=sys.stderr)
    failed = 0

    def done(traj: Any) -> None:
        nonlocal failed
        failed += traj.failed
        writer.write(traj)
        bar.set_postfix(failed=failed, refresh=False)
        bar.update(1)

    try:
        await collector.collect(
            args.env,
            args.num_tasks,
            args.group_size,
            env_kwargs=env_kwargs,
            seed=args.seed,
            on_trajectory=done,
        )
    finally:
        bar.close()
        writer.close()
        collector.close()
        await engine.close()
    assert collector.last_stats is not None
    return dataclasses.asdict(collector.last_stats)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``chatgym rollout``; returns 0, or 1 when every episode failed."""
    args = build_parser().parse_intermixed_args(argv)
    stats = asyncio.run(_run(args))
    print(json.dumps(stats, indent=2))
    return 1 if stats["episodes"] and stats["failed"] == stats["episodes"] else 0
