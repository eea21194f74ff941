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
import os
import sys
from collections.abc import Sequence
from typing import Any

import yaml

from chatgym.trainer.config.loader import (
    ConfigError,
    apply_overrides,
    check_env_seed,
    check_seed,
    from_dict,
    missing_package,
)
from chatgym.trainer.engines import ENGINES, IMAGELESS_ENGINES
from chatgym.trainer.rollout.config import RolloutConfig


def key_values(items: Sequence[str], flag: str) -> dict[str, Any]:
    """``["a=1", "b=x"]`` -> ``{"a": 1, "b": "x"}`` (values parsed as YAML scalars).

    Raises:
        ConfigError: an item without ``=`` (the message names ``flag``).
    """
    out: dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ConfigError(f"{flag} expects key=value, got {item!r}")
        out[key] = yaml.safe_load(value)
    return out


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="chatgym rollout", description=__doc__.split("\n\n")[0].replace("``", ""))
    p.add_argument("--env", required=True, help="Gymnasium env id, e.g. CodeSandbox-v0")
    p.add_argument("--env-arg", action="append", default=[], metavar="KEY=VALUE", help="gym.make keyword")
    p.add_argument(
        "--engine", default="vllm", choices=sorted(set(ENGINES) - {"openai"}),  # it returns no token ids
        help="inference engine (default vllm; an API model through the openai engine: chatgym eval)"
    )
    p.add_argument("--engine-arg", action="append", default=[], metavar="KEY=VALUE", help="engine keyword")
    p.add_argument("--model", default="smollm2", help="packaged model name or local model directory (default smollm2)")
    p.add_argument("--chat-template", default="auto", help="auto | model | chatml_tools | path.jinja")
    p.add_argument("-n", "--num-tasks", type=int, default=16, help="tasks 0..n-1 of the split")
    p.add_argument("-g", "--group-size", type=int, default=1, help="samples per task")
    p.add_argument("--out", required=True, help="JSONL file for the trajectories (appended)")
    p.add_argument("--seed", type=int, default=0, help="seed of the episodes and the sampling (default 0)")
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


def add_rollout_flags(parser: argparse.ArgumentParser, **defaults: str) -> None:
    """The collector's flags (:data:`ROLLOUT_FLAGS`) and positional ``rollout.<field>=<value>``
    overrides, as in ``chatgym train``'s ``rollout`` section; ``defaults``: a command's own default of
    a field, as its help shows it (else RolloutConfig's)."""
    config = RolloutConfig()
    for flag, (name, kind, text) in ROLLOUT_FLAGS.items():
        default = defaults.get(name, getattr(config, name))
        parser.add_argument(flag, type=kind, default=None, help=f"{text}; rollout.{name} (default {default})")
    parser.add_argument(
        "overrides", nargs="*", metavar="rollout.KEY=VALUE", help="collector settings, e.g. rollout.top_k=20"
    )


def rollout_config(args: argparse.Namespace, **base: Any) -> RolloutConfig:
    """The :class:`RolloutConfig` of a CLI call: ``base`` values, then ``args.overrides``, then the
    flags given (a flag wins over an override of the same field).

    Raises:
        ConfigError: a bad override or value, naming the dotted field (``rollout.max_tokens: ...``).
    """
    items = list(args.overrides)
    for flag, (name, _, _) in ROLLOUT_FLAGS.items():
        value = getattr(args, flag.lstrip("-").replace("-", "_"))
        if value is not None:
            items.append(f"rollout.{name}={value}")
    bad = [i for i in items if not i.startswith("rollout.")]
    if bad:
        raise ConfigError(f"override {bad[0]!r}: expected rollout.KEY=VALUE")
    data = apply_overrides({"rollout": dict(base)}, items)
    return from_dict(RolloutConfig, data["rollout"], prefix="rollout")


def check_chat_template_flag(value: str) -> None:
    """``--chat-template`` names something there (a shipped template, an existing ``.jinja`` file).

    Raises:
        ConfigError: naming ``--chat-template``.
    """
    from chatgym.trainer.chat.tokenizer import check_chat_template_setting

    try:
        check_chat_template_setting(value)
    except FileNotFoundError as exc:
        raise ConfigError(f"--chat-template: {exc}") from None


