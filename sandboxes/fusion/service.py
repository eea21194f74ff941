"""``chatgym serve-sandbox``: a SandboxFusion-compatible HTTP service on top of our backends.

Speaks the SandboxFusion API (see ``api.py``) so that its official client (``sandbox_fusion``
on PyPI), verl/SkyRL-style SandboxFusion tools and our :class:`SandboxFusionSandbox` can use it:

* ``POST /run_code`` — languages ``python`` and ``bash`` (what the local/bwrap backends run; the
  Docker backend adds none). ``run_timeout`` -> ``timeout_s``, ``memory_limit_MB`` -> ``memory_mb``
  (absent or <= 0: the service's ``--memory-mb``), ``files`` (base64) are written into the run's work
  dir. ``compile_timeout`` is accepted and unused (nothing is compiled). ``fetch_files`` is not
  supported (a non-empty list is answered with ``SandboxError``).
* ``POST /run_jupyter`` — the cells run one after another in one stateful interpreter
  (``open_session``); a cell's last expression value goes to ``display`` as
  ``{"text/plain": repr}`` (Jupyter's execute_result, no rich formats); an exception fills ``error`` (``ename``, ``evalue``, ``traceback``) and the next
  cell still runs; a timeout ends the request (later cells are not run, ``driver.status`` is
  ``TimeLimitExceeded``).
* ``GET /v1/ping`` -> ``"pong"``; ``GET /health`` -> backend, isolation report, limiter state.

A bad body gets HTTP 400 naming the field. Every execution goes through the process-wide limiter
(``limits.py``; ``--max-concurrency`` / ``--rate``) before the backend's own slots; the wait is in
``chatgym.queue_s`` of the response. Binds 127.0.0.1 unless ``--host`` says otherwise: the service
runs whatever code it is sent, so never expose it to an untrusted network.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import secrets
import select
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Sequence

from aiohttp import web

from chatgym.sandboxes.base import ExecResult, check_files
from chatgym.sandboxes.fusion import api as fusion
from chatgym.sandboxes.limits import Limiter

BACKENDS = ("local", "bwrap", "docker")
SESSION_OPEN_TIMEOUT_S = 30.0


def make_backend(kind: str, **kwargs):
    """A sandbox of ``kind`` (``local``, ``bwrap`` or ``docker``) built with ``kwargs``.

    Raises:
        ValueError: an unknown kind. ImportError: the docker extra is missing (``pip install chatgym[docker]``).
    """
    if kind == "local":
        from chatgym.sandboxes.local.sandbox import LocalSandbox

        return LocalSandbox(**kwargs)
    if kind == "bwrap":
        from chatgym.sandboxes.local.bwrap import BwrapSandbox

        return BwrapSandbox(**kwargs)
    if kind == "docker":
        from chatgym.sandboxes.docker.sandbox import DockerSandbox

        kwargs.pop("drop_privileges", None)
        return DockerSandbox(**kwargs)
    raise ValueError(f"backend must be one of {BACKENDS}, got {kind!r}")


def _json_error(status: int, message: str) -> web.Response:
    return web.json_response(fusion.error_response(message), status=status)


async def _body(request: web.Request):
    try:
        return await request.json()
    except ValueError as e:
        raise fusion.RequestError(f"the body is not JSON: {e}") from None


def make_app(
    sandbox, *, memory_mb: int = 1024, limiter: Limiter | None = None, kind: str = "local"
) -> web.Application:
    """The aiohttp application serving ``sandbox`` (any :class:`~chatgym.sandboxes.base.Sandbox`).

    Args:
        sandbox: the backend; the app closes it on shutdown.
        memory_mb: memory cap (MiB) of runs whose request gives no ``memory_limit_MB``.
        limiter: used only for ``/health`` (the backend applies it); the backend's own otherwise.
        kind: backend name for ``/health``.
    """
    app = web.Application(client_max_size=64 << 20)
    languages = tuple(getattr(sandbox, "languages", ("python", "bash")))
    pod = socket.gethostname()

    async def run_code(request: web.Request) -> web.Response:
        try:
            req = fusion.parse_run_code(await _body(request))
            check_files(req["files"])
        except (fusion.RequestError, ValueError, TypeError) as e:
            return _json_error(400, str(e))
        if req["language"] not in languages:
            return web.json_response(fusion.error_response(
                f"language {req['language']!r} is not supported by this service (it runs {', '.join(languages)})"))  # fmt: skip
        if req["fetch_files"]:
            return web.json_response(fusion.error_response("fetch_files is not supported by this service"))
        res = await sandbox.run(
            req["code"], language=req["language"], stdin=req["stdin"], files=req["files"] or None,
            timeout_s=req["timeout_s"], memory_mb=req["memory_mb"] or memory_mb,
        )  # fmt: skip
        return web.json_response(fusion.run_code_response(res, pod))

    async def run_jupyter(request: web.Request) -> web.Response:
        try:
            req = fusion.parse_run_jupyter(await _body(request))
            check_files(req["files"])
        except (fusion.RequestError, ValueError, TypeError) as e:
            return _json_error(400, str(e))
        if req["fetch_files"]:
            return web.json_response(fusion.error_response("fetch_files is not supported by this service"))
        return web.json_response(await _jupyter(sandbox, req, memory_mb, pod))

    async def ping(_request: web.Request) -> web.Response:
        return web.json_response("pong")

    async def health(_request: web.Request) -> web.Response:
        lim = limiter or getattr(sandbox, "limiter", None)
        return web.json_response({
            "status": "ok", "backend": kind, "languages": list(languages),
            "isolation": getattr(sandbox, "isolation", {}),
            "limiter": None if lim is None else {"max_concurrency": lim.max_concurrency,
                                                 "in_flight": lim.in_flight,
                                                 "rate": lim.bucket.rate if lim.bucket else None},
        })  # fmt: skip

    async def on_cleanup(_app: web.Application) -> None:
        await sandbox.close()

    app.router.add_post("/run_code", run_code)
    app.router.add_post("/run_jupyter", run_jupyter)
    app.router.add_get("/v1/ping", ping)
    app.router.add_get("/health", health)
    app.on_cleanup.append(on_cleanup)
    return app


# Run first in every /run_jupyter session (one hidden call): write the request's files, and make the
# REPL's echo of a cell's last value a marked line, which the service moves to the cell's `display`.
SESSION_SETUP = """def _chatgym_setup(files, marker):
    import base64, builtins, json, os, sys
    for path, data in files.items():
        if os.path.dirname(path):
            os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as f:
            f.write(base64.b64decode(data))

    def displayhook(value):
        if value is not None:
            builtins._ = value
            sys.stdout.write(marker + json.dumps(repr(value)) + chr(10))

    sys.displayhook = displayhook
