"""Tools: schema from a documented function, the registry, argument validation, running calls."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Literal

import jsonschema
import pytest
from transformers.utils.chat_template_utils import DocstringParsingException

from chatgym.envs import ChatEnv, StepOutcome
from chatgym.envs import messages as M
from chatgym.envs import tools as T
from chatgym.envs.tools import Tool, ToolResult, register_tool, resolve_tools, run_tool_call, run_tool_calls


def get_weather(
    city: str, days: int = 3, units: Literal["metric", "imperial"] = "metric", tags: list[str] | None = None
) -> str:
    """Weather forecast for a city.

    Args:
        city: City name, e.g. "Paris".
        days: How many days ahead.
        units: Unit system.
        tags: Optional labels.
    """
    return f"{city}|{days}|{units}|{tags}"


def lookup(zip_code: str) -> str:
    """Look up a postal code.

    Args:
        zip_code: The postal code, digits kept as text.
    """
    return f"{type(zip_code).__name__}:{zip_code}"


def tc(name: str, arguments: str, call_id: str = "call_0") -> dict:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


@pytest.fixture
def registry():
    """The global registry, restored after the test (other modules register tools at import)."""
    saved = dict(T.TOOL_REGISTRY)
    yield T.TOOL_REGISTRY
    T.TOOL_REGISTRY.clear()
    T.TOOL_REGISTRY.update(saved)


# ---- schema --------------------------------------------------------------------------------------


def test_schema_from_a_typed_documented_function():
    assert Tool.from_function(get_weather).schema == {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Weather forecast for a city.",
            "parameters": {
                "type": "object",
                "properties": {
                    "city": {"type": "string", "description": 'City name, e.g. "Paris".'},
                    "days": {"type": "integer", "description": "How many days ahead."},
                    "units": {
                        "type": "string",
                        "enum": ["metric", "imperial"],
                        "description": "Unit system.",
                    },
                    "tags": {
                        "type": "array",
                        "items": {"type": "string"},
                        "nullable": True,
                        "description": "Optional labels.",
                    },
                },
                "required": ["city"],
                "additionalProperties": False,
            },
        },
    }


def test_schema_needs_a_docstring_and_explicit_schemas_are_checked():
    def undocumented(x: int) -> int:
        return x

    with pytest.raises(DocstringParsingException, match="no docstring"):
        Tool.from_function(undocumented)
    with pytest.raises(jsonschema.exceptions.SchemaError, match="'strin' is not valid"):
        Tool("t", "d", {"type": "object", "properties": {"x": {"type": "strin"}}}, fn=lambda x: x)


# ---- registry ------------------------------------------------------------------------------------


def test_registry_names_duplicates_and_lookup(registry):
    t = register_tool(lookup)
    assert T.get_tool("lookup") is t
    assert register_tool(t) is t  # the same tool again is a no-op
    with pytest.raises(ValueError, match="tool 'lookup' is already registered"):
        register_tool(Tool.from_function(lookup))
    other = register_tool(Tool.from_function(lookup), overwrite=True)
    assert T.get_tool("lookup") is other
    with pytest.raises(KeyError, match=r"unknown tool 'nope'; registered: \[.*'lookup'"):
        T.get_tool("nope")


def test_tool_decorator_and_resolve_tools_keep_order(registry):
    @T.tool(name="zip_lookup")
    def _lookup(zip_code: str) -> str:
        """Look up a postal code.

        Args:
            zip_code: The postal code.
        """
        return zip_code

    assert isinstance(_lookup, Tool) and T.get_tool("zip_lookup") is _lookup
    resolved = resolve_tools(["zip_lookup", get_weather, Tool.from_function(lookup)])
    assert list(resolved) == ["zip_lookup", "get_weather", "lookup"]
    with pytest.raises(ValueError, match="two tools are named 'lookup'"):
        resolve_tools([lookup, Tool.from_function(lookup)])


# ---- validation ----------------------------------------------------------------------------------


async def test_a_digit_string_stays_a_string():
    tools = resolve_tools([lookup])
    out = await run_tool_call(tc("lookup", '{"zip_code": "12345"}'), tools)
    assert (out.message["content"], out.error) == ("str:12345", False)
    # A number where the schema says string is refused, not converted.
    out = await run_tool_call(tc("lookup", '{"zip_code": 12345}'), tools)
    assert (
        out.message["content"] == "Error: lookup: invalid arguments: zip_code: 12345 is not of type 'string'"
    )


@pytest.mark.parametrize(
    ("arguments", "error"),
    [
        ('{"city": "Paris", "day": 2}', "Additional properties are not allowed ('day' was unexpected)"),
        ('{"days": 2}', "'city' is a required property"),
        ('{"city": "Paris", "days": "2"}', "days: '2' is not of type 'integer'"),
        ('{"city": "Paris", "days": true}', "days: True is not of type 'integer'"),
        ('{"city": "Paris", "units": "kelvin"}', "units: 'kelvin' is not one of ['metric', 'imperial']"),
        ('{"city": "Paris", "tags": [1]}', "tags.0: 1 is not of type 'string'"),
        (
            '{"city": ["Paris"], "days": 2.5}',
            "city: ['Paris'] is not of type 'string'; days: 2.5 is not of type 'integer'",
        ),
    ],
)
async def test_invalid_arguments_are_errors_the_model_sees(arguments, error):
    out = await run_tool_call(tc("get_weather", arguments), resolve_tools([get_weather]))
    assert out.error is True
    assert out.message == {
        "role": "tool",
        "content": f"Error: get_weather: invalid arguments: {error}",
        "tool_call_id": "call_0",
        "name": "get_weather",
    }


async def test_optional_parameter_accepts_null():
    # transformers marks Optional parameters with OpenAPI's "nullable"; JSON null must validate.
    out = await run_tool_call(
        tc("get_weather", '{"city": "Oslo", "tags": null}'), resolve_tools([get_weather])
    )
    assert (out.message["content"], out.error) == ("Oslo|3|metric|None", False)
    out = await run_tool_call(
        tc("get_weather", '{"city": "Oslo", "tags": ["a"]}'), resolve_tools([get_weather])
    )
    assert out.message["content"] == "Oslo|3|metric|['a']"


def test_optional_enum_and_union_accept_null_and_nothing_else():
    def pick(mode: Literal["a", "b"] | None = None, key: int | str | None = None) -> str:
        """Pick.

        Args:
            mode: A mode.
            key: A key.
        """
        return "ok"

    t = Tool.from_function(pick)
    # The schema shown to the model is transformers' own; only validation reads "nullable".
    assert t.parameters["properties"]["mode"] == {
        "type": "string",
        "enum": ["a", "b"],
        "nullable": True,
        "description": "A mode.",
    }
    assert t.validate({"mode": None, "key": None}) == []
    assert t.validate({"mode": "c", "key": 1.5}) == [
        "key: 1.5 is not of type 'integer', 'string', 'null'",
        "mode: 'c' is not one of ['a', 'b', None]",
    ]


@pytest.mark.parametrize(
    ("arguments", "error"),
    [
        ("[1]", "arguments must be a JSON object, got an array"),
        ("null", "arguments must be a JSON object, got null"),
        (
            "{bad",
            "arguments are not valid JSON (Expecting property name enclosed in double quotes: line 1 column 2 (char 1))",
        ),
    ],
)
async def test_undecodable_arguments(arguments, error):
    out = await run_tool_call(tc("lookup", arguments), resolve_tools([lookup]))
    assert out.message["content"] == f"Error: lookup: {error}"


async def test_unknown_tool_lists_the_tools():
    out = await run_tool_call(tc("eval", '{"source": "1"}'), resolve_tools([lookup, get_weather]))
    assert out.message["content"] == "Error: unknown tool 'eval'. Available tools: lookup, get_weather."
    assert out.error is True and out.result is None


async def test_parse_args_hook_converts_and_its_value_error_reaches_the_model():
    def parse(args):
        if not args["zip_code"].isdigit():
            raise ValueError("zip_code must be digits")
        return {"zip_code": args["zip_code"].zfill(5)}

    tools = resolve_tools([Tool.from_function(lookup, parse_args=parse)])
    assert (await run_tool_call(tc("lookup", '{"zip_code": "123"}'), tools)).message["content"] == "str:00123"
    out = await run_tool_call(tc("lookup", '{"zip_code": "12a"}'), tools)
    assert out.message["content"] == "Error: lookup raised ValueError: zip_code must be digits"


# ---- running -------------------------------------------------------------------------------------


def where_sync() -> str:
    """Name the thread this runs on."""
    return str(threading.get_ident())


async def where_async() -> str:
    """Name the thread this runs on."""
    await asyncio.sleep(0)
    return str(threading.get_ident())


async def test_sync_tool_runs_in_a_worker_thread_and_async_tool_on_the_loop():
    tools = resolve_tools([where_sync, where_async])
    sync_out, async_out = await run_tool_calls(
        [tc("where_sync", "{}"), tc("where_async", "{}", "call_1")], tools
    )
    here = str(threading.get_ident())
    assert sync_out.message["content"] != here
    assert async_out.message["content"] == here
    assert [sync_out.message["tool_call_id"], async_out.message["tool_call_id"]] == ["call_0", "call_1"]


async def test_a_blocking_sync_tool_does_not_block_the_loop():
    def nap(seconds: float) -> str:
        """Sleep.

        Args:
            seconds: How long, in seconds.
        """
        time.sleep(seconds)
        return "rested"

    ticks = 0

    async def ticker():
        nonlocal ticks
        for _ in range(5):
            await asyncio.sleep(0.01)
            ticks += 1

    out, _ = await asyncio.gather(
        run_tool_call(tc("nap", '{"seconds": 0.3}'), resolve_tools([nap])), ticker()
    )
    assert out.message["content"] == "rested"
    assert ticks == 5  # the ticker finished while the tool slept in its thread


async def test_raising_tool_becomes_an_error_message():
    def boom(x: int) -> str:
        """Fail.

        Args:
            x: Ignored.
        """
        raise ZeroDivisionError("division by zero")

    out = await run_tool_call(tc("boom", '{"x": 1}'), resolve_tools([boom]))
    assert out.message["content"] == "Error: boom raised ZeroDivisionError: division by zero"
    assert out.error is True and out.result is None


async def test_tool_timeout_becomes_an_error_message():
    async def slow() -> str:
        """Never finishes in time."""
        await asyncio.sleep(10)
        return "late"

    start = time.perf_counter()
    out = await run_tool_call(tc("slow", "{}"), resolve_tools([slow]), timeout_s=0.05)
    assert time.perf_counter() - start < 2
    assert out.message["content"] == "Error: slow timed out after 0.05 s"
    assert out.error is True


async def test_a_tools_own_timeout_error_is_not_reported_as_ours():
    async def fetch() -> str:
        """Fail the way a socket read does."""
        raise TimeoutError("read timed out")

    out = await run_tool_call(tc("fetch", "{}"), resolve_tools([fetch]), timeout_s=30)
    assert out.message["content"] == "Error: fetch raised TimeoutError: read timed out"


async def test_tool_results_keep_their_flags():
    def check(ok: bool) -> ToolResult:
        """Report.

        Args:
            ok: Whether it worked.
        """
        return ToolResult("fine" if ok else "broken", is_error=not ok, info={"ok": ok})

    tools = resolve_tools([check])
    good, bad = await run_tool_calls(
        [tc("check", '{"ok": true}'), tc("check", '{"ok": false}', "call_1")], tools
    )
    assert (good.message["content"], good.error, good.result.info) == ("fine", False, {"ok": True})
    assert (bad.message["content"], bad.error) == ("broken", True)


def submit(answer: int) -> ToolResult:
    """Submit the final answer.

    Args:
        answer: The answer.
    """
    right = answer == 5
    return ToolResult(
        "correct" if right else "wrong", done=True, reward=1.5 if right else 0.0, info={"graded": True}
    )


def note(text: str) -> str:
    """Write a note.

    Args:
        text: The note.
    """
    return "noted"


class SubmitEnv(ChatEnv):
    def load_tasks(self, split):
        return [{"task_id": "sum", "question": "2 + 3?"}]

    def initial_messages(self, task):
        return [M.user(task["question"])]

    async def score(self, turn):
        return StepOutcome(reward=-1.0, terminated=True)


def test_tool_result_done_ends_the_episode_with_its_reward():
    env = SubmitEnv(tools=[note, submit], max_turns=5)
    try:
        env.reset(seed=0)
        obs, reward, terminated, truncated, info = env.step(
            '<tool_call>{"name": "note", "arguments": {"text": "x"}}</tool_call>'
        )
        assert (obs[0]["content"], reward, terminated, truncated) == ("noted", 0.0, False, False)
        obs, reward, terminated, truncated, info = env.step(
            '<tool_call>{"name": "submit", "arguments": {"answer": 5}}</tool_call>'
        )
        # The episode's second call attempt: ids count on over the episode.
        assert obs == [{"role": "tool", "content": "correct", "tool_call_id": "call_1", "name": "submit"}]
        assert (reward, terminated, truncated) == (1.5, True, False)
        assert info["graded"] is True and info["tool_errors"] == 0
    finally:
        env.close()
