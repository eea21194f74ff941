"""``LocalSession``: the parent's handle on one stateful interpreter (see ``repl.py``)."""

from __future__ import annotations

import asyncio
from typing import Any

from chatgym.sandboxes.base import ExecResult, check_code, check_timeout
from chatgym.sandboxes.local.client import ZygoteClient, ZygoteDied

CONTROL_TIMEOUT_S = 30.0


class LocalSession:
    """One Python interpreter kept across ``run`` calls within an episode.

    ``x = 1`` then ``print(x)`` prints ``1``; the value of a call's last expression is echoed like
    in a REPL. A timeout (or any death of the interpreter) kills it; the next call gets a fresh
    interpreter, with a note at the top of its stderr and ``info["fresh_interpreter"] = True``.
    Calls share the sandbox's concurrency limit. Use :meth:`LocalSandbox.open_session` to make one.
    """

    def __init__(self, sandbox: Any, memory_mb: int) -> None:
        # ``sandbox``: the LocalSandbox that opens it (its zygote client, request path and output cap);
        # not imported here, so that local.py can import this module at its top.
        self._sandbox = sandbox
        self._memory_mb = memory_mb
        self._client: ZygoteClient | None = None
        self._sid: int | None = None
        self._lost = ""  # why the interpreter is gone when its zygote died under it
        self.closed = False

    @classmethod
    async def open(cls, sandbox: Any, memory_mb: int) -> LocalSession:
        session = cls(sandbox, memory_mb)
        await session._open()
        return session

    async def _open(self) -> None:
        client = await self._sandbox._ensure_client()
        sid = client.next_id()
        reply = await _control(client, {"op": "sopen", "id": sid, "sid": sid, "memory_mb": self._memory_mb})
        if reply.get("error") or reply.get("op") != "ack":
            raise RuntimeError(
                f"could not open a sandbox session: {reply.get('error') or reply.get('stderr')}"
            )
        self._client, self._sid = client, sid

    async def run(self, code: str, timeout_s: float = 10.0) -> ExecResult:
        """Run ``code`` in this session's interpreter.

        Args:
            code: Python source; its last expression statement's value is printed (repr).
            timeout_s: wall-clock limit of this call in seconds; on expiry the interpreter is killed.

        Returns:
            ExecResult as for :meth:`LocalSandbox.run` (an exception gives ``error`` but keeps the
            interpreter; ``timeout`` ends it).

        Raises:
            TypeError / ValueError: bad arguments. RuntimeError: the session was closed.
        """
        check_code(code)
        check_timeout(timeout_s)
        if self.closed:
            raise RuntimeError("the session is closed")
        note = ""
        if self._client is None or self._client.dead:  # the zygote died and took the interpreter along
            await self._open()
            note = "[chatgym sandbox: this is a fresh interpreter; the previous one was lost with the sandbox process]\n"
        msg = {"op": "scall", "sid": self._sid, "code": code, "timeout_s": float(timeout_s),
               "max_output_bytes": self._sandbox.max_output_bytes}  # fmt: skip
        res = await self._sandbox._request(msg, timeout_s, client=self._client)
        if note and res.info.get("internal") is None:
            res.stderr = note + res.stderr
            res.info["fresh_interpreter"] = True
        return res

    async def close(self) -> None:
        """End the interpreter and delete the session's work dir. Idempotent."""
        if self.closed:
            return
        self.closed = True
        if self._client is not None and not self._client.dead:
            try:
                await _control(self._client, {"op": "sclose", "id": self._client.next_id(), "sid": self._sid})
            except ZygoteDied:
                pass

    async def __aenter__(self) -> LocalSession:
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()


async def _control(client: ZygoteClient, msg: dict) -> dict:
    """A request answered by an ``ack`` frame (no concurrency slot, no ExecResult)."""
    fut = client.submit(msg)
    return await asyncio.wait_for(fut, CONTROL_TIMEOUT_S)
