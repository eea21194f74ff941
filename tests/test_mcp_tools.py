"""MCP tools: the example server (examples/mcp_notes_server.py) started for real over stdio."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import gymnasium as gym
import pytest

import chatgym  # noqa: F401  (registers the env ids)
from chatgym.envs.mcp_tools import MCPToolset
from chatgym.envs.tools import get_tool

pytest.importorskip("mcp", reason="needs the mcp extra: pip install 'chatgym[mcp]'")

ROOT = Path(__file__).resolve().parents[1]
SERVER = ROOT / "examples" / "mcp_notes_server.py"
TOOLS_YAML = ROOT / "examples" / "tools.yaml"


def server_pids() -> list[int]:
    """Live (not zombie) child processes of this test process running the example server."""
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        state, ppid = stat.rsplit(")", 1)[1].split()[:2]
        if SERVER.name.encode() in cmdline and int(ppid) == os.getpid() and state != "Z":
            pids.append(int(entry))
    return pids


def call(name: str, **arguments) -> str:
    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


def test_episode_through_the_example_config_and_server():
    assert server_pids() == []
    env = gym.make("Math-v0", size=4, max_turns=8, tools_config=str(TOOLS_YAML)).unwrapped
    try:
        assert len(server_pids()) == 1
        assert [t["function"]["name"] for t in env.tools] == ["calculate", "save_note", "read_note", "count_words"]
        save = next(t for t in env.tools if t["function"]["name"] == "save_note")["function"]
        assert save["parameters"]["properties"]["key"]["type"] == "string"
        assert save["parameters"]["additionalProperties"] is False
        assert get_tool("read_note").name == "read_note"  # registered by name

        env.reset(options={"task_index": 0})
        obs, reward, terminated, _, info = env.step(call("save_note", key="12345", text="buy milk"))
        assert obs[0]["content"] == "saved note '12345' (8 characters)"  # the server saw a str key
        assert (reward, terminated, info["tool_errors"]) == (0.0, False, 0)
        obs, *_ = env.step(call("read_note", key="12345"))
        assert obs[0]["content"] == "buy milk"
        obs, *_, info = env.step(call("read_note", key="nope"))
        assert obs[0]["content"] == "Error executing tool read_note: no note with key 'nope'; keys: ['12345']"
        assert info["tool_errors"] == 1
        obs, *_ = env.step(call("save_note", key=12345, text="x"))
        assert obs[0]["content"] == "Error: save_note: invalid arguments: key: 12345 is not of type 'string'"
        obs, *_ = env.step(call("save_note", key="a", text="x", color="red"))
        assert obs[0]["content"] == (
            "Error: save_note: invalid arguments: Additional properties are not allowed ('color' was unexpected)"
        )
        obs, *_ = env.step(call("count_words", text="one two  three") + call("calculate", expression="6*7"))
        assert [o["content"] for o in obs] == ["3", "42"]
        _, reward, terminated, *_ = env.step(f"<answer>{env.task['answer']}</answer>")
        assert (reward, terminated) == (1.0, True)
    finally:
        env.close()
    assert server_pids() == []


async def test_async_use_from_another_loop_and_aclose():
    # The env is driven from this test's event loop (as the collector does), not its private one;
    # the toolset's session lives on its own loop and the calls hop over.
    config = {"mcp_servers": [{"command": "python", "args": [str(SERVER)], "include": ["save_note", "read_note"], "prefix": "n_"}]}
    env = gym.make("Math-v0", size=4, tools_config=config).unwrapped
    try:
        assert sorted(env.tool_map) == ["n_read_note", "n_save_note"]
        await env.areset(options={"task_index": 1})
        obs, *_ = await env.astep(call("n_save_note", key="k", text="v") + call("n_read_note", key="k"))
        assert [o["content"] for o in obs] == ["saved note 'k' (1 characters)", "v"]
    finally:
        await env.aclose()  # what the collector calls
    assert server_pids() == []
    env.close()  # harmless afterwards


def test_include_of_a_missing_tool_stops_the_server():
    bad = MCPToolset(sys.executable, [str(SERVER)], name="notes", include=["nope"])
    with pytest.raises(RuntimeError, match=r"MCP server 'notes' has no tool\(s\) \['nope'\]; it offers"):
        bad.start()
    assert server_pids() == []


def test_server_that_does_not_start_is_a_clear_error():
    ts = MCPToolset(sys.executable, ["-c", "import sys; sys.exit(3)"], name="broken", startup_timeout_s=30)
    with pytest.raises(RuntimeError, match="MCP server 'broken'"):
        ts.start()
    ts.close()


def test_hung_server_times_out_on_time_and_is_stopped(recwarn):
    # Regression: a server that never answered failed after ~88 s (startup_timeout_s 60) and left a
    # "Future exception was never retrieved" message behind.
    import subprocess
    import time

    marker = f"chatgym-hung-mcp-{os.getpid()}"
    ts = MCPToolset(sys.executable, ["-c", f"import time; time.sleep(600)  # {marker}"], name="hung",
                    startup_timeout_s=2)  # fmt: skip
    t0 = time.monotonic()
    with pytest.raises(RuntimeError, match=r"^MCP server 'hung' .* did not list its tools within 2 s$"):
        ts.start()
    assert time.monotonic() - t0 < 10
    ts.close()
    left = subprocess.run(["pgrep", "-f", marker], capture_output=True, text=True).stdout.split()
    assert left == []
