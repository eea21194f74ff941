"""``ChatEnv``: the Gymnasium environment every chatgym env derives from.

Observations are chat messages, actions are assistant turns. ``step`` returns only the NEW messages
(tool results, a user's reply, a judge's feedback) — the collector appends them to the token stream
as a chat-template delta, so the history is never re-rendered. ``areset``/``astep`` are the real
implementation; ``reset``/``step`` run them on a private event loop so a plain Gymnasium loop works.

A subclass provides the data and the scoring:

* ``load_tasks(split) -> Sequence[dict]`` — the dataset rows of a split;
* ``initial_messages(task) -> list[Message]`` — the opening system/user messages;
* ``react(turn) -> StepOutcome`` — what happens after the assistant speaks (not to be confused with
  ``Responder.respond(messages)``, a simulated user or judge answering a conversation). The default runs the
  parsed tool calls and, when the assistant called no tool, ends the episode with ``score(turn)``.

**The success contract.** Every step's ``info`` has ``"success"``: ``True``/``False`` on the step that
decides a task that defines success (right answer, tests pass, database matches — set by the env's
scoring), ``None`` otherwise (a step before the end, or a task without a success definition, e.g. a
judged rating; :meth:`ChatEnv.astep` fills ``None`` when the env did not say). The rollout side copies
it into ``Trajectory.success``; training accuracy, eval pass@k and the leaderboard read that field.
"""

from __future__ import annotations

import asyncio
import difflib
import functools
import numbers
import os
import threading
from collections.abc import Coroutine, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, TypeVar

import gymnasium as gym

from chatgym.envs import messages as M
from chatgym.envs.messages import Message, message_errors
from chatgym.envs.parsers import (
    ParsedAction,
    ToolCallParser,
    get_parser,
    parse_openai_message,
)
from chatgym.envs.spaces import ActionSpace, MessagesSpace
from chatgym.envs.tool_config import LoadedTools, load_tools, parse_tools_config, read_tools_config
from chatgym.envs.tools import (
    Tool,
    ToolOutcome,
    register_tool,
    resolve_tools,
    run_tool_calls,
    tool_error_kinds,
)

T = TypeVar("T")


@functools.cache
def load_prompt(package: str, name: str) -> str:
    """Text of ``prompts/<name>`` inside the env family's package ``package`` (package data, UTF-8),
    without surrounding whitespace: the one reader of the envs' prompt files. Read once per process
    (an env is made per episode; on a GPU its file reads held the engine's interpreter lock).

    Args:
        package: the family's package, e.g. ``"chatgym.envs.math"`` (an env module passes its
            ``__package__``); its folder holds ``prompts/``.
        name: the file name, e.g. ``"math_system.txt"``.

    Raises:
        FileNotFoundError: no such prompt file.
    """
    from importlib import resources

    return resources.files(package).joinpath("prompts", name).read_text(encoding="utf-8").strip()


@dataclass
class AssistantTurn:
    """One assistant turn after parsing: the message as stored in the history, and the parse.

    ``message["tool_calls"]`` is ``parsed.all_calls()``: every call attempt in the order written, a
    malformed one recorded as written (name, or ``"invalid"``; arguments as text) under the id its
    error ``tool`` message answers, so the turn's tool messages pair with its calls one to one."""

    message: Message
    raw_text: str
    parsed: ParsedAction


@dataclass
class StepOutcome:
    """What ``react`` decides: new observation messages, reward, whether the episode ended."""

    messages: list[Message] = field(default_factory=list)
    reward: float = 0.0
    terminated: bool = False
    info: dict[str, Any] = field(default_factory=dict)


