"""Tool configuration files: native tools by import path, checked fields, loading into an env."""

from __future__ import annotations

import sys

import gymnasium as gym
import pytest

import chatgym  # noqa: F401  (registers the env ids)
from chatgym.envs.tool_config import MCPServerSpec, ToolConfigError, parse_tools_config, read_tools_config
from chatgym.envs.tools import TOOL_REGISTRY, get_tool


def undocumented(x):
    return x


def write(tmp_path, text):
    path = tmp_path / "tools.yaml"
    path.write_text(text)
    return path


def test_native_tool_renamed_and_used_in_an_env(tmp_path):
    path = write(tmp_path, "tools:\n  - function: chatgym.envs.math.calculator:calculate\n    name: calc\n")
    env = gym.make("Math-v0", size=4, max_turns=3, tools_config=str(path)).unwrapped
    try:
        assert [t["function"]["name"] for t in env.tools] == ["calc"]
        assert get_tool("calc") is env.tool_map["calc"]
        env.reset(options={"task_index": 0})
        obs, *_ = env.step('<tool_call>{"name": "calc", "arguments": {"expression": "2*3"}}</tool_call>')
        assert obs == [{"role": "tool", "content": "6", "tool_call_id": "call_0", "name": "calc"}]
    finally:
        env.close()
        TOOL_REGISTRY.pop("calc", None)


def test_same_tool_twice_in_one_env_is_an_error():
    config = {"tools": [{"function": "chatgym.envs.math.calculator:calculate"}]}
    with pytest.raises(ValueError, match="<dict>: tool 'calculate' is already one of MathEnv's tools"):
        gym.make("MathCalculator-v0", tools_config=config)


def test_server_fields_and_defaults(tmp_path):
    path = write(
        tmp_path,
        "mcp_servers:\n  - command: python\n    args: [srv.py, 3]\n    cwd: sub\n    env: {A: 1}\n    prefix: x_\n",
    )
    (server,) = read_tools_config(path).mcp_servers
    assert server == MCPServerSpec(
        name="server0", command=sys.executable, args=("srv.py", "3"), cwd=str(tmp_path / "sub"),
        env=(("A", "1"),), include=None, prefix="x_", startup_timeout_s=60.0,
    )


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("tool: []\n", r"tools\.yaml: tool: unknown field; allowed: \['mcp_servers', 'tools'\]"),
        ("tools: {function: x}\n", r"tools\.yaml: tools: expected a list, got dict"),
        ("tools:\n  - name: x\n", r"tools\.yaml: tools\[0\]\.function: expected a non-empty string, got None"),
        ("tools:\n  - function: math.sqrt\n", r"tools\.yaml: tools\[0\]\.function: expected 'module:attribute', got 'math\.sqrt'"),
        ("tools:\n  - function: m:f\n    nme: x\n", r"tools\.yaml: tools\[0\]\.nme: unknown field"),
        ("mcp_servers:\n  - args: [a]\n", r"tools\.yaml: mcp_servers\[0\]\.command: expected a non-empty string, got None"),
        ("mcp_servers:\n  - command: x\n    args: a b\n", r"tools\.yaml: mcp_servers\[0\]\.args: expected a list of strings, got 'a b'"),
        ("mcp_servers:\n  - command: x\n    env: [A]\n", r"tools\.yaml: mcp_servers\[0\]\.env: expected a mapping"),
        ("mcp_servers:\n  - command: x\n    startup_timeout_s: -1\n", r"mcp_servers\[0\]\.startup_timeout_s: expected a positive number"),
        ("mcp_servers:\n  - command: x\n    prefix: ''\n", r"mcp_servers\[0\]\.prefix: expected a non-empty string, got ''"),
        ("tools: [\n", r"^\S*tools\.yaml:2:1: expected the node content, but found '<stream end>'$"),
        ("mcp_servers:\n  - command: x\n    command: y\n",
         r"^\S*tools\.yaml:3:5: duplicate key mcp_servers\[0\]\.command \(first on line 2\)$"),
        ("tools: []\ntools: []\n", r"^\S*tools\.yaml:2:1: duplicate key tools \(first on line 1\)$"),
        ("- a\n", r"tools\.yaml: expected a mapping, got list"),
    ],
)
def test_bad_config_names_the_field(tmp_path, text, message):
    with pytest.raises(ToolConfigError, match=message):
        read_tools_config(write(tmp_path, text))


def test_a_directory_as_the_file_is_one_line(tmp_path):
    # Regression: IsADirectoryError's "[Errno 21] Is a directory" (gym.make, chatgym eval --env-arg).
    with pytest.raises(ToolConfigError) as err:
        read_tools_config(tmp_path)
    assert str(err.value) == f"{tmp_path}: is a directory, not a config file"


@pytest.mark.parametrize(
    ("function", "message"),
    [
        ("chatgym.envs.nope:f", r"<dict>: tools\[0\]\.function: cannot import 'chatgym\.envs\.nope:f': No module named"),
        ("chatgym.envs.math.calculator:nope", r"tools\[0\]\.function: cannot import 'chatgym\.envs\.math\.calculator:nope'"),
        ("chatgym.envs.math.calculator:_MAX_ABS", r"tools\[0\]\.function: 'chatgym\.envs\.math\.calculator:_MAX_ABS' is not callable"),
        (f"{__name__}:undocumented", r"tools\[0\]\.function: cannot make a tool of 'test_tool_config:undocumented'"),
    ],
)
def test_bad_function_fails_at_start_up(function, message):
    with pytest.raises(ToolConfigError, match=message):
        gym.make("Math-v0", tools_config={"tools": [{"function": function}]})


def test_parse_accepts_empty_config():
    assert parse_tools_config(None).tools == () and parse_tools_config({}).mcp_servers == ()


def test_missing_mcp_sdk_names_the_extra(monkeypatch):
    from chatgym.envs.mcp_tools import MCPToolset

    monkeypatch.setitem(sys.modules, "mcp", None)  # as if the extra were not installed
    with pytest.raises(ImportError, match=r"MCP tools need the mcp SDK: pip install 'chatgym\[mcp\]'"):
        MCPToolset("python").start()