def check_chat_template(
    model: str | os.PathLike[str],
    tokenizer: Any,
    config: RolloutConfig,
    engine_eos: Any = None,
    processor: Any = None,
    *,
    setting: str,
    eos_setting: str = "eos_token_ids",
) -> None:
    """The template check a collector makes when it starts
    (:func:`~chatgym.trainer.chat.delta.probe_chat_template`), made before any engine loads ``model``:
    the EOS ids the engine would report are read from the model's files as the engines read them
    (:func:`~chatgym.trainer.engines.common.local_model_info`; none for a model only a server holds)
    unless ``engine_eos`` (the engine's ``eos_token_ids`` option) gives them.

    EOS ids the user gave (``config.eos_token_ids``, else ``engine_eos``) must be tokens of ``tokenizer``,
    and a template that fails the probe with them but passes it with the model's own EOS ids is their
    fault: those refusals name their setting (``rollout.eos_token_ids`` or ``eos_setting``).

    Args:
        setting: the argument that chose ``tokenizer``'s template (``--chat-template``), named when
            ``config.chat_template`` does not override it.
        eos_setting: the setting ``engine_eos`` came from (``engine.options.eos_token_ids``).

    Raises:
        ConfigError: the template or the EOS ids are refused; the message starts with the setting.
    """
    from chatgym.trainer.chat.delta import probe_chat_template
    from chatgym.trainer.engines.common import check_token_ids, local_model_info

    given, given_setting = engine_eos, eos_setting
    if config.eos_token_ids:  # they win over the engine's
        given, given_setting = config.eos_token_ids, "rollout.eos_token_ids"
    if given is not None:
        empty = "the engine's" if given_setting == "rollout.eos_token_ids" else "none"
        try:
            check_token_ids(given, len(tokenizer), "eos_token_ids", empty)
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"{given_setting}: {exc}") from None
    model_eos = local_model_info(model, tokenizer)[2]
    try:
        probe_chat_template(tokenizer, config, engine_eos if engine_eos is not None else model_eos, None, processor)
    except (FileNotFoundError, ValueError) as exc:  # TemplateError is a ValueError
        if given is not None and (blame := _eos_blame(tokenizer, config, model_eos, processor, given)):
            raise ConfigError(f"{given_setting}: {blame}") from None
        where = "rollout.chat_template" if config.chat_template is not None else setting
        raise ConfigError(f"{where}: {exc}") from None


def _eos_blame(tokenizer: Any, config: RolloutConfig, model_eos: Any, processor: Any, given: Any) -> str | None:
    """Why the EOS ids ``given`` fail a template that the model's own EOS ids pass; None when those
    fail it too (the template's fault)."""
    from chatgym.trainer.chat.delta import probe_chat_template

    try:
        eos, _, probe = probe_chat_template(
            tokenizer, dataclasses.replace(config, eos_token_ids=()), model_eos, None, processor
        )
    except (FileNotFoundError, ValueError):
        return None
    end = probe.turn_suffix_ids[0]
    given = sorted([given] if isinstance(given, int) else given)
    return (
        f"chat template ends assistant turns with {tokenizer.convert_ids_to_tokens([end])[0]!r} (id {end}), "
        f"which is not among these EOS ids {given}: generation would run past the end of the turn "
        f"(the model's own EOS ids are {list(eos)})"
    )


