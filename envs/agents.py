"""The "other agents" of an episode: simulated users and judges.

A simulated user or a judge is a policy too. To an env it is any object with

    async respond(messages: list[Message]) -> Message

(:class:`Responder`): it reads the conversation from ITS OWN point of view (its system prompt, what
it was told as ``user`` turns, what it said as ``assistant`` turns) and returns its next turn as an
assistant message. ``chatgym.envs`` never imports the trainer: engine-backed responders (vLLM, a
server, transformers, an OpenAI-compatible API) live in ``chatgym.trainer.engines.responder``; the
scripted and rule-based ones for tests and offline defaults live here.

A responder that is itself being trained (a judge co-trained with the policy) also implements
``respond_with_trace(messages) -> (Message, trace)`` where ``trace`` is a JSON-serialisable dict
(``prompt_ids``, ``token_ids``, ``logprobs``, ``finish_reason``, ...). :func:`ask` calls it when it
exists, so an env can hand the other agent's own trajectories back in ``info``.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from typing import Any, Protocol, runtime_checkable

from chatgym.envs import messages as M
from chatgym.envs import tool_gate
from chatgym.envs.messages import Message, message_errors


@runtime_checkable
class Responder(Protocol):
    """Anything that answers a conversation with its next turn (see the module docstring)."""

    async def respond(self, messages: list[Message]) -> Message: ...


async def ask(responder: Responder, messages: list[Message]) -> tuple[Message, dict[str, Any] | None]:
    """Ask ``responder`` for its next turn; returns ``(message, trace)``.

    ``trace`` is the responder's own sample (token ids, logprobs) when it offers
    ``respond_with_trace``, else None.

    Raises:
        TypeError: the responder returned something that is not a valid message.
    """
    traced = getattr(responder, "respond_with_trace", None)
    async with tool_gate.slot("api"):
        if traced is not None:
            message, trace = await traced(list(messages))
        else:
            message, trace = await responder.respond(list(messages)), None
    errors = message_errors(message)
    if errors:
        raise TypeError(
            f"{type(responder).__name__}.respond returned an invalid message: {'; '.join(errors)}"
        )
    return message, trace


class ScriptedResponder:
    """Replies with fixed lines, in order; after the last one, ``then`` forever.

    A scripted stand-in for a simulated user (or a judge) in tests and offline defaults. It ignores
    what it is told; one instance serves one episode (it counts its replies).

    Args:
        replies: the lines to say, in order.
        then: what to say once ``replies`` are used up (e.g. a stop signal).
    """

    def __init__(self, replies: Sequence[str], then: str):
        self.replies = list(replies)
        self.then = then
        self.calls = 0

    async def respond(self, messages: list[Message]) -> Message:
        text = self.replies[self.calls] if self.calls < len(self.replies) else self.then
        self.calls += 1
        return M.assistant(text)


class RuleResponder:
    """A rule-based responder: ``fn(messages) -> str`` (sync or async) decides the reply text.

    Args:
        fn: the rule; gets the responder's view of the conversation.
        name: shown in ``repr`` (for traces and error messages).
    """

    def __init__(self, fn: Callable[[list[Message]], Any], name: str = "rule"):
        self.fn = fn
        self.name = name

    async def respond(self, messages: list[Message]) -> Message:
        out = self.fn(list(messages))
        if inspect.isawaitable(out):
            out = await out
        return out if isinstance(out, dict) else M.assistant(str(out))

    def __repr__(self) -> str:
        return f"RuleResponder({self.name})"


def flip_roles(messages: Sequence[Message]) -> list[Message]:
    """The conversation as the OTHER party sees it: assistant text turns become ``user`` turns and
    ``user`` turns become ``assistant`` turns; system messages, tool calls and tool results (which
    only the agent sees) are dropped. Used to show an agent's dialogue to a simulated user."""
    out: list[Message] = []
    for m in messages:
        if m["role"] == "assistant" and not m.get("tool_calls") and m["content"].strip():
            out.append(M.user(m["content"]))
        elif m["role"] == "user":
            out.append(M.assistant(m["content"]))
    return out
