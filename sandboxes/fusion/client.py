"""``SandboxFusionSandbox``: the :class:`Sandbox` contract over any SandboxFusion HTTP service.

Speaks the SandboxFusion API (the official ``sandbox-fusion`` client's models); tested against
``chatgym serve-sandbox`` (ByteDance's own server is not on PyPI, so not run here). Each ``run`` is one
``POST /run_code``; ``open_session()`` gives a :class:`FusionSession`, which emulates a stateful
interpreter over the stateless ``POST /run_jupyter``: every call sends the cells that ran before plus
the new one and reports only the new cell. So a session call costs the replay of its history, and
cells with side effects (time, randomness, files) re-run with possibly different results; a timeout
clears the history (like the local session's fresh interpreter).

Infrastructure failures (connection refused, HTTP errors, ``SandboxError``) never raise: the result
has status ``killed`` and ``info["internal"] = True``, as when the local sandbox itself fails.
"""

from __future__ import annotations

import asyncio
import base64
import time

import aiohttp

from chatgym.sandboxes.base import ExecResult, check_code, check_run_args, check_timeout
from chatgym.sandboxes.fusion import api as fusion
from chatgym.sandboxes.limits import Limiter, global_limiter
from chatgym.sandboxes.slots import SlotPool

HTTP_SLACK_S = 30.0  # seconds the HTTP request may take beyond the run's own timeout


class SandboxFusionSandbox:
    """Run code through a SandboxFusion service at ``url``.

    Args:
        url: base URL, e.g. ``http://127.0.0.1:8080``.
        max_concurrency: requests in flight at once (more wait; the wait is in ``queue_s``).
        max_output_bytes: cap per stream applied here (bytes); longer output sets ``truncated``.
        languages: what the service accepts (checked here, so a typo fails fast).
        limiter: process-wide limiter (default ``global_limiter()``).

    Raises:
        ValueError: a bad argument, naming it.
    """

    def __init__(
        self,
        url: str,
        *,
        max_concurrency: int = 32,
        max_output_bytes: int = 64 * 1024,
        languages: tuple[str, ...] = ("python", "bash"),
        limiter: Limiter | None = None,
    ) -> None:
        if not isinstance(url, str) or not url.startswith(("http://", "https://")):
            raise ValueError(f"url must be an http(s) URL, got {url!r}")
        if not isinstance(max_output_bytes, int) or max_output_bytes < 0:
            raise ValueError(f"max_output_bytes must be an int >= 0, got {max_output_bytes!r}")
        self.url = url.rstrip("/")
        self.max_concurrency = max_concurrency
        self.max_output_bytes = max_output_bytes
        self.languages = tuple(languages)
        self.limiter = limiter
        self._slots = SlotPool(max_concurrency)
        self._closed = False

    @staticmethod
    def _client() -> aiohttp.ClientSession:
        """A fresh HTTP session per request: a sandbox is used from several event loops (an env's
        private loop, a collector's), an aiohttp session is bound to one, and a pooled session on a
        loop that closes first would leak its connections. A localhost connect costs ~0.1 ms."""
        return aiohttp.ClientSession()

    async def post(self, path: str, body: dict, timeout_s: float) -> tuple[dict | None, str]:
        """POST ``body`` as JSON; ``(response dict, "")`` or ``(None, why it failed)``."""
        if self._closed:
            raise RuntimeError("SandboxFusionSandbox is closed")
        try:
            async with (
                self._client() as http,
                http.post(
                    self.url + path, json=body, timeout=aiohttp.ClientTimeout(total=timeout_s + HTTP_SLACK_S)
                ) as resp,
            ):
                text = await resp.text()
                if resp.status != 200:
                    return None, f"HTTP {resp.status}: {text[:500]}"
                try:
                    return await resp.json(content_type=None), ""
                except ValueError:
                    return None, f"not JSON: {text[:200]!r}"
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as e:
            return None, f"{type(e).__name__}: {e}"

    async def _limited(self, path: str, body: dict, timeout_s: float) -> tuple[dict | None, str, float]:
        limiter = self.limiter or global_limiter()
        t0 = time.monotonic()
        async with limiter.hold():
            slot = await self._slots.acquire()
            queue_s = time.monotonic() - t0
            try:
                resp, why = await self.post(path, body, timeout_s)
            finally:
                self._slots.release(slot)
        return resp, why, queue_s

    async def run(
        self,
        code: str,
        language: str = "python",
        stdin: str = "",
        files: dict[str, str | bytes] | None = None,
        timeout_s: float = 10.0,
        memory_mb: int = 1024,
    ) -> ExecResult:
        """As :meth:`LocalSandbox.run`, executed by the service.

        Raises:
            TypeError / ValueError: a bad argument (naming it). RuntimeError: the sandbox was closed.
        """
        check_run_args(code, language, stdin, files, timeout_s, memory_mb, self.languages)
        body = {
            "code": code, "language": language, "stdin": stdin, "run_timeout": float(timeout_s),
            "compile_timeout": float(timeout_s), "memory_limit_MB": memory_mb,
            "files": {p: base64.b64encode(c.encode() if isinstance(c, str) else c).decode()
                      for p, c in (files or {}).items()},
        }  # fmt: skip
        resp, why, queue_s = await self._limited("/run_code", body, timeout_s)
        if resp is None:
            return _unreachable(why, queue_s)
        return fusion.exec_result(resp, self.max_output_bytes, queue_s)

    async def open_session(self, memory_mb: int = 1024) -> FusionSession:
        """A :class:`FusionSession` (``memory_mb`` is the service's concern: the API has no field
        for it in ``/run_jupyter``)."""
        if self._closed:
            raise RuntimeError("SandboxFusionSandbox is closed")
        return FusionSession(self)

    async def start(self) -> dict:
        """Check the service answers ``GET /v1/ping``; returns ``{}``.

        Raises:
            ConnectionError: it does not.
        """
        try:
            async with (
                self._client() as http,
                http.get(self.url + "/v1/ping", timeout=aiohttp.ClientTimeout(total=10)) as r,
            ):
                if r.status == 200:
                    return {}
                raise ConnectionError(f"{self.url}/v1/ping answered HTTP {r.status}")
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as e:
            raise ConnectionError(f"{self.url} is not reachable: {e}") from e

    async def close(self) -> None:
        """Refuse further runs (no connection outlives its request). Idempotent."""
        self._closed = True

    async def __aenter__(self) -> SandboxFusionSandbox:
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()


