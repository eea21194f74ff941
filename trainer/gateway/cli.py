"""``chatgym gateway``: serve the gateway from a run config's engine, for agent programs outside chatgym.

    chatgym gateway examples/configs/gateway_math.yaml engine.backend=hf 'engine.options={}' --port 8000 --out trajs.jsonl

The engine is the one ``chatgym train`` would build from the same config and overrides (``model``,
``engine``); the gateway's sampling defaults and budgets are the ``rollout`` section's
(``temperature``, ``top_p``, ``top_k``, ``max_tokens`` per request, ``max_model_len``,
``max_response_tokens``, ``max_observation_tokens``, ``chat_template``), its tool-call parser ``trainer.gateway.tool_parser`` and
its idle timeout ``trainer.gateway.session_timeout_s``. It listens on 127.0.0.1 only: a program opens
a session with ``POST /v1/sessions`` (body optional: ``task_id``, ``meta``, ``group_id``,
``sample_index``, ``sampling_seed``), uses the returned ``session_id`` as its API key, may POST its
reward, and ends it with ``POST /v1/sessions/<id>/end``. Every ended session (end, timeout, and at
shutdown the ones still open, ``info["ended_by"] = "shutdown"``) is appended to ``--out`` as JSON
lines, one :meth:`Trajectory.to_json <chatgym.trainer.rollout.types.Trajectory.to_json>` per segment.
SIGINT / SIGTERM stop it (exit status 0): from then on new sessions and requests are refused with
HTTP 503, the requests in flight finish, and every open session is ended and written. A bad config,
an engine without token ids (``engine.backend: openai``) or a port in use is exit status 2, one line,
before any model loads (``--out`` is made once the gateway listens).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="chatgym gateway",
        description="Serve an OpenAI-compatible chat API on 127.0.0.1 that records token-exact trajectories.",
    )
    parser.add_argument("config", nargs="?", help="YAML run config (model, engine, rollout); defaults when omitted")
    parser.add_argument("overrides", nargs="*", help="key.sub=value overrides, e.g. engine.backend=hf")
    parser.add_argument("--port", type=int, default=8000, help="port on 127.0.0.1 (0: a free one; default 8000)")
    parser.add_argument("--out", default="trajectories.jsonl", help="JSONL file the ended sessions are appended to")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """``chatgym gateway [CONFIG] [key.sub=value ...] [--port N] [--out FILE]``; the exit status."""
    import yaml

    from chatgym.trainer.config.run import ConfigError, load_config

    args = _parser().parse_intermixed_args(list(sys.argv[1:] if argv is None else argv))
    overrides = list(args.overrides)
    if args.config and "=" in args.config:  # only overrides, no file
        overrides.insert(0, args.config)
        args.config = None
    try:
        cfg = load_config(args.config, overrides)
        check_token_engine(cfg.engine.backend)
        if not 0 <= args.port < 65536:
            raise ConfigError(f"--port must be in 0..65535, got {args.port}")
        out = Path(args.out)
        if out.is_dir():
            raise ConfigError(f"--out: {out} is a directory")
        check_port(args.port)  # a port in use is refused before the model loads
        from chatgym.trainer.train_cli import check_engine

        check_engine(cfg)  # as chatgym train: the model, engine.options, the chat template, before the engine loads
    except (ConfigError, OSError, yaml.YAMLError) as exc:
        print(f"chatgym gateway: {exc}", file=sys.stderr)
        return 2
    except ModuleNotFoundError as exc:  # check_engine imports the engine's optional package (vLLM, ...)
        from chatgym.trainer.config.loader import missing_package

        print(f"chatgym gateway: {missing_package(exc)}", file=sys.stderr)
        return 2
    from chatgym.trainer.chat.template_probe import TemplateError

    with tempfile.TemporaryDirectory(prefix="chatgym-gateway-") as tmp:
        try:
            asyncio.run(serve(cfg, port=args.port, out=out, workdir=Path(tmp)))
        except (ConfigError, FileNotFoundError, TemplateError, OSError) as exc:
            # Start-up failures found only as the engine starts (a value the engine refuses, a port in
            # use): one line and status 2, as for a bad config.
            what = "" if isinstance(exc, ConfigError) else f"{type(exc).__name__}: "
            print(f"chatgym gateway: {what}{exc}", file=sys.stderr)
            return 2
    return 0


def check_token_engine(backend: str) -> None:
    """The gateway records token ids, which only a token engine gives (``openai`` answers text only,
    and would fail every request once the gateway serves).

    Raises:
        ConfigError: naming ``engine.backend``.
    """
    from chatgym.trainer.config.run import ConfigError
    from chatgym.trainer.engines import TOKEN_ENGINES

    if backend not in ("auto", *TOKEN_ENGINES):
        tokens = ", ".join(["auto", *sorted(TOKEN_ENGINES)])
        raise ConfigError(f"engine.backend: {backend!r} is an API chat engine without token ids; "
                          f"the gateway needs a token engine ({tokens})")


def check_port(port: int) -> None:
    """The gateway can listen on 127.0.0.1:``port`` (0: any free one): bound and let go at once, with
    the ``SO_REUSEADDR`` the server sets (so a port in TIME_WAIT is free, one that is listened on is
    not). Another process may still take it before the server starts; :func:`serve` says the same then.

    Raises:
        ConfigError: naming ``--port``.
    """
    import socket

    from chatgym.trainer.config.run import ConfigError

    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError as exc:
            raise ConfigError(_port_refusal(port, exc)) from None


def _port_refusal(port: int, exc: OSError) -> str:
    # By errno: asyncio's bind error repeats the address in its own words.
    return f"--port: cannot listen on 127.0.0.1:{port}: {os.strerror(exc.errno) if exc.errno else exc}"


def _model_dir(cfg: Any, tokenizer: Any, workdir: Path) -> Path:
    """The directory the engine loads: the model's, or (``model.random_init``) random weights of its
    architecture saved under ``workdir``."""
    from chatgym.trainer.models.packaged import load_model_path

    if not cfg.model.random_init:
        return load_model_path(cfg.model.path)
    from chatgym.trainer.models.random_init import random_model

    model = random_model(cfg.model.path, dtype=cfg.model.dtype, seed=cfg.train.seed, **cfg.model.config_overrides)
    model.save_pretrained(workdir / "model", safe_serialization=True)
    tokenizer.save_pretrained(workdir / "model")
    return workdir / "model"


def build_gateway(cfg: Any, *, port: int, on_end: Any, workdir: Path) -> Any:
    """The engine of ``cfg`` behind a :class:`~chatgym.trainer.gateway.Gateway` on 127.0.0.1:``port``
    with ``POST /v1/sessions`` served and ``on_end`` given each ended session (not started)."""
    from chatgym.trainer.chat.delta import resolve_eos_ids
    from chatgym.trainer.chat.tokenizer import get_tokenizer
    from chatgym.trainer.engines import build_engine
    from chatgym.trainer.engines.base import SamplingParams
    from chatgym.trainer.gateway import Gateway

    tokenizer = get_tokenizer(cfg.model.path)
    path = _model_dir(cfg, tokenizer, workdir)
    engine = build_engine(cfg.engine, path, tokenizer, cfg.train.seed, cfg.rollout.max_model_len)
    ro = cfg.rollout
    eos = tuple(ro.eos_token_ids) or tuple(getattr(engine, "eos_token_ids", None) or ())
    if not eos:
        eos = resolve_eos_ids(tokenizer, _generation_config(path))
    return Gateway(
        engine, tokenizer, parser=cfg.trainer.gateway.tool_parser,
        sampling=SamplingParams(max_tokens=ro.max_tokens, temperature=ro.temperature, top_p=ro.top_p, top_k=ro.top_k),
        chat_template=ro.chat_template, chat_template_kwargs=ro.chat_template_kwargs,
        session_timeout_s=cfg.trainer.gateway.session_timeout_s,
        max_model_len=ro.max_model_len, max_response_tokens=ro.max_response_tokens,
        max_observation_tokens=ro.max_observation_tokens, host="127.0.0.1",
        port=port, eos_token_ids=eos, on_end=on_end, http_sessions=True,
    )


def _generation_config(path: Path) -> Any:
    if not (path / "generation_config.json").is_file():
        return None
    from transformers import GenerationConfig

    return GenerationConfig.from_pretrained(path)


async def serve(cfg: Any, *, port: int, out: Path, workdir: Path) -> None:
    """Serve until SIGINT / SIGTERM; then end the open sessions (written too) and stop. ``out`` is
    made once the engine has started and the gateway listens (an engine that refuses its options, or
    a port in use, leaves none).

    Raises:
        ConfigError: the gateway cannot listen on ``port`` (naming ``--port``).
    """
    from chatgym.trainer.config.run import ConfigError

    def write(sid: str, trajs: list[Any]) -> None:  # sessions end once the gateway has started
        for traj in trajs:
            sink.write(json.dumps(traj.to_json(), default=str) + "\n")
        sink.flush()

    gateway = build_gateway(cfg, port=port, on_end=write, workdir=workdir)
    try:
        try:
            base_url = await gateway.start()
        except OSError as exc:  # the port was taken after check_port
            raise ConfigError(_port_refusal(port, exc)) from exc
        # No await between here and the file's opening: no session can end before `sink` exists.
        out.parent.mkdir(parents=True, exist_ok=True)
        sink = out.open("a", encoding="utf-8")
    except BaseException:
        await gateway.stop()
        await gateway.engine.close()
        raise
    with sink:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        print(f"chatgym gateway: serving {base_url} (open a session: POST {base_url}/sessions); "
              f"ended sessions -> {out}", flush=True)
        try:
            await stop.wait()
        finally:
            # New sessions and requests get 503 from here on: one opened after the sessions are ended
            # would be answered but never written.
            gateway.stop_accepting()
            ended = await gateway.end_open_sessions("shutdown")
            await gateway.stop()
            await gateway.engine.close()
            for sid, trajs in gateway.pop_ended().items():  # those a failed write left: once more
                try:
                    write(sid, trajs)
                except OSError as exc:
                    print(f"chatgym gateway: lost session {sid}: {exc}", file=sys.stderr)
            for error in gateway.on_end_errors:
                print(f"chatgym gateway: could not write {error}", file=sys.stderr)
            # A session without a turn writes nothing (docs/gateway.md): count only those written.
            written = sum(1 for trajs in ended.values() if trajs)
            print(f"chatgym gateway: stopped ({len(ended)} open sessions ended, {written} with turns written)", flush=True)
