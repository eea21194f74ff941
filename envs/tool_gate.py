"""A process-global gate in front of the envs' outside calls: tool calls, sandbox runs, retrieval
calls and API calls (a simulated user or a judge behind a chat API).

Envs open a slot of a kind around each such call::

    async with tool_gate.slot("sandbox"):
        res = await sandbox.run(...)

With no gate installed (the default) a slot costs one ``None`` check and waits for nothing. A runner
that shares a budget between processes installs its gate once per process: the Ray rollout worker
installs one that asks a cluster-wide limiter actor
(:class:`chatgym.trainer.distributed.limiter.ToolLimiter`), so N workers do not multiply the load on a
sandbox service or an API. Envs never import the trainer; the gate is any object with
``slot(kind) -> async context manager``.

Slots nest in one order only — ``tool`` outside, then ``sandbox`` / ``retrieval`` / ``api`` inside
(a ``run_python`` tool call holds a ``tool`` slot while its sandbox run holds a ``sandbox`` slot) —
so limits on different kinds cannot deadlock each other.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager
from typing import Protocol

#: The kinds of outside call an env gates; a gate may limit any subset of them.
KINDS = ("tool", "sandbox", "retrieval", "api")


class Gate(Protocol):
    """Anything that hands out slots: ``async with gate.slot(kind): ...`` waits for one of ``kind``."""

    def slot(self, kind: str) -> AbstractAsyncContextManager[None]: ...


_gate: Gate | None = None


def install(gate: Gate | None) -> Gate | None:
    """Install ``gate`` for this process (None: remove it); returns the gate it replaces.

    Raises:
        TypeError: ``gate`` has no ``slot`` method.
    """
    global _gate
    if gate is not None and not callable(getattr(gate, "slot", None)):
        raise TypeError(f"a gate needs a slot(kind) method, got {type(gate).__name__}")
    previous, _gate = _gate, gate
    return previous


def installed() -> Gate | None:
    """The gate of this process, or None."""
    return _gate


@contextlib.asynccontextmanager
async def slot(kind: str) -> AsyncIterator[None]:
    """Hold a slot of ``kind`` (one of :data:`KINDS`) of the installed gate for the ``async with``
    body; without a gate, enter at once.

    Raises:
        ValueError: an unknown kind.
    """
    if kind not in KINDS:
        raise ValueError(f"unknown gate kind {kind!r}; choose one of {KINDS}")
    gate = _gate
    if gate is None:
        yield
        return
    async with gate.slot(kind):
        yield