class ChatEnv(gym.Env):
    """Base class for chat environments (see the module docstring for the subclass hooks).

    Args:
        split: which split of the env's dataset ``reset`` draws tasks from.
        tools: Tools, registered tool names or documented functions offered to the model.
        parser: tool-call format of the model's text, by name (see ``chatgym.envs.parsers``).
        max_turns: assistant turns before the episode is truncated.
        tool_timeout_s: wall-clock limit of one tool call, in seconds.
        render_mode: ``None`` or ``"ansi"`` (``render`` returns the transcript as text).
        tools_config: a YAML tool configuration (path, or the parsed mapping) whose tools (native
            functions, MCP servers) are added to the env's own; see ``chatgym.envs.tool_config``.
            MCP servers it declares are started here and stopped by ``close()``.

    Attributes:
        reset_options: the keys ``reset(options=...)`` accepts (``task``, ``task_index``, and a
            subclass's own, such as the visual envs' ``image_size``); any other key is a ValueError.
        image_observations: True for an env whose observations carry images (a vision-language
            model's env); ``chatgym eval`` leaves it out of ``--env all`` for a text-only model.
    """

    metadata: ClassVar[dict[str, Any]] = {"render_modes": ["ansi"], "render_fps": None}
    image_observations: ClassVar[bool] = False
    # The keys of ``reset(options=...)`` the env reads; a subclass that reads more adds its own.
    reset_options: ClassVar[frozenset[str]] = frozenset({"task", "task_index"})

    def __init__(
        self,
        *,
        split: str = "test",
        tools: Iterable[Tool | str | Any] = (),
        parser: str | ToolCallParser = "hermes",
        max_turns: int = 8,
        tool_timeout_s: float = 60.0,
        render_mode: str | None = None,
        tools_config: str | os.PathLike[str] | dict[str, Any] | None = None,
    ):
        if max_turns < 1:
            raise ValueError(f"max_turns must be >= 1, got {max_turns}")
        if render_mode not in (None, "ansi"):
            raise ValueError(f"render_mode must be None or 'ansi', got {render_mode!r}")
        self.split = split
        self.tool_map: dict[str, Tool] = resolve_tools(tools)
        self._loaded_tools: LoadedTools | None = None
        if tools_config is not None:
            self._add_configured_tools(tools_config)
        self.parser: ToolCallParser = get_parser(parser) if isinstance(parser, str) else parser
        self.max_turns = max_turns
        self.tool_timeout_s = tool_timeout_s
        self.render_mode = render_mode
        self.observation_space = MessagesSpace()
        self.action_space = ActionSpace()
        self.messages: list[Message] = []
        self.task: dict[str, Any] | None = None
        self.turn = 0
        self._done = False
        self._tasks: Sequence[dict[str, Any]] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread: threading.Thread | None = None

    def _add_configured_tools(self, tools_config: str | os.PathLike[str] | dict[str, Any]) -> None:
        config = (
            parse_tools_config(tools_config)
            if isinstance(tools_config, dict)
            else read_tools_config(tools_config)
        )
        loaded = load_tools(config, register=False)
        clash = sorted(set(self.tool_map) & {t.name for t in loaded.tools})
        if clash:
            loaded.close()
            raise ValueError(
                f"{config.source}: tool {clash[0]!r} is already one of {type(self).__name__}'s tools"
            )
        for t in loaded.tools:
            register_tool(t, overwrite=True)
        self._loaded_tools = loaded
        self.tool_map.update({t.name: t for t in loaded.tools})

    # ---- subclass hooks ---------------------------------------------------------------------

    def load_tasks(self, split: str) -> Sequence[dict[str, Any]]:
        raise NotImplementedError(f"{type(self).__name__} has no dataset; pass options={{'task': row}}")

    def initial_messages(self, task: dict[str, Any]) -> list[Message]:
        raise NotImplementedError

    async def on_reset(self, task: dict[str, Any]) -> None:
        """Per-episode set-up (open a sandbox session, copy a database, ...)."""

    async def score(self, turn: AssistantTurn) -> StepOutcome:
        """Reward for a final answer (a turn with no tool call). Default: 0, episode ends."""
        return StepOutcome(reward=0.0, terminated=True)

    async def react(self, turn: AssistantTurn) -> StepOutcome:
        """Run the turn's tool calls; a turn without calls is the final answer and is scored.

        ``info["tool_errors"]`` counts the failed calls and ``info["tool_error_kinds"]`` splits them
        by kind (:data:`chatgym.envs.tools.TOOL_ERROR_KINDS`)."""
        if not turn.parsed.calls and not turn.parsed.errors:
            return await self.score(turn)
        outcomes = await self.run_tools(turn)
        out = StepOutcome(messages=[o.message for o in outcomes])
        out.info["tool_errors"] = sum(o.error for o in outcomes)
        out.info["tool_error_kinds"] = tool_error_kinds(outcomes)
        for o in outcomes:
            if o.result is not None:
                out.reward += o.result.reward or 0.0
                out.terminated |= o.result.done
                out.info.update(o.result.info)
        return out

    def reference_action(self) -> str | Message:
        """The scripted reference policy's next action for the current state (after ``reset``).

        Envs that know a correct behaviour (a canonical solution, the task's expected tool calls, the
        gold answer) override this; evaluation uses it as the "reference" row of the leaderboard and
        tests use it to show the env's maximum reward is reachable.

        Returns:
            An assistant turn: text, or an assistant message dict (with ``tool_calls``).

        Raises:
            NotImplementedError: the env has no scripted reference policy.
        """
        raise NotImplementedError(f"{type(self).__name__} has no scripted reference policy")

    # ---- helpers for subclasses -------------------------------------------------------------

    @property
    def tools(self) -> list[dict[str, Any]]:
        """OpenAI tool schemas of the tools offered in this env."""
        return [t.schema for t in self.tool_map.values()]

    @property
    def tasks(self) -> Sequence[dict[str, Any]]:
        if self._tasks is None:
            self._tasks = self.load_tasks(self.split)
        return self._tasks

    async def run_tools(self, turn: AssistantTurn) -> list[ToolOutcome]:
        """Run parsed calls; parse errors become error ``tool`` messages the model can read.

        Returns one outcome per call attempt, in the order the calls were written (malformed ones
        included), outcome ``i`` answering ``turn.parsed.all_calls()[i]`` by its id: templates pair
        tool results with calls by position, so an error answering a first, malformed call must come
        before the result of a second, valid one.
        """
        parsed = turn.parsed
        ran = await run_tool_calls(parsed.calls, self.tool_map, self.tool_timeout_s)
        names = ", ".join(self.tool_map) or "(none)"
        outcomes: list[ToolOutcome] = []
        for kind, i in parsed.in_order():
            if kind == "call":
                outcomes.append(ran[i])
                continue
            text = f"Error: could not parse tool call: {parsed.errors[i]}. Available tools: {names}."
            # The error answers the malformed call's own id (the server's, else its position's), which
            # the history's assistant turn records at the same place: strict chat APIs reject a tool
            # message whose id matches no call of the turn.
            call_id = parsed.error_call(i)["id"]
            outcomes.append(ToolOutcome(M.tool(text, call_id), error=True, kind="parse_error"))
        return outcomes

    # ---- the Gymnasium API (async first) ----------------------------------------------------

    def _check_options(self, options: Mapping[str, Any] | None) -> None:
        # Subclasses that read an option before ChatEnv.areset call this first (the visual envs).
        if options is not None and not isinstance(options, Mapping):
            raise TypeError(f"{type(self).__name__}: options must be a dict, got {type(options).__name__}")
        # A misspelt key ("tsk") read as no option at all gave a random task without a word.
        unknown = sorted(map(str, set(options or {}) - self.reset_options))
        if unknown:
            close = difflib.get_close_matches(unknown[0], sorted(self.reset_options), n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise ValueError(
                f"{type(self).__name__}: unknown reset option {unknown[0]!r}{hint}; the options it reads: "
                f"{', '.join(map(repr, sorted(self.reset_options)))}"
            )

    def _pick_task(self, options: dict[str, Any] | None) -> tuple[dict[str, Any], int | None]:
        options = options or {}
        if "task" in options and "task_index" in options:  # one of them would be ignored without a word
            raise ValueError(f"{type(self).__name__}: give options['task'] or options['task_index'], not both")
        if "task" in options:
            if not isinstance(options["task"], Mapping):  # dict("what is 1+1") fails with no word of the task
                raise TypeError(f"{type(self).__name__}: options['task'] must be a task row (a dict of the "
                                f"env's fields), got {type(options['task']).__name__}: {options['task']!r:.80}")
            return dict(options["task"]), None
        n = len(self.tasks)
        if n == 0:
            raise ValueError(f"{type(self).__name__}: split {self.split!r} has no tasks")
        if "task_index" in options:
            i = options["task_index"]
            if isinstance(i, bool) or not isinstance(i, numbers.Integral):  # "3", 1.5, True played a task
                raise TypeError(f"{type(self).__name__}: options['task_index'] must be an int, got {i!r}")
            i = int(i)
            if not 0 <= i < n:
                raise IndexError(f"task_index {i} out of range for split {self.split!r} ({n} tasks)")
        else:
            i = int(self.np_random.integers(n))
        return self.tasks[i], i

    async def areset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[list[Message], dict[str, Any]]:
        """Start an episode: a task by ``options`` (``{"task_index": i}`` of the split, ``{"task": row}``,
        or none: one drawn with the seed), and its opening messages.

        Raises:
            TypeError: ``options`` is not a dict, ``options["task"]`` is no task row (a dict), or
                ``options["task_index"]`` is no int (NumPy's ints are).
            ValueError: ``options`` holds a key the env does not read (``reset_options``: a misspelt
                key is not ignored), or both ``task`` and ``task_index``, or the split has no tasks; a
                subclass's ``on_reset`` may raise one for a task row it cannot use.
            IndexError: ``task_index`` is out of the split's range.
        """
        self._check_options(options)
        gym.Env.reset(self, seed=seed)
        self.task, index = self._pick_task(options)
        self.turn = 0
        self._done = False
        await self.on_reset(self.task)
        self.messages = list(self.initial_messages(self.task))
        info = {"task_id": self.task.get("task_id", index), "task_index": index, "tools": self.tools}
        return [dict(m) for m in self.messages], info

    def _to_turn(self, action: str | Message) -> AssistantTurn:
        if isinstance(action, dict) and action.get("role") == "assistant" and action.get("content") is None:
            # OpenAI-compatible servers send `"content": null` next to tool_calls (or with nothing).
            action = {**action, "content": ""}
        if isinstance(action, str):
            parsed = self.parser.parse(action)
            raw = action
        elif (isinstance(action, dict) and action.get("role") == "assistant"
              and not message_errors({**action, "tool_calls": None})):
            # Content parts (OpenAI's list form) are read as their text: the parsers and the
            # scorers read text, and a list reached them as a TypeError out of step().
            raw = M.content_text(action.get("content") or "")
            action = {**action, "content": raw}
            # Calls already structured by an OpenAI-compatible server get the same argument checks; a
            # malformed list is the model's and is answered with the parse errors, never raised.
            structured = action.get("tool_calls") not in (None, [])
            parsed = parse_openai_message(action) if structured else self.parser.parse(raw)
        else:
            raise TypeError(f"action must be a str or an assistant Message, got {action!r:.200}")
        # Ids count on over the episode and step around every id it used: a client may pair
        # tool_call_ids with calls across the whole history.
        parsed = parsed.numbered_after(self.messages)
        # Every attempt, a malformed one as written: the tool messages that follow pair with these
        # calls one to one, in order and by id.
        return AssistantTurn(M.assistant(parsed.content, parsed.all_calls() or None), raw, parsed)

    async def astep(self, action: str | Message) -> tuple[list[Message], float, bool, bool, dict[str, Any]]:
        if self.task is None:
            raise RuntimeError("call reset() before step()")
        if self._done:
            # Stepping a finished episode would score the task again and count its reward twice.
            raise RuntimeError("the episode has ended (terminated or truncated); call reset() before step()")
        turn = self._to_turn(action)
        self.messages.append(turn.message)
        self.turn += 1
        out = await self.react(turn)
        self.messages.extend(out.messages)
        truncated = not out.terminated and self.turn >= self.max_turns
        self._done = out.terminated or truncated
        info = {"turn": self.turn, "tool_calls": len(turn.parsed.calls), **out.info}
        info.setdefault("tool_errors", 0)
        # The success contract: every step states it; None until (or unless) the task defines it.
        info.setdefault("success", None)
        return [dict(m) for m in out.messages], float(out.reward), bool(out.terminated), truncated, info

    # ---- sync wrappers ----------------------------------------------------------------------

    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        # One private loop per env, on its own thread: works inside Jupyter's running loop too, and
        # keeps loop-bound resources (subprocess sessions) on the same loop across calls.
        if self._loop is None:
            self._loop = asyncio.new_event_loop()
            self._loop_thread = threading.Thread(
                target=self._loop.run_forever, daemon=True, name="chatgym-env"
            )
            self._loop_thread.start()
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        """:meth:`areset`, run on the env's own loop (the same errors)."""
        return self._run(self.areset(seed=seed, options=options))

    def step(self, action: str | Message):
        return self._run(self.astep(action))

    async def aclose(self) -> None:
        """Release per-env resources (sandbox sessions, connections). Overrides must also
        ``await super().aclose()``: it stops the MCP servers started for ``tools_config``."""
        if self._loaded_tools is not None:
            await asyncio.to_thread(self._loaded_tools.close)

    def close(self) -> None:
        self._run(self.aclose())
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._loop.stop)
            if self._loop_thread is not None:
                self._loop_thread.join(timeout=5)
            self._loop.close()
            self._loop = None
        super().close()

    def render(self) -> str | None:
        if self.render_mode != "ansi":
            return None
        return "\n".join(f"[{m['role']}] {m['content']}" for m in self.messages)
