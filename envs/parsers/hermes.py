"""The ``hermes`` format (NousResearch Hermes function calling; the Qwen2.5 / Qwen3 chat templates)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from .base import CallList, ParsedAction, call_from_object, check_text, snippet
from .lenient_json import decode_json, json_error, skip_ws
from .reasoning import DEFAULT_REASONING_TAGS, leading_reasoning_end, reasoning_end


@dataclass
class HermesParser:
    """``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` blocks (Hermes / Qwen).

    Each block is read with ``json.JSONDecoder.raw_decode`` from its start, so a ``</tool_call>``
    inside an argument string does not end it. A missing ``</tool_call>`` is tolerated when the JSON
    object is complete (generation often stops on that tag); text between the object and the closing
    tag is an error. Text after the last call is content.
    """

    name: ClassVar[str] = "hermes"
    open_tag: ClassVar[str] = "<tool_call>"
    close_tag: ClassVar[str] = "</tool_call>"
    reasoning_tags: tuple[str, str] | None = DEFAULT_REASONING_TAGS

    def parse(self, text: str) -> ParsedAction:
        check_text(text)
        tags, out = self.reasoning_tags, CallList()
        cursor = leading_reasoning_end(text, tags)
        kept = [text[:cursor]]
        while (start := text.find(self.open_tag, cursor)) != -1:
            think = text.find(tags[0], cursor, start) if tags else -1
            if think != -1:  # a reasoning block opens before the next call: skip it whole
                end = reasoning_end(text, think, tags)
                kept.append(text[cursor:end])
                cursor = end
                continue
            kept.append(text[cursor:start])
            cursor = self._read_block(text, start, out)
        kept.append(text[cursor:])
        return out.action("".join(kept).strip())

    def _read_block(self, text: str, start: int, out: CallList) -> int:
        """Parse the block opening at ``start`` into ``out``; return the index just past it."""
        n = out.next_attempt()
        body = start + len(self.open_tag)
        try:
            value, end = decode_json(text, skip_ws(text, body))
        except ValueError as exc:
            body_end, stop = self._block_stop(text, body)
            out.add(
                f"tool call {n}: invalid JSON in <tool_call> ({json_error(exc)}): {snippet(text[body:body_end])}"
            )
            return stop
        after = skip_ws(text, end)
        if text.startswith(self.close_tag, after):
            end = after + len(self.close_tag)
        else:
            close, reopen = text.find(self.close_tag, end), text.find(self.open_tag, end)
            if close != -1 and (reopen == -1 or close < reopen):
                out.add(
                    f"tool call {n}: unexpected text after the JSON object in <tool_call>: "
                    f"{snippet(text[end:close])}"
                )
                return close + len(self.close_tag)
        out.add(call_from_object(value, n))
        return end

    def _block_stop(self, text: str, body: int) -> tuple[int, int]:
        """Where an unparseable block's body ends and where the block ends: at its ``</tool_call>``,
        else at the next ``<tool_call>``, else at the end of the text."""
        close, reopen = text.find(self.close_tag, body), text.find(self.open_tag, body)
        if close != -1 and (reopen == -1 or close < reopen):
            return close, close + len(self.close_tag)
        stop = len(text) if reopen == -1 else reopen
        return stop, stop