def checked_tokenizer(
    engine: str,
    model: str,
    engine_kwargs: dict[str, Any],
    chat_template: str,
    config: RolloutConfig,
    tokenizer_source: Any = None,
) -> tuple[Any, Any]:
    """The tokenizer and the processor (None for a text model) of ``chatgym rollout``'s and ``chatgym
    eval``'s collector, every argument of the token engine checked before it loads the model: the
    ``--engine-arg`` keys (:func:`~chatgym.trainer.engines.check_engine_options`, as ``chatgym train``
    checks ``engine.options``; ``quantization fp8`` first, against this machine's GPU), ``--model`` (the tokenizer's source unless ``tokenizer_source``, an
    ``--engine-arg tokenizer``, is), ``--chat-template``, and the collector's template probe with the EOS
    ids of ``--engine-arg eos_token_ids``, else the model's (:func:`check_chat_template`).

    Raises:
        ConfigError: naming the flag.
    """
    from chatgym.trainer.chat.tokenizer import get_tokenizer
    from chatgym.trainer.engines import check_engine_options
    from chatgym.trainer.models.cuda import fp8_config_refusal
    from chatgym.trainer.models.packaged import processor_for

    check_chat_template_flag(chat_template)
    if engine in ("hf", "vllm"):  # in this process: FP8 needs this machine's GPU
        # Before the hf options' check, as chatgym train's config load: its hint (decode=static) was given
        # first without CUDA, and following it only led to this refusal.
        why = fp8_config_refusal(engine_kwargs, "local", 0)
        if why is not None:
            raise ConfigError(f"--engine-arg: quantization {engine_kwargs['quantization']!r} is refused: {why}")
    check_engine_options(engine, engine_kwargs, "--engine-arg", engine_kwargs.get("dtype"))
    source = model if tokenizer_source is None else tokenizer_source
    try:
        tokenizer = get_tokenizer(source, chat_template)
    except FileNotFoundError as exc:
        raise ConfigError(f"{'--model' if tokenizer_source is None else '--engine-arg tokenizer'}: {exc}") from None
    except ValueError as exc:  # --chat-template model, and the model has none
        raise ConfigError(f"--chat-template: {exc}") from None
    processor = processor_for(source, tokenizer)
    eos = engine_kwargs.get("eos_token_ids")  # else the model's, as its engine reads them
    check_chat_template(
        model, tokenizer, config, eos, processor, setting="--chat-template", eos_setting="--engine-arg eos_token_ids"
    )
    return tokenizer, processor


def reads_no_images(
    engine: str, model: Any, processor: Any, engine_setting: str = "--engine", model_setting: str = "--model"
) -> str | None:
    """Why token engine ``engine`` on ``model`` (``processor``: its image processor, None for a text
    model) reads no images, naming the settings that chose them; None when it may."""
    if engine in IMAGELESS_ENGINES:
        return f"{engine_setting} {engine} sends token prompts without images (use vllm or hf)"
    if processor is None:
        return f"{model_setting} {model} is a text-only model (no image processor)"
    return None


def make_checked_engine(name: str, model: Any, kwargs: dict[str, Any], flag: str = "--engine-arg") -> Any:
    """``make_engine(name, model, **kwargs)``, a value the engine refuses as it starts (a ValueError,
    such as vLLM's ``sleep_level=1`` on a machine without sleep mode, refused before vLLM starts) raised
    as a ConfigError naming ``flag``.

    Raises:
        ConfigError: ``flag: <the engine's reason>``.
    """
    from chatgym.trainer.engines import make_engine

    try:
        return make_engine(name, model, **kwargs)
    except ConfigError:
        raise
    except ValueError as exc:
        raise ConfigError(f"{flag}: {exc}") from exc


def with_context_limit(name: str, kwargs: dict[str, Any], max_model_len: int) -> dict[str, Any]:
    """``kwargs`` with the engine's own ``max_model_len`` (tokens) following the collector's
    ``--max-model-len`` unless given, for engines that take one: vLLM sizes its KV cache by it, the
    ``hf`` engine's static path its slots (at SmolLM2's 8,192 positions, 64 rows took 24 GB on the CPU)."""
    import inspect

    from chatgym.trainer.engines import engine_class

    if "max_model_len" in inspect.signature(engine_class(name)).parameters:
        return {"max_model_len": max_model_len, **kwargs}
    return kwargs


