"""One copy of the user's agent program, run against one gateway session.

    program = AgentProgram.from_config(cfg.trainer.gateway)
    reward = await program.run(base_url, session_id, task, timeout_s=600)   # float | None
    program.close()

Two kinds of program:

* a Python callable (``"pkg.module:function"`` or ``"path/to/file.py:function"``), called as
  ``function(base_url, api_key, task)``: a plain function runs in a thread of a pool of
  ``concurrency`` threads, an ``async def`` function on the event loop. It returns the episode's
  reward (a number) or None (no reward from the program);
* a command (an argv list), one process per episode, in its own process group, with
  ``OPENAI_BASE_URL``, ``OPENAI_API_KEY`` (the session id), ``CHATGYM_SESSION_ID`` and
  ``CHATGYM_TASK`` (the task as JSON; the same JSON is written to its stdin) added to the
  environment. Its reward is its last non-empty stdout line when that line is a JSON number, else
  None. A non-zero exit status is a failure (the end of its stderr in the message).

Either may also report its reward with ``POST {base_url}/sessions/{api_key}/reward``. Anything the
program raises (or a command's non-zero exit, or a reward that is not a number) is a
:class:`ProgramError`; the caller fails that episode's trajectory only. A program that runs past
``timeout_s`` raises ``asyncio.TimeoutError``: a command is killed with its process group; a
thread cannot be killed, so it runs on, but its session is ended and its further requests are
refused.
"""

from __future__ import annotations

import asyncio
import importlib
import importlib.util
import inspect
import json
import math
import os
import signal
import sys
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from chatgym.trainer.config.loader import ConfigError


class ProgramError(Exception):
    """The agent program failed one episode (raised, exited non-zero, or reported a bad reward)."""


def load_callable(spec: str, setting: str = "agent") -> Callable[..., Any]:
    """The function named by ``"module:function"`` or ``"path/file.py:function"``, its module run once
    per process (a second call finds it loaded).

    Args:
        setting: the name of the setting that gave ``spec``, which every message starts with
            (``trainer.gateway.agent``).

    Raises:
        ConfigError: (a ValueError) a malformed spec, a missing file or module, or a name that is not
            callable.
    """
    target, sep, name = spec.rpartition(":")
    if not sep or not target or not name:
        raise ConfigError(f"{setting} must be 'module:function' or 'path/file.py:function', got {spec!r}")
    if target.endswith(".py"):
        path = Path(target).resolve()
        if not path.is_file():
            raise ConfigError(f"{setting}: no such file {target!r}")
        module_name = f"chatgym_agent_{path.stem}_{abs(hash(str(path))) % 10**8}"
        module = sys.modules.get(module_name)
        if module is None:
            file_spec = importlib.util.spec_from_file_location(module_name, path)
            if file_spec is None or file_spec.loader is None:
                raise ConfigError(f"{setting}: cannot load {target!r} as a Python module")
            module = importlib.util.module_from_spec(file_spec)
            sys.modules[module_name] = module
            file_spec.loader.exec_module(module)
    else:
        try:
            module = importlib.import_module(target)
        except ImportError as exc:
            raise ConfigError(f"{setting}: cannot import {target!r}: {exc}") from exc
    fn = getattr(module, name, None)
    if not callable(fn):
        raise ConfigError(f"{setting}: {target!r} has no callable {name!r}")
    return fn


def check_reward(value: Any, where: str) -> float | None:
    """``value`` as a float reward, or None; raises ProgramError for anything else (NaN included)."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ProgramError(f"{where} must be a finite number or None, got {value!r:.100}")
    return float(value)


def stdout_reward(stdout: str) -> float | None:
    """A command's reward: its last non-empty stdout line when that is a JSON number, else None."""
    lines = [line.strip() for line in stdout.splitlines() if line.strip()]
    if not lines:
        return None
    try:
        value = json.loads(lines[-1])
    except ValueError:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return float(value)


class AgentProgram:
    """Runs the agent program once per episode (see the module docstring).

    Args:
        agent: ``"module:function"`` / ``"path/file.py:function"`` (loaded at construction), or None.
        command: the argv of a command program (used when ``agent`` is None).
        concurrency: threads for a plain (sync) function; at most this many run at once.

    Raises:
        ValueError: neither or both of ``agent`` and ``command``; an agent that cannot be loaded.
    """

    def __init__(self, agent: str | None = None, command: Sequence[str] = (), concurrency: int = 32):
        if (agent is None) == (not command):
            raise ValueError("give exactly one of agent ('module:function') and command (argv)")
        self.command = tuple(command)
        self.fn = load_callable(agent) if agent is not None else None
        self.is_async = self.fn is not None and inspect.iscoroutinefunction(self.fn)
        self._pool: ThreadPoolExecutor | None = None
        self.concurrency = concurrency

    @classmethod
    def from_config(cls, cfg: Any) -> AgentProgram:
        """From a :class:`~chatgym.trainer.config.gateway.GatewayConfig`."""
        return cls(cfg.agent, cfg.command, cfg.concurrency)

    async def run(self, base_url: str, api_key: str, task: dict[str, Any], timeout_s: float | None) -> float | None:
        """One episode: the program's reward (None: it reported none here).

        Raises:
            ProgramError: the program failed; asyncio.TimeoutError: it ran past ``timeout_s``.
        """
        if self.fn is None:
            return await self._run_command(base_url, api_key, task, timeout_s)
        if self.is_async:
            call = self.fn(base_url, api_key, task)
        else:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(self.concurrency, thread_name_prefix="chatgym-agent")
            call = asyncio.get_running_loop().run_in_executor(self._pool, self.fn, base_url, api_key, task)
        try:
            value = await asyncio.wait_for(call, timeout_s)
        except (asyncio.TimeoutError, asyncio.CancelledError):
            raise
        except Exception as exc:
            raise ProgramError(f"{type(exc).__name__}: {exc}") from exc
        return check_reward(value, "the agent's return value")

    async def _run_command(
        self, base_url: str, api_key: str, task: dict[str, Any], timeout_s: float | None
    ) -> float | None:
        payload = json.dumps(task, default=str)
        env = {
            **os.environ,
            "OPENAI_BASE_URL": base_url,
            "OPENAI_API_KEY": api_key,
            "CHATGYM_SESSION_ID": api_key,
            "CHATGYM_TASK": payload,
        }
        try:
            proc = await asyncio.create_subprocess_exec(
                *self.command,
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                env=env,
                start_new_session=True,  # its own process group: a timeout kills its children too
            )
        except OSError as exc:
            raise ProgramError(f"cannot start {self.command[0]!r}: {exc}") from exc
        try:
            out, err = await asyncio.wait_for(proc.communicate(payload.encode()), timeout_s)
        except BaseException:
            _kill_group(proc.pid)
            await proc.wait()
            raise
        if proc.returncode != 0:
            tail = err.decode(errors="replace").strip()[-500:]
            raise ProgramError(f"command exited with status {proc.returncode}: {tail}")
        return stdout_reward(out.decode(errors="replace"))

    def close(self) -> None:
        """Stop the thread pool (threads still running finish on their own)."""
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
