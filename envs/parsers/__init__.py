"""Tool-call parsers: an assistant turn's text -> ``ParsedAction(content, calls, errors)``.

Formats, chosen by name with :func:`get_parser`:

* ``hermes`` — Hermes / Qwen2.5 / Qwen3 (NousResearch Hermes function-calling format, used by the
  Qwen chat templates): ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` blocks anywhere
  in the text, one JSON object per block — except where the syntax is mentioned rather than used:
  a tag not followed by JSON, a block inside markdown code (`` `...` `` or a closed fence) or in
  quotes is text (:mod:`.quoting`); an empty block, ``<tool_call></tool_call>``, is a malformed call.
* ``json`` — Llama 3.1 / 3.3 JSON tool calls (Meta's Llama 3 prompt format): the content, after an
  optional ``<|python_tag|>``, is a JSON object ``{"name": ..., "parameters": {...}}`` (``"arguments"``
  is accepted too), a list of them, or several separated by ``;`` or whitespace. Alternatively the
  calls sit in fenced code blocks tagged ``json``. Unfenced JSON must open the content: JSON in the
  middle of prose is prose. Only objects of the call shape are calls (``name`` plus ``arguments`` /
  ``parameters``, no other keys but ``type`` / ``id``): ``{"name": "my-app", "version": "1.0.0"}``
  or a tool's definition (with a ``description``) is data, left in the content.
* ``pythonic`` — Llama 3.2 / Llama 4 pythonic calls: the content opens with a Python list of calls,
  ``[get_weather(city="Paris"), now()]`` (optionally inside ``<|python_start|>…<|python_end|>``).
  The list is parsed with :mod:`ast` and each keyword value with ``ast.literal_eval``; nothing is
  ever evaluated, and only keyword arguments are accepted (the parser does not know the schemas).
* ``openai`` — calls already structured by an OpenAI-compatible server: :func:`parse_openai_message`
  validates a Message's ``tool_calls``; ``parse(text)`` finds no calls in plain text.

What every parser guarantees:

* ``calls`` are OpenAI-shaped (:func:`chatgym.envs.messages.make_tool_call`): ``arguments`` is the
  JSON text of an object and each call's id is ``call_<position>``, its 0-based place among the
  turn's call attempts, malformed ones included (the ``openai`` parser keeps a server's own ids,
  each the first time it appears: a repeat gets ``call_<position>`` too).
  The parser sees one turn; the env and the gateway count on over the episode (session):
  ``parsed.numbered_after(history)`` makes the id ``call_<n>``,
  ``n`` the attempt's place among all the episode's call attempts, or the next number whose id is
  free where that one is already used (a server's or a client's id in the history or the turn), and
  replaces a server's id the history already holds the same way, so
  no two calls of an episode share an id (and a replayed episode gets the same ids). The parser does not know the env's tools: a call to an unknown
  name is returned as written and rejected, with the list of tools, by ``tools.run_tool_call``.
* ``arguments`` given as a string that holds JSON (``"arguments": "{\\"x\\": 1}"``) are decoded once;
  arguments that are (or decode to) an array, a string, a number, a boolean or null are not a call:
  they become an entry of ``errors``. A missing ``arguments`` key (or an empty string) means ``{}``.
* ``content`` is the text outside the call blocks, stripped; reasoning is kept in it.
* ``errors`` are short messages for the model, ``"tool call N ..."`` (N counts call attempts from 1);
  ``error_positions`` says where each stood among the attempts, so the env answers every call, errors
  included, in the order written (``ParsedAction.in_order``). ``error_calls`` records each malformed
  call as written (name, or ``"invalid"``; arguments as text; its own id), and
  ``ParsedAction.all_calls()`` is every attempt in order: the history's ``tool_calls``, which the
  turn's ``tool`` messages answer one to one. ``parse`` never raises on any ``str``.

Reasoning (``reasoning_tags``, default ``("<think>", "</think>")``; ``None`` turns it off): calls
inside ``<think>…</think>`` are not calls, and an unclosed ``<think>`` makes the rest of the turn
reasoning, as in vLLM's reasoning parsers (rules in :mod:`.reasoning`).

JSON leniency (a documented choice, :mod:`.lenient_json`): raw newlines inside strings are accepted,
and a backslash that starts no valid JSON escape (``"\\d+"``, a Windows path) is read as a literal
backslash, so the call goes through; ``NaN`` / ``Infinity`` are rejected.

Modules: :mod:`.base` (``ParsedAction``, shared checks), one module per format (:mod:`.hermes`,
:mod:`.llama_json`, :mod:`.pythonic`, :mod:`.openai`), :mod:`.reasoning`, :mod:`.lenient_json`,
:mod:`.quoting`.
"""

from __future__ import annotations

from typing import Any

from chatgym.envs.parsers.base import (
    ParsedAction,
    PlainText,
    ToolCallParser,
    call_ids,
    calls_before,
    normalise_arguments,
    unique_call_ids,
)
from chatgym.envs.parsers.hermes import HermesParser
from chatgym.envs.parsers.llama_json import JsonParser
from chatgym.envs.parsers.openai import OpenAIParser, parse_openai_message, parse_openai_tool_calls
from chatgym.envs.parsers.pythonic import PythonicParser
from chatgym.envs.parsers.reasoning import DEFAULT_REASONING_TAGS

__all__ = [
    "DEFAULT_REASONING_TAGS",
    "PARSERS",
    "HermesParser",
    "JsonParser",
    "OpenAIParser",
    "ParsedAction",
    "PlainText",
    "PythonicParser",
    "ToolCallParser",
    "call_ids",
    "calls_before",
    "get_parser",
    "normalise_arguments",
    "parse_openai_message",
    "parse_openai_tool_calls",
    "unique_call_ids",
]

PARSERS: dict[str, type] = {
    "hermes": HermesParser,
    "json": JsonParser,
    "pythonic": PythonicParser,
    "openai": OpenAIParser,
}


def get_parser(name: str, **options: Any) -> ToolCallParser:
    """A parser by format name (a key of ``PARSERS``); ``options`` go to its constructor
    (e.g. ``reasoning_tags=None``).

    Raises:
        ValueError: unknown ``name``, naming the known formats.
    """
    try:
        cls = PARSERS[name]
    except (KeyError, TypeError):
        raise ValueError(f"unknown tool-call parser {name!r}; choose one of {sorted(PARSERS)}") from None
    return cls(**options)
