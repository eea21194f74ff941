"""Tool configuration files: native functions (by import path) and MCP servers (by command) in YAML.

An env's toolset changes without code: ``gym.make("MathCalculator-v0", tools_config="tools.yaml")``
adds the file's tools to the env's own (any ChatEnv accepts ``tools_config``). The format::

    tools:                                     # native Python tools
      - function: chatgym.envs.math.calculator:calculate   # "module:attribute": a documented function or a Tool
        name: calc                             # optional: the name the model sees
    mcp_servers:                               # tools of MCP servers started over stdio
      - name: notes                            # a label for errors
        command: python                        # executable ("python" = this interpreter)
        args: [mcp_notes_server.py]
        cwd: .                                 # optional; relative to the YAML file (default: its folder)
        env: {NOTES_DIR: /tmp/notes}           # optional extra environment variables
        include: [save_note, read_note]        # optional: only these tools
        prefix: notes_                         # optional: prepended to the tool names
        startup_timeout_s: 60                  # optional

:func:`read_tools_config` checks the file and fails naming the bad field (``mcp_servers[0].command:
...``) before anything starts. :func:`load_tools` imports the functions, starts the servers
(:class:`~chatgym.envs.mcp_tools.MCPToolset`) and registers every tool in the global tool registry by
name (a later load replaces tools of the same name). The caller owns the servers: ``close()`` the
returned :class:`LoadedTools` (a ChatEnv does so in ``close()``).
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from chatgym.envs.tools import Tool, register_tool
from chatgym.yaml_files import YAMLFileError, read_yaml_file

_TOP_KEYS = {"tools", "mcp_servers"}
_TOOL_KEYS = {"function", "name"}
_SERVER_KEYS = {"name", "command", "args", "cwd", "env", "include", "prefix", "startup_timeout_s"}


class ToolConfigError(ValueError):
    """A tool configuration that cannot be used; the message starts with the source and the field."""


@dataclass(frozen=True)
class NativeToolSpec:
    function: str
    name: str | None = None


@dataclass(frozen=True)
class MCPServerSpec:
    name: str
    command: str
    args: tuple[str, ...] = ()
    cwd: str | None = None
    env: tuple[tuple[str, str], ...] = ()
    include: tuple[str, ...] | None = None
    prefix: str = ""
    startup_timeout_s: float = 60.0


@dataclass(frozen=True)
class ToolConfig:
    tools: tuple[NativeToolSpec, ...] = ()
    mcp_servers: tuple[MCPServerSpec, ...] = ()
    source: str = "<dict>"


def _fail(source: str, where: str, message: str) -> ToolConfigError:
    return ToolConfigError(f"{source}: {where}: {message}" if where else f"{source}: {message}")


def _mapping(value: Any, source: str, where: str, allowed: set[str]) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise _fail(source, where, f"expected a mapping, got {type(value).__name__}")
    unknown = sorted(set(value) - allowed)
    if unknown:
        raise _fail(source, f"{where}.{unknown[0]}" if where else unknown[0], f"unknown field; allowed: {sorted(allowed)}")
    return value


def _str(value: Any, source: str, where: str, *, required: bool = True) -> str | None:
    if value is None and not required:
        return None
    if not isinstance(value, str) or not value.strip():
        raise _fail(source, where, f"expected a non-empty string, got {value!r}")
    return value


def _str_list(value: Any, source: str, where: str) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(v, (str, int, float)) for v in value):
        raise _fail(source, where, f"expected a list of strings, got {value!r}")
    return tuple(str(v) for v in value)


def parse_tools_config(data: Any, source: str = "<dict>", base_dir: str | Path | None = None) -> ToolConfig:
    """Check a loaded tool configuration (see the module docstring) and turn it into a ToolConfig.

    Args:
        data: the parsed YAML (a mapping).
        source: shown first in error messages (the file's path).
        base_dir: relative ``cwd`` values are resolved against it (default: the current directory).

    Raises:
        ToolConfigError: naming the bad field, e.g. ``tools.yaml: mcp_servers[0].command: ...``.
    """
    top = _mapping(data if data is not None else {}, source, "", _TOP_KEYS)
    base = Path(base_dir) if base_dir is not None else Path.cwd()
    tools = []
    raw_tools = top.get("tools") or []
    if not isinstance(raw_tools, list):
        raise _fail(source, "tools", f"expected a list, got {type(raw_tools).__name__}")
    for i, raw in enumerate(raw_tools):
        where = f"tools[{i}]"
        entry = _mapping(raw, source, where, _TOOL_KEYS)
        function = _str(entry.get("function"), source, f"{where}.function")
        if ":" not in function:
            raise _fail(source, f"{where}.function", f"expected 'module:attribute', got {function!r}")
        tools.append(NativeToolSpec(function, _str(entry.get("name"), source, f"{where}.name", required=False)))
    servers = []
    raw_servers = top.get("mcp_servers") or []
    if not isinstance(raw_servers, list):
        raise _fail(source, "mcp_servers", f"expected a list, got {type(raw_servers).__name__}")
    for i, raw in enumerate(raw_servers):
        where = f"mcp_servers[{i}]"
        entry = _mapping(raw, source, where, _SERVER_KEYS)
        command = _str(entry.get("command"), source, f"{where}.command")
        env = entry.get("env") or {}
        if not isinstance(env, Mapping) or not all(isinstance(k, str) for k in env):
            raise _fail(source, f"{where}.env", f"expected a mapping of names to values, got {env!r}")
        timeout = entry.get("startup_timeout_s", 60.0)
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout <= 0:
            raise _fail(source, f"{where}.startup_timeout_s", f"expected a positive number of seconds, got {timeout!r}")
        cwd = _str(entry.get("cwd"), source, f"{where}.cwd", required=False)
        servers.append(
            MCPServerSpec(
                name=_str(entry.get("name", f"server{i}"), source, f"{where}.name"),
                command=sys.executable if command == "python" else command,
                args=_str_list(entry.get("args", []), source, f"{where}.args"),
                cwd=str(base / cwd) if cwd is not None else str(base),
                env=tuple((k, str(v)) for k, v in env.items()),
                include=_str_list(entry["include"], source, f"{where}.include") if "include" in entry else None,
                prefix=_str(entry["prefix"], source, f"{where}.prefix") if "prefix" in entry else "",
                startup_timeout_s=float(timeout),
            )
        )
    return ToolConfig(tuple(tools), tuple(servers), source)


def read_tools_config(path: str | os.PathLike[str]) -> ToolConfig:
    """Read and check a YAML tool configuration; relative ``cwd`` values are relative to its folder.

    Raises:
        FileNotFoundError: no such file. ToolConfigError: one line starting with the file: a directory,
            not UTF-8, bad YAML or a key given twice in one mapping (``tools.yaml:4:3: duplicate key
            mcp_servers[0].command (first on line 3)``, :func:`chatgym.yaml_files.read_yaml_file`), or
            a bad field (named).
    """
    path = Path(path)
    try:
        data = read_yaml_file(path)
    except YAMLFileError as exc:
        raise ToolConfigError(str(exc)) from None
    return parse_tools_config(data, str(path), path.resolve().parent)


def import_tool(spec: NativeToolSpec, source: str = "<dict>", where: str = "tools") -> Tool:
    """The Tool a ``module:attribute`` path names (a Tool, or a documented function made into one).

    Raises:
        ToolConfigError: the module or attribute cannot be imported, or the function has no usable
        docstring/type hints.
    """
    module_name, _, attr = spec.function.partition(":")
    try:
        obj: Any = importlib.import_module(module_name)
        for part in attr.split("."):
            obj = getattr(obj, part)
    except (ImportError, AttributeError) as exc:
        raise _fail(source, f"{where}.function", f"cannot import {spec.function!r}: {exc}") from None
    if isinstance(obj, Tool):
        if spec.name and spec.name != obj.name:
            return Tool(spec.name, obj.description, obj.parameters, obj.fn, obj.parse_args)
        return obj
    if not callable(obj):
        raise _fail(source, f"{where}.function", f"{spec.function!r} is not callable")
    try:
        return Tool.from_function(obj, name=spec.name)
    except Exception as exc:  # transformers' docstring / type-hint parsing errors
        raise _fail(source, f"{where}.function", f"cannot make a tool of {spec.function!r}: {exc}") from None


@dataclass
class LoadedTools:
    """The tools of a configuration, and the MCP servers started for them (close them when done)."""

    tools: list[Tool] = field(default_factory=list)
    toolsets: list[Any] = field(default_factory=list)

    def close(self) -> None:
        for toolset in self.toolsets:
            toolset.close()
        self.toolsets = []


def load_tools(config: ToolConfig | str | os.PathLike[str], *, register: bool = True) -> LoadedTools:
    """Import the native tools and start the MCP servers of a configuration.

    Args:
        config: a ToolConfig or the path of a YAML file.
        register: also add every tool to the global registry (``get_tool(name)``).

    Raises:
        ToolConfigError: a bad field (named); the servers already started are stopped.
        ImportError: naming the ``mcp`` extra when the config has servers and the SDK is missing.
        RuntimeError: a server did not start or lacks an ``include``-d tool.
    """
    from chatgym.envs.mcp_tools import MCPToolset

    if not isinstance(config, ToolConfig):
        config = read_tools_config(config)
    loaded = LoadedTools()
    try:
        for i, spec in enumerate(config.tools):
            loaded.tools.append(import_tool(spec, config.source, f"tools[{i}]"))
        for i, server in enumerate(config.mcp_servers):
            toolset = MCPToolset(
                server.command,
                server.args,
                env=dict(server.env),
                cwd=server.cwd,
                name=server.name,
                include=server.include,
                prefix=server.prefix,
                startup_timeout_s=server.startup_timeout_s,
            )
            try:
                loaded.tools.extend(toolset.start())
            except RuntimeError as exc:
                raise RuntimeError(f"{config.source}: mcp_servers[{i}] ({server.name}): {exc}") from exc
            loaded.toolsets.append(toolset)
        names = [t.name for t in loaded.tools]
        dup = next((n for n in names if names.count(n) > 1), None)
        if dup is not None:
            raise ToolConfigError(f"{config.source}: two tools are named {dup!r}; use name: or prefix: to rename one")
    except BaseException:
        loaded.close()
        raise
    if register:
        for t in loaded.tools:
            register_tool(t, overwrite=True)
    return loaded
