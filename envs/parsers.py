"""Tool-call parsers: turn an assistant turn's text into (content, tool calls, errors).

PLACEHOLDER interface: the full set of formats (hermes, json, pythonic, openai) is being written.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Protocol

from .messages import ToolCall, make_tool_call


@dataclass
class ParsedAction:
    content: str
    calls: list[ToolCall] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


class ToolCallParser(Protocol):
    name: str

    def parse(self, text: str) -> ParsedAction: ...


class HermesParser:
    name = "hermes"
    _re = re.compile(r"<tool_call>(.*?)</tool_call>", re.S)

    def parse(self, text: str) -> ParsedAction:
        calls, errors = [], []
        for i, m in enumerate(self._re.finditer(text)):
            try:
                obj = json.loads(m.group(1))
                calls.append(make_tool_call(obj["name"], obj.get("arguments", {}), f"call_{i}"))
            except Exception as exc:
                errors.append(str(exc))
        return ParsedAction(self._re.sub("", text).strip(), calls, errors)


PARSERS: dict[str, type] = {"hermes": HermesParser}


def get_parser(name: str) -> ToolCallParser:
    try:
        return PARSERS[name]()
    except KeyError:
        raise ValueError(f"unknown tool-call parser {name!r}; choose one of {sorted(PARSERS)}") from None
