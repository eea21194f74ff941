"""``chatgym train``: the training loop from a YAML config and ``key.sub=value`` overrides.

    chatgym train examples/configs/math_grpo.yaml train.max_steps=3 --output-dir runs/x
    chatgym train examples/configs/math_grpo.yaml --output-dir runs/x --resume
    python -m chatgym.trainer.train_cli examples/configs/math_grpo.yaml
"""

from __future__ import annotations

import argparse
import contextlib
import difflib
import os
import re
import shutil
import signal
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import yaml

from chatgym.trainer.config.loader import check_writable, missing_package
from chatgym.trainer.config.run import ConfigError, load_config
from chatgym.trainer.learner.checkpoint import checkpoint_step, find_checkpoint, latest_checkpoint
from chatgym.trainer.models.packaged import load_model_path

OPTIONS = ("--max-steps", "--output-dir", "--resume", "--resume-from", "--help")


class _Refused(Exception):
    """A bad option, config, output dir, model or checkpoint: exit status 2, reported before any model
    loads (the message follows ``chatgym train: ``)."""


class Terminated(KeyboardInterrupt):
    """Raised in the main thread by SIGTERM inside :func:`sigterm_unwinds`: a scheduler's stop (``kill``,
    ``timeout``, a preemption) then closes the engines and their processes and says where the run
    stands, as Ctrl-C does, instead of killing the process where it stands. A ``KeyboardInterrupt``,
    so every ``finally`` and Ctrl-C handler runs. ``chatgym train`` / ``cotrain`` exit 143 (128 + 15)
    on it, 130 on Ctrl-C."""


@contextlib.contextmanager
def sigterm_unwinds() -> Iterator[None]:
    """Within the block SIGTERM raises :class:`Terminated`; the previous handler is restored after it.
    Outside the main thread signals cannot be handled: a no-op there."""

    def handler(signum: int, frame: Any) -> None:
        raise Terminated

    try:
        previous = signal.signal(signal.SIGTERM, handler)
    except ValueError:  # not the main thread
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def interruption(exc: KeyboardInterrupt) -> tuple[str, int]:
    """What stopped the run, for its last line, and the exit status: ``("terminated (SIGTERM)", 143)``
    for :class:`Terminated`, ``("interrupted", 130)`` for Ctrl-C (the shell's 128 + signal number)."""
    return ("terminated (SIGTERM)", 143) if isinstance(exc, Terminated) else ("interrupted", 130)


def main(argv: Sequence[str] | None = None) -> int:
    """``chatgym train CONFIG [key.sub=value ...] [--max-steps N] [--output-dir DIR] [--resume | --resume-from CKPT]``.

    Overrides and options may come in any order. Returns the exit status: 0 done (or nothing left to
    do), 1 a learner process died or a stalled run (every episode failed train.max_failed_steps
    steps in a row), 2 a bad config, output dir or checkpoint — reported before any model loads —,
    130 interrupted (Ctrl-C), 143 terminated (SIGTERM; the engines are closed first).
    """
    started = time.perf_counter()
    try:
        run = _prepare(list(sys.argv[1:] if argv is None else argv))
        return 0 if run is None else _train(*run, started=started)
    except _Refused as exc:
        print(f"chatgym train: {exc}", file=sys.stderr)
        return 2


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="chatgym train", description="Train a policy with PPO/GRPO on a chatgym env."
    )
    parser.add_argument(
        "config", nargs="?", help="YAML config (examples/configs/*.yaml); defaults when omitted"
    )
    parser.add_argument("overrides", nargs="*", help="key.sub=value overrides, e.g. algo.kl_coef=0.01")
    parser.add_argument("--max-steps", type=int, help="cap the run at N steps (train.max_steps)")
    parser.add_argument("--output-dir", help="where metrics, curves and checkpoints go (train.output_dir)")
    parser.add_argument(
        "--resume", action="store_true", help="continue from the newest checkpoint in the output dir"
    )
    parser.add_argument("--resume-from", metavar="CKPT", help="continue from this checkpoint directory")
    return parser


