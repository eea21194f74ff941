"""Tools from an MCP server: start it over stdio with the ``mcp`` SDK, list its tools, call them.

``MCPToolset(command, args)`` starts the server process (``pip install 'chatgym[mcp]'``), lists its
tools and wraps each as a chatgym :class:`~chatgym.envs.tools.Tool` — usable in any env, e.g. through
a tool configuration file (``ChatEnv(tools_config=...)``, see :mod:`chatgym.envs.tool_config`) or
``register_tool``. A call is validated against the tool's input schema by chatgym before it is sent
(``run_tool_call``): a string parameter given ``"12345"`` stays a string, and an argument name the
schema does not list is an error the model reads (``additionalProperties: false`` is added when the
server's schema leaves it open), never silently dropped.

Event loops: the MCP client session (anyio task groups and pipes) must be entered, used and left on
one loop, and in one task. A toolset therefore runs its own event loop on a daemon thread, where one
task holds the session open from ``start()`` to ``close()``; every call hops onto that loop
(``run_coroutine_threadsafe``) and the caller awaits the result on its own loop. This works from a
ChatEnv's private loop thread, the collector's loop, or plain sync code alike, and one server can
serve many envs. ``close()`` ends the session inside its own task, which closes the server's stdin,
waits for it to exit and kills it if it does not (the SDK's stdio shutdown), so no process is left.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import json
import threading
from collections.abc import Coroutine, Mapping, Sequence
from typing import Any, TypeVar

from chatgym.envs.tools import Tool, ToolResult

T = TypeVar("T")
MCP_EXTRA_HINT = "MCP tools need the mcp SDK: pip install 'chatgym[mcp]'"


def _mcp_client() -> tuple[Any, Any]:
    try:
        from mcp import Client
        from mcp.client.stdio import StdioServerParameters
    except ImportError as exc:
        raise ImportError(MCP_EXTRA_HINT) from exc
    return Client, StdioServerParameters


def result_text(result: Any) -> str:
    """An MCP ``CallToolResult`` as text for the model: text blocks joined by newlines; other blocks
    as a short placeholder; the structured content as JSON when there is no text at all."""
    parts = []
    for block in result.content or []:
        kind = getattr(block, "type", "")
        if kind == "text":
            parts.append(block.text)
        elif kind in ("image", "audio"):
            parts.append(f"[{kind}: {getattr(block, 'mime_type', '')}]")
        elif kind == "resource_link":
            parts.append(f"[resource: {block.uri}]")
        elif kind == "resource":
            res = block.resource
            parts.append(getattr(res, "text", None) or f"[resource: {res.uri}]")
    if not parts and getattr(result, "structured_content", None) is not None:
        parts.append(json.dumps(result.structured_content, ensure_ascii=False))
    return "\n".join(parts)


class MCPToolset:
    """One MCP server over stdio, and its tools as chatgym Tools.

    Args:
        command: executable that starts the server (e.g. ``sys.executable``).
        args: its arguments (e.g. ``["examples/mcp_notes_server.py"]``).
        env: extra environment variables for the server process.
        cwd: working directory of the server process.
        name: a label for error messages.
        include: offer only these tool names (all when None).
        prefix: prepended to every tool name (to keep names unique across servers).
        startup_timeout_s: seconds to wait for the server to start and list its tools.
        call_timeout_s: seconds one call may take before it fails (the env's ``tool_timeout_s``
            applies on top).

    Raises:
        ImportError: naming the ``mcp`` extra when the SDK is missing (at ``start()``).
    """

    def __init__(
        self,
        command: str,
        args: Sequence[str] = (),
        *,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        name: str = "mcp",
        include: Sequence[str] | None = None,
        prefix: str = "",
        startup_timeout_s: float = 60.0,
        call_timeout_s: float | None = 300.0,
    ):
        self.command, self.args = command, list(args)
        self.env, self.cwd, self.name = dict(env or {}), cwd, name
        self.include = list(include) if include is not None else None
        self.prefix = prefix
        self.startup_timeout_s = startup_timeout_s
        self.call_timeout_s = call_timeout_s
        self.tools: list[Tool] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._client: Any = None
        self._stop: asyncio.Event | None = None
        self._task: asyncio.Task[None] | None = None

    # ---- life cycle ---------------------------------------------------------------------------

    def start(self) -> list[Tool]:
        """Start the server, list its tools and return them as Tools (blocks; any thread).

        Raises:
            ImportError: the mcp SDK is missing. RuntimeError: the server did not start or list
            its tools in time (the process is stopped), or ``include`` names a tool it lacks.
        """
        if self._loop is not None:
            return self.tools
        client_cls, params_cls = _mcp_client()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True, name=f"mcp-{self.name}")
        self._thread.start()
        try:
            specs = self._submit(self._open(client_cls, params_cls)).result()
        except BaseException:
            self.close()
            raise
        if self.include is not None:
            missing = sorted(set(self.include) - {s.name for s in specs})
            if missing:
                self.close()
                raise RuntimeError(
                    f"MCP server {self.name!r} has no tool(s) {missing}; it offers {sorted(s.name for s in specs)}"
                )
            specs = [s for s in specs if s.name in self.include]
        self.tools = [self._wrap(spec) for spec in specs]
        return self.tools

    async def astart(self) -> list[Tool]:
        """``start()`` without blocking the caller's loop."""
        return await asyncio.to_thread(self.start)

    def close(self) -> None:
        """Stop the server process and the toolset's loop; safe to call twice."""
        loop, self._loop = self._loop, None
        if loop is None:
            return
        if self._task is not None:
            try:
                asyncio.run_coroutine_threadsafe(self._shutdown(), loop).result(timeout=30)
            except (concurrent.futures.TimeoutError, RuntimeError):
                pass  # the SDK's shutdown kills the process tree itself; nothing more to wait for
        loop.call_soon_threadsafe(loop.stop)
        if self._thread is not None:
            self._thread.join(timeout=10)
        loop.close()

    async def aclose(self) -> None:
        await asyncio.to_thread(self.close)

    def __enter__(self) -> MCPToolset:
        self.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # ---- on the toolset's loop ------------------------------------------------------------------

    def _submit(self, coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        if self._loop is None:
            coro.close()
            raise RuntimeError(f"MCP server {self.name!r} is not running")
        return asyncio.run_coroutine_threadsafe(coro, self._loop)

    async def _open(self, client_cls: Any, params_cls: Any) -> list[Any]:
        ready: asyncio.Future[list[Any]] = asyncio.get_running_loop().create_future()
        self._stop = asyncio.Event()
        params = params_cls(command=self.command, args=self.args, env=self.env or None, cwd=self.cwd)
        self._task = asyncio.create_task(self._serve(client_cls(params), ready))
        try:
            return await asyncio.wait_for(asyncio.shield(ready), self.startup_timeout_s)
        except asyncio.TimeoutError:
            # Cancel the session here, on its own task: leaving it pending made close() wait out its
            # own timeouts, and its late failure went unretrieved.
            self._task.cancel()
            with contextlib.suppress(BaseException):
                await asyncio.wait_for(self._task, 10)
            self._task = None
            if ready.done() and not ready.cancelled():
                ready.exception()  # retrieved: no "Future exception was never retrieved"
            raise RuntimeError(
                f"MCP server {self.name!r} ({self.command} {' '.join(self.args)}) did not list its tools "
                f"within {self.startup_timeout_s} s"
            ) from None

    async def _serve(self, client: Any, ready: asyncio.Future[list[Any]]) -> None:
        # One task enters and leaves the session: anyio's cancel scopes must exit in the task that
        # entered them.
        try:
            async with client:
                self._client = client
                specs, cursor = [], None
                while True:
                    page = await client.list_tools(cursor=cursor)
                    specs.extend(page.tools)
                    cursor = page.next_cursor
                    if not cursor:
                        break
                ready.set_result(specs)
                await self._stop.wait()
        except BaseException as exc:
            if not ready.done():
                ready.set_exception(RuntimeError(f"MCP server {self.name!r} failed to start: {exc!r}"))
            if not isinstance(exc, Exception):
                raise
        finally:
            self._client = None

    async def _shutdown(self) -> None:
        if self._stop is not None:
            self._stop.set()
        if self._task is not None:
            try:
                await asyncio.wait_for(self._task, 20)
            except (asyncio.TimeoutError, Exception):
                self._task.cancel()

    async def _call_here(self, name: str, arguments: dict[str, Any]) -> ToolResult:
        if self._client is None:
            raise RuntimeError(f"MCP server {self.name!r} is not running")
        result = await self._client.call_tool(name, arguments, read_timeout_seconds=self.call_timeout_s)
        return ToolResult(result_text(result), is_error=bool(result.is_error))

    # ---- the Tools ------------------------------------------------------------------------------

    async def call(self, name: str, arguments: dict[str, Any]) -> ToolResult:
        """Call a server tool by its server-side name from any event loop.

        Raises:
            RuntimeError: the server is not running. Errors of the transport propagate (the tool
            runner turns them into an error message for the model).
        """
        return await asyncio.wrap_future(self._submit(self._call_here(name, arguments)))

    def _wrap(self, spec: Any) -> Tool:
        params = dict(spec.input_schema or {"type": "object", "properties": {}})
        params.setdefault("type", "object")
        params.setdefault("properties", {})
        # Unknown argument names must reach the model as an error, not be dropped by the server.
        params.setdefault("additionalProperties", False)
        server_name = spec.name

        async def call(**arguments: Any) -> ToolResult:
            return await self.call(server_name, arguments)

        return Tool(name=self.prefix + server_name, description=spec.description or "", parameters=params, fn=call)

    def __repr__(self) -> str:
        return f"MCPToolset(name={self.name!r}, command={self.command!r}, args={self.args!r})"