def check_out_file(path: str, flag: str) -> None:
    """``path`` can be a file to append to: not a directory, and the nearest existing folder above it
    is a folder we may write in (the trajectory file is opened once the model has loaded).

    Raises:
        ConfigError: naming ``flag``.
    """
    from chatgym.trainer.config.loader import check_writable

    if os.path.isdir(path) or path.endswith(os.sep):
        raise ConfigError(f"{flag}: {path} is a directory; give a file path (the trajectories' JSONL)")
    if os.path.exists(path) and not os.access(path, os.W_OK):
        raise ConfigError(f"{flag}: {path} is not writable")
    check_writable(os.path.dirname(os.path.abspath(path)), flag, path)


def _start_up_checks(args: argparse.Namespace) -> tuple[dict[str, Any], dict[str, Any], RolloutConfig, Any, Any]:
    """The engine and env keywords, the collector's config, the tokenizer and the processor (None for
    a text model), every argument checked before any model loads.

    Raises:
        ConfigError: naming the bad argument.
    """
    import gymnasium as gym

    import chatgym  # noqa: F401  (registers the env ids)
    from chatgym.envs.registration import image_env_refusal
    from chatgym.trainer.engines.http import check_server
    from chatgym.trainer.rollout.env_runner import EnvBuildError, build_env

    if args.num_tasks < 1:
        raise ConfigError(f"-n/--num-tasks must be >= 1, got {args.num_tasks}")
    if args.group_size < 1:
        raise ConfigError(f"-g/--group-size must be >= 1, got {args.group_size}")
    check_seed("--seed", args.seed, ConfigError)  # before rollout_config names it rollout.seed
    check_out_file(args.out, "--out")
    engine_kwargs = key_values(args.engine_arg, "--engine-arg")
    env_kwargs = key_values(args.env_arg, "--env-arg")
    check_env_seed(env_kwargs, "--env-arg seed", ConfigError)  # env.kwargs.seed's rule in chatgym train
    config = rollout_config(args, seed=args.seed)
    try:  # as chatgym eval builds each env once: a misspelt --env-arg would fail every episode
        build_env(args.env, env_kwargs).close()
    except EnvBuildError as exc:
        flag = "--env-arg" if env_kwargs and args.env in gym.registry else "--env"
        raise ConfigError(f"{flag}: {exc}") from None
    tokenizer, processor = checked_tokenizer(args.engine, args.model, engine_kwargs, args.chat_template, config)
    blind = reads_no_images(args.engine, args.model, processor)
    if blind is not None and (reason := image_env_refusal(args.env, blind)):
        raise ConfigError(f"--env: {args.env}: {reason}")
    check_server(args.engine, engine_kwargs, "--engine-arg", "--engine")  # last: the one that waits
    return engine_kwargs, env_kwargs, config, tokenizer, processor


async def _run(args: argparse.Namespace) -> dict[str, Any]:
    from tqdm import tqdm

    from chatgym.trainer.rollout.collector import Collector
    from chatgym.trainer.rollout.trace import TraceWriter

    engine_kwargs, env_kwargs, config, tokenizer, processor = _start_up_checks(args)
    flag = "--engine-arg" if engine_kwargs else "--engine"
    engine_kwargs = with_context_limit(args.engine, engine_kwargs, config.max_model_len)
    engine = make_checked_engine(args.engine, args.model, engine_kwargs, flag)
    collector = Collector(engine, tokenizer, config, processor=processor)
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


def _refusal(exc: Exception) -> str:
    """The start-up refusal's line: a ConfigError's text, a missing package's with the set-up hint."""
    return missing_package(exc) if isinstance(exc, ModuleNotFoundError) else str(exc)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``chatgym rollout``; returns 0, 1 when every episode failed, 2 for a bad argument
    (one line naming it, before any model loads)."""
    args = build_parser().parse_intermixed_args(argv)
    try:
        stats = asyncio.run(_run(args))
    except (ConfigError, ModuleNotFoundError) as exc:  # ...or the engine's optional package missing
        print(f"chatgym rollout: {_refusal(exc)}", file=sys.stderr)
        return 2
    print(json.dumps(stats, indent=2))
    return 1 if stats["episodes"] and stats["failed"] == stats["episodes"] else 0