class FusionSession:
    """A REPL-style session over ``/run_jupyter`` (replays its history; see the module docstring)."""

    def __init__(self, sandbox: SandboxFusionSandbox) -> None:
        self._sandbox = sandbox
        self._history: list[str] = []
        self._note = ""
        self.closed = False

    async def run(self, code: str, timeout_s: float = 10.0) -> ExecResult:
        """Run ``code`` after replaying the earlier cells; the new cell's output only.

        Raises:
            TypeError / ValueError: bad arguments. RuntimeError: the session was closed.
        """
        check_code(code)
        check_timeout(timeout_s)
        if self.closed:
            raise RuntimeError("the session is closed")
        cells = [*self._history, code]
        body = {
            "cells": cells,
            "cell_timeout": float(timeout_s),
            "total_timeout": float(timeout_s) * len(cells),
        }
        resp, why, queue_s = await self._sandbox._limited("/run_jupyter", body, body["total_timeout"])
        if resp is None:
            return _unreachable(why, queue_s)
        if resp.get("status") == fusion.SANDBOX_ERROR:
            return fusion.exec_result(resp, 0, queue_s)
        got = resp.get("cells") or []
        driver = resp.get("driver") or {}
        note, self._note = self._note, ""
        if len(got) < len(cells):  # the new cell (or the replay) did not finish: the interpreter is gone
            self._history = []
            self._note = "[chatgym sandbox: this is a fresh interpreter; the previous one timed out]\n"
            return ExecResult("timeout", stderr=note, duration_s=float(driver.get("execution_time") or 0.0),
                              queue_s=queue_s, info={"fresh_interpreter": bool(note)})  # fmt: skip
        cell = got[-1]
        ext = ((resp.get("chatgym") or {}).get("cells") or [{}] * len(got))[-1]
        shown = "".join(d["text/plain"] + "\n" for d in cell.get("display") or [] if "text/plain" in d)
        error = cell.get("error") or []
        stderr = cell.get("stderr") or ""
        if error and not stderr:
            stderr = (
                "\n".join(error[0].get("traceback") or [f"{error[0].get('ename')}: {error[0].get('evalue')}"])
                + "\n"
            )
        cap = self._sandbox.max_output_bytes
        stdout, cut_out = fusion.cap((cell.get("stdout") or "") + shown, cap)
        stderr, cut_err = fusion.cap(note + stderr, cap)
        status = ext.get("status") or ("error" if error else "ok")
        self._history.append(code)
        return ExecResult(status, stdout, stderr, ext.get("exit_code", 1 if error else 0),
                          float(ext.get("duration_s") or 0.0), bool(ext.get("truncated")) or cut_out or cut_err,
                          queue_s, {"fresh_interpreter": True} if note else {})  # fmt: skip

    async def close(self) -> None:
        self.closed = True
        self._history = []

    async def __aenter__(self) -> FusionSession:
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()


def _unreachable(why: str, queue_s: float) -> ExecResult:
    return ExecResult("killed", stderr=f"chatgym sandbox: the SandboxFusion service failed: {why}\n",
                      queue_s=queue_s, info={"internal": True})  # fmt: skip