def _parse(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    """The parsed arguments and the config overrides (the options' included)."""
    for arg in argv:  # `--max_steps`: argparse would only say "unrecognized arguments"
        name = arg.split("=", 1)[0]
        if name.startswith("--") and "_" in name and name.replace("_", "-") in OPTIONS:
            raise _Refused(f"unknown option {name}; did you mean {name.replace('_', '-')}?")
    # Intermixed: `--output-dir runs/x algo.kl_coef=0.01` must not leave the override unrecognised.
    args = _parser().parse_intermixed_args(argv)
    # As scripts/train.sh does: vLLM's INFO lines drown the progress bar (read when vLLM is imported).
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    if args.config and "=" not in args.config and not Path(args.config).exists():
        raise _Refused(_missing_config(Path(args.config)))
    overrides = list(args.overrides)
    if args.config and "=" in args.config:  # only overrides, no file
        overrides.insert(0, args.config)
        args.config = None
    if args.max_steps is not None:
        overrides.append(f"train.max_steps={args.max_steps}")
    if args.output_dir is not None:
        overrides.append(f"train.output_dir={args.output_dir}")
    return args, overrides


def _prepare(argv: list[str]) -> tuple[Any, Path | None] | None:
    """The run's config and the checkpoint it resumes from (None: a fresh start); None when that
    checkpoint is already at ``train.max_steps`` (said on stdout).

    Raises:
        _Refused: see its docstring.
    """
    args, overrides = _parse(argv)
    resume = args.resume_from or args.resume
    try:
        config = load_config(args.config, overrides)
        ckpt = find_checkpoint(config.train.output_dir, resume)
    except (ConfigError, OSError, yaml.YAMLError) as exc:  # OSError: missing file, a directory, ...
        raise _Refused(str(exc)) from exc
    out = Path(config.train.output_dir)
    if out.exists() and not out.is_dir():
        raise _Refused(f"train.output_dir: {out} exists and is not a directory")
    try:
        check_writable(out, "train.output_dir", out)
    except ConfigError as exc:
        raise _Refused(str(exc)) from None
    if resume is True and ckpt is None:  # a mistyped --output-dir would otherwise restart unnoticed
        print(f"chatgym train: --resume: no checkpoint in {out}; starting at step 0", file=sys.stderr)
    done = checkpoint_step(ckpt) if ckpt is not None else None
    if done is not None and done >= config.train.max_steps:
        print(
            f"chatgym train: {ckpt} is at step {done} and train.max_steps is {config.train.max_steps}: "
            "nothing to do (raise train.max_steps to continue)"
        )
        return None
    try:
        check_env(config.env)
        check_model_and_engine(config)
    except Exception as exc:  # a bad setting, or a missing package (check_options imports the engine's)
        reason = startup_refusal(exc)
        if reason is None:
            raise
        raise _Refused(reason) from exc
    return config, ckpt


def check_env(env: Any) -> None:
    """``env.id`` builds with the ``gym.make`` keywords the Trainer gives its episodes
    (:meth:`EnvConfig.make_kwargs <chatgym.trainer.config.env.EnvConfig.make_kwargs>`): the train split
    and, when held-out tasks are evaluated (``env.eval_tasks``), the eval split, each with
    ``env.kwargs``. As ``chatgym rollout`` checks ``--env-arg``: a misspelt keyword would otherwise fail
    once the models have loaded.

    Raises:
        ConfigError: naming ``env.kwargs``, the split's field or ``env.id`` (the one that makes it fail).
    """
    from chatgym.trainer.rollout.env_runner import EnvBuildError, build_env

    for eval in (False, True) if env.eval_tasks else (False,):
        try:
            build_env(env.id, env.make_kwargs(eval=eval)).close()
        except EnvBuildError as exc:
            raise ConfigError(f"{_env_field(env, eval)}: {exc}") from None


def _env_field(env: Any, eval: bool) -> str:
    """The field(s) to blame for an env that does not build with :meth:`EnvConfig.make_kwargs`: the
    split's field and/or ``env.kwargs``, whichever fails alone; ``env.id`` when the env does not build
    even with its defaults."""
    if not _builds(env.id, {}):
        return "env.id"
    split_field = "env.eval_split" if eval else "env.train_split"
    alone = ((split_field, {"split": env.make_kwargs(eval=eval)["split"]}), ("env.kwargs", dict(env.kwargs)))
    return " and ".join(field for field, kwargs in alone if kwargs and not _builds(env.id, kwargs)) or "env.kwargs"


def _builds(env_id: str, kwargs: dict[str, Any]) -> bool:
    from chatgym.trainer.rollout.env_runner import EnvBuildError, build_env

    try:
        build_env(env_id, kwargs).close()
    except EnvBuildError:
        return False
    return True


def check_model_and_engine(config: Any) -> None:
    """Start-up checks of a run config (``chatgym train``'s and ``chatgym cotrain``'s), before any
    model loads or the output dir is made: the device suits this machine, :func:`check_engine`, an
    agent program has its function.

    Raises:
        ConfigError: the first that fails, naming the field.
    """
    from chatgym.trainer.gateway.program import load_callable
    from chatgym.trainer.learner.policy import resolve_device

    resolve_device(config.model.device)
    check_engine(config)
    if config.trainer.gateway.agent is not None:
        load_callable(config.trainer.gateway.agent, "trainer.gateway.agent")


def check_engine(config: Any) -> None:
    """The start-up checks of a run config's engine (``chatgym gateway`` makes these alone): the model
    exists, ``engine.options`` suit the backend, the collector would take the chat template with the
    EOS ids (``rollout.eos_token_ids``, ``engine.options.eos_token_ids`` or the model's).

    Raises:
        ConfigError: the first that fails, naming the field.
    """
    try:
        model_path = load_model_path(config.model.path)
    except FileNotFoundError as exc:
        # The recipes' configs start from a cold-start SFT model that their README makes first.
        hint = " (make it first: examples/recipes/README.md, sft_warmup.py)" if "recipes" in str(config.model.path) else ""
        raise ConfigError(f"model.path: {exc}{hint}") from exc
    from chatgym.trainer.chat.tokenizer import get_tokenizer
    from chatgym.trainer.engines import check_options
    from chatgym.trainer.engines.http import check_server
    from chatgym.trainer.models.packaged import processor_for
    from chatgym.trainer.rollout.cli import check_chat_template

    check_options(config.engine)
    tokenizer = get_tokenizer(model_path)  # the Trainer's: the model's own template or chatml_tools
    eos = config.engine.options.get("eos_token_ids")  # else the model's, as its engine reads them
    processor = processor_for(model_path, tokenizer)
    check_chat_template(
        model_path, tokenizer, config.rollout, eos, processor,
        setting="rollout.chat_template", eos_setting="engine.options.eos_token_ids",
    )  # fmt: skip
    _check_images(config, processor)
    check_server(config.engine.backend, config.engine.options, "engine.options", "engine.backend")


def _check_images(config: Any, processor: Any) -> None:
    """An env whose observations carry images needs an engine and a model that read them: every
    episode would fail at its first observation (``chatgym rollout`` / ``eval`` refuse the same)."""
    import gymnasium as gym

    import chatgym  # noqa: F401  (registers the env ids)
    from chatgym.envs.registration import image_env_refusal
    from chatgym.trainer.rollout.cli import reads_no_images

    env_id = config.env.id
    blind = reads_no_images(config.engine.backend, config.model.path, processor, "engine.backend", "model.path")
    if blind is not None and env_id in gym.registry and (reason := image_env_refusal(env_id, blind)):
        raise ConfigError(f"env.id: {env_id}: {reason}")  # (an unknown id is refused elsewhere)


def startup_refusal(exc: BaseException) -> str | None:
    """The one line to print for a start-up failure that is the user's to fix (a ``ConfigError``, a
    ``ModuleNotFoundError`` naming what to install, a ``ConfigError`` raised inside a Ray actor's
    constructor); None for anything else (a bug: its traceback is shown)."""
    if isinstance(exc, ConfigError):
        return str(exc)
    if isinstance(exc, ModuleNotFoundError):
        return missing_package(exc)
    found = re.search(r"ConfigError: ([^\n]+)", str(exc))
    if found and type(exc).__module__.startswith("ray"):
        return found.group(1).strip()
    return None


def _train(config: Any, ckpt: Path | None, started: float | None = None) -> int:
    """Build the trainer and run it; the exit status (see :func:`main`). ``started``: the command's start
    (``time.perf_counter``), for the summary's time with start-up."""
    from chatgym.trainer.distributed.learner import LearnerFailed  # imports no Ray

    # torch and transformers load only once the config is good
    from chatgym.trainer.learner.checkpoint import CheckpointNotWritten
    from chatgym.trainer.train import Trainer, TrainingStalled

    out = Path(config.train.output_dir)
    made_out = not out.exists()
    # What runs, before the engine's and the model loaders' own lines (a new user saw ~25 of them, and
    # then ~90 s of compiling, before anything named the model, env or steps).
    start = f"from {ckpt}" if ckpt else "from step 0"
    print(f"chatgym: {config.model.path} on {config.env.id}, up to step {config.train.max_steps} {start}, "
          f"{config.engine.backend} engine; writing {out} (loading and compiling can take minutes)", file=sys.stderr)
    try:
        trainer = Trainer(config, resume=ckpt or False)  # already found and checked above
    except Exception as exc:
        # A setting checked only when its part is built (engine.options, the Ray cluster's resources),
        # a missing optional package, or either inside a Ray actor (Ray wraps the actor's error).
        reason = startup_refusal(exc)
        if reason is None:
            raise
        if made_out:
            shutil.rmtree(out, ignore_errors=True)  # this run made it and wrote nothing worth keeping
        raise _Refused(reason) from exc
    try:
        with sigterm_unwinds():
            summary = trainer.train()
    # a Ray learner died (the message names the checkpoint) / nothing trains / the disk refused a checkpoint
    except (LearnerFailed, TrainingStalled, CheckpointNotWritten) as exc:
        print(f"chatgym train: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt as exc:
        with contextlib.suppress(Exception):  # the curve of the steps logged so far, as a finished run has
            trainer.metrics.plot()
        last = latest_checkpoint(config.train.output_dir)
        where = f"the last checkpoint is {last} (continue with --resume)" if last else "no checkpoint was saved yet"
        how, status = interruption(exc)
        print(f"\nchatgym train: {how}; {where}", file=sys.stderr)
        return status
    finally:
        trainer.close()
    _print_summary(summary, None if started is None else time.perf_counter() - started)
    return 0


def _print_summary(summary: dict[str, Any], total_s: float | None = None) -> None:
    """The run's summary; ``total_s``: the command's seconds from its start (the model's loading and
    conversion, the engine's start), beside the training loop's ``wall_s``."""
    def pick(m: dict[str, Any] | None, *keys: str) -> str:
        if not m:
            return "-"
        return ", ".join(f"{k.split('/')[-1]}={m[k]:.4g}" for k in keys if isinstance(m.get(k), (int, float)))

    keys = (
        "reward/mean",
        "reward/accuracy",
        "actor/kl",
        "actor/entropy",
        "response/length_mean",
        "timing/step_s",
    )
    start = summary["steps"] - summary["steps_run"]
    resumed = f" (resumed at step {start})" if start else ""
    steps = f"{summary['steps_run']} step{'' if summary['steps_run'] == 1 else 's'}"
    with_startup = "" if total_s is None else f" ({total_s:.0f} s with start-up)"
    print(f"done: {steps}{resumed}, now at step {summary['steps']}, in {summary['wall_s']:.0f} s{with_startup}")
    print(f"  first step: {pick(summary['first_step'], *keys)}")
    print(f"  last step:  {pick(summary['last_step'], *keys)}")
    # A resume with other evaluation settings (env.eval_tasks, env.eval_split, ...) scores other tasks
    # after than before: say so.
    tasks = [(m or {}).get("eval/tasks") for m in (summary["eval_before"], summary["eval_after"])]
    differ = None not in tasks and tasks[0] != tasks[1]
    changed = summary.get("eval_changes") or (["env.eval_tasks"] if differ else [])

    def held_out(m: dict[str, Any] | None) -> str:
        failed = (m or {}).get("eval/failed")  # counted as misses in both figures: say how many
        extra = f" ({failed} of {m['eval/tasks']} episodes failed: counted as misses)" if failed else ""
        extra += f" over {m['eval/tasks']} tasks" if differ else ""
        return pick(m, "eval/score", "eval/accuracy") + extra

    print(f"  held-out before: {held_out(summary['eval_before'])}")
    print(f"  held-out after:  {held_out(summary['eval_after'])}")
    if summary["eval_before"] and summary["eval_after"] is None and summary["steps_run"] < summary["steps"]:
        print("  (no held-out evaluation after: env.eval_tasks is 0 in the resumed run)")
    elif changed and summary["eval_before"] and summary["eval_after"]:
        print(f"  (not comparable: {', '.join(changed)} changed between the run and its resume)")
    print(f"  learning curve: {summary['learning_curve']}")
    print(f"  checkpoint:     {summary['checkpoint']}")
    print(f"  metrics:        {summary['metrics']}")


def _missing_config(path: Path) -> str:
    """The message for a config file that does not exist: the closest name in its folder, or the
    folder's configs."""
    folder = path.parent
    found = sorted(p.name for p in folder.glob("*.yaml")) if folder.is_dir() else []
    close = difflib.get_close_matches(path.name, found, n=1)
    if close:
        return f"no config file {path}; did you mean {folder / close[0]}?"
    if found:
        return f"no config file {path} ({folder} has {', '.join(found)})"
    return f"no config file {path}"


if __name__ == "__main__":
    raise SystemExit(main())