_chatgym_setup({files!r}, {marker!r})
del _chatgym_setup
"""


def split_display(stdout: str, marker: str) -> tuple[str, list[dict]]:
    """Move the marked display lines out of ``stdout``: ``(stdout, [{"text/plain": repr}, ...])``."""
    pattern = re.compile(re.escape(marker) + r'("(?:[^"\\]|\\.)*")\n')
    shown = [{"text/plain": json.loads(m)} for m in pattern.findall(stdout)]
    return pattern.sub("", stdout), shown


async def _jupyter(sandbox, req: dict, memory_mb: int, pod: str) -> dict:
    """Run the cells of one ``/run_jupyter`` request in a fresh session; the response dict."""
    import base64

    t0 = time.monotonic()
    deadline = t0 + req["total_timeout_s"]
    marker = f"\x1echatgym-display-{secrets.token_hex(8)}:"
    try:
        session = await asyncio.wait_for(sandbox.open_session(memory_mb=memory_mb), SESSION_OPEN_TIMEOUT_S)
    except (RuntimeError, OSError, asyncio.TimeoutError) as e:
        return fusion.error_response(f"could not open a session: {e}")
    cells, ext, timed_out = [], [], False
    try:
        packed = {p: base64.b64encode(b).decode() for p, b in req["files"].items()}
        setup = SESSION_SETUP.format(files=packed, marker=marker)
        res = await session.run(setup, timeout_s=max(1.0, deadline - time.monotonic()))
        if res.status != "ok":
            return fusion.error_response(f"could not set up the session: {res.stderr[-500:]}")
        for code in req["cells"]:
            left = deadline - time.monotonic()
            budget = min(left, req["cell_timeout_s"] or left)
            if budget <= 0:
                timed_out = True
                break
            res: ExecResult = await session.run(code, timeout_s=budget)
            if res.info.get("internal"):
                return fusion.error_response(res.stderr.strip())
            if res.status == "timeout":
                timed_out = True
                break
            stdout, shown = split_display(res.stdout, marker)
            cells.append({
                "stdout": stdout, "stderr": res.stderr, "display": shown,
                "error": fusion.split_traceback(res.stderr) if res.status != "ok" else [],
            })  # fmt: skip
            ext.append({"status": res.status, "exit_code": res.exit_code, "truncated": res.truncated,
                        "queue_s": res.queue_s, "duration_s": res.duration_s})  # fmt: skip
    finally:
        await session.close()
    failed = timed_out or any(c["error"] for c in cells)
    driver = {"status": fusion.TLE if timed_out else fusion.FINISHED, "execution_time": time.monotonic() - t0,
              "return_code": None if timed_out else 0, "stdout": "", "stderr": ""}  # fmt: skip
    return {"status": fusion.FAILED if failed else fusion.SUCCESS, "message": "", "driver": driver,
            "cells": cells, "executor_pod_name": pod, "files": {}, "chatgym": {"cells": ext}}  # fmt: skip


async def serve(
    sandbox, host: str = "127.0.0.1", port: int = 8080, *, memory_mb: int = 1024, kind: str = "local"
) -> None:
    """Serve until SIGINT/SIGTERM; print ``listening on http://HOST:PORT`` (the real port when 0)."""
    info = await sandbox.start() if hasattr(sandbox, "start") else {}
    runner = web.AppRunner(make_app(sandbox, memory_mb=memory_mb, kind=kind), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port, backlog=1024)
    await site.start()
    bound = runner.addresses[0]
    for note in (info or {}).get("notes", []):
        print(f"chatgym serve-sandbox: note: {note}", file=sys.stderr, flush=True)
    print(f"chatgym serve-sandbox: backend={kind} listening on http://{bound[0]}:{bound[1]}", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        await stop.wait()
    finally:
        await runner.cleanup()


def main(argv: Sequence[str] | None = None) -> int:
    """``chatgym serve-sandbox``: serve a sandbox backend over the SandboxFusion API (see ``--help``)."""
    p = argparse.ArgumentParser(prog="chatgym serve-sandbox", description=__doc__.split("\n")[0])
    p.add_argument("--host", default="127.0.0.1", help="bind address (default 127.0.0.1: local only)")
    p.add_argument("--port", type=int, default=8080, help="0 picks a free port (printed on start)")
    p.add_argument("--backend", default="local", choices=BACKENDS)
    p.add_argument("--max-concurrency", type=int, default=32, help="runs executing at once")
    p.add_argument("--rate", type=float, default=None, help="runs started per second (token bucket)")
    p.add_argument(
        "--burst", type=float, default=None, help="token bucket size (default: one second's worth)"
    )
    p.add_argument("--memory-mb", type=int, default=1024, help="memory cap when a request gives none (MiB)")
    p.add_argument("--max-output-bytes", type=int, default=1 << 20, help="cap per stream (bytes)")
    p.add_argument("--tmpfs-mb", type=int, default=None, help="size of the private /tmp (MiB; local/bwrap)")
    p.add_argument(
        "--image", default=None, help="container image (docker backend; default $CHATGYM_DOCKER_IMAGE)"
    )
    p.add_argument(
        "--reuse", action="store_true",
        help="docker backend: reset and reuse containers instead of a fresh one per run",
    )  # fmt: skip
    args = p.parse_args(argv)
    for name in ("max_concurrency", "memory_mb", "max_output_bytes"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1")
    try:
        limiter = Limiter(args.max_concurrency, args.rate, args.burst)
        kwargs = {"max_concurrency": args.max_concurrency, "max_output_bytes": args.max_output_bytes,
                  "limiter": limiter}  # fmt: skip
        if args.image:
            kwargs["image"] = args.image
        if args.reuse:
            if args.backend != "docker":
                p.error("--reuse is for --backend docker")
            kwargs["reuse"] = True
        if args.tmpfs_mb is not None:
            kwargs["tmpfs_mb"] = args.tmpfs_mb
        sandbox = make_backend(args.backend, **kwargs)
    except (ValueError, TypeError, ImportError) as e:
        print(f"chatgym serve-sandbox: {e}", file=sys.stderr)
        return 2
    asyncio.run(serve(sandbox, args.host, args.port, memory_mb=args.memory_mb, kind=args.backend))
    return 0


if __name__ == "__main__":
    sys.exit(main())


def start_service(*args: str, timeout_s: float = 60.0) -> tuple[subprocess.Popen, str]:
    """Start ``chatgym serve-sandbox --port 0 ARGS`` as a child process (tests, benchmarks, scripts).

    Returns:
        ``(process, url)``: the process (stop it with :func:`stop_service`) and the ``http://host:port``
        it printed once listening.

    Raises:
        RuntimeError: it exited or printed no URL within ``timeout_s`` seconds (it is stopped).
    """
    proc = subprocess.Popen(
        [sys.executable, "-m", "chatgym.cli", "serve-sandbox", "--port", "0", *args],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
    )  # fmt: skip
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and proc.poll() is None:
        if select.select([proc.stdout], [], [], 0.5)[0]:
            line = proc.stdout.readline()
            if "http://" in line:
                return proc, "http://" + line.rsplit("http://", 1)[1].strip()
    stop_service(proc)
    raise RuntimeError("serve-sandbox did not start")


def stop_service(proc: subprocess.Popen) -> None:
    """SIGTERM (the service closes its backend), SIGKILL after 15 s; closes the stdout pipe."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    if proc.stdout is not None:
        proc.stdout.close()
