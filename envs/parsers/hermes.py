"""The ``hermes`` format (NousResearch Hermes function calling; the Qwen2.5 / Qwen3 chat templates)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from chatgym.envs.parsers.base import CallList, ParsedAction, call_from_object, check_text, snippet
from chatgym.envs.parsers.lenient_json import decode_json, json_error, skip_ws
from chatgym.envs.parsers.quoting import backtick_run_end, code_span_end
from chatgym.envs.parsers.reasoning import DEFAULT_REASONING_TAGS, leading_reasoning_end, reasoning_end

_QUOTE_PAIRS = {'"': '"', "'": "'", "\u201c": "\u201d", "\u2018": "\u2019"}


@dataclass
class HermesParser:
    """``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` blocks (Hermes / Qwen).

    Each block is read with ``json.JSONDecoder.raw_decode`` from its start, so a ``</tool_call>``
    inside an argument string does not end it. A missing ``</tool_call>`` is tolerated when the JSON
    object is complete (generation often stops on that tag); text between the object and the closing
    tag is an error. Text after the last call is content.

    Tool-call syntax that is mentioned rather than used is content, not a call (nor an error):

    * a ``<tool_call>`` tag not followed by JSON (``{`` or ``[``), as in "I will wrap it in
      <tool_call> tags" — vLLM's hermes parser likewise returns such text as content — except an
      empty block, ``<tool_call></tool_call>`` (whitespace inside allowed): that is a malformed call;
    * a block inside a closed markdown code span or fenced code block (:mod:`.quoting`), as when
      the model shows a user the format — here we differ from vLLM, which reads calls anywhere;
    * a block set in quotes, ``"<tool_call>{...}</tool_call>"``.
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
        scan = cursor  # where the next tag is looked for; text skipped over (reasoning, code) is kept
        while (start := text.find(self.open_tag, scan)) != -1:
            think = text.find(tags[0], scan, start) if tags else -1
            tick = text.find("`", scan, start)
            if think != -1 and (tick == -1 or think < tick):  # a reasoning block first: skip it whole
                scan = reasoning_end(text, think, tags)
                continue
            if tick != -1:  # a code span or fence first: skip it whole (literal backticks: just them)
                scan = self._skip_code(text, tick, start, out.attempts + 1)
                continue
            block = self._read_block(text, start, out.attempts + 1)
            if block is None or self._quoted(text, start, block[0]):
                scan = start + len(self.open_tag)
                continue
            end, result, written, raw = block
            out.next_attempt()
            out.add(result, written=written, raw=raw)
            kept.append(text[cursor:start])
            cursor = scan = end
        kept.append(text[cursor:])
        return out.action("".join(kept).strip())

    def _skip_code(self, text: str, tick: int, start: int, n: int) -> int:
        """Where to look on after the backticks at ``tick`` (before the tag at ``start``): past their
        code span when it closes before the tag or holds the whole block; just past the backticks
        when they never close, or close inside the block (a stray backtick in the prose and one in
        an argument string are no code span around the call)."""
        span_end = code_span_end(text, tick)
        if span_end is None:
            return backtick_run_end(text, tick)
        if span_end > start:
            closing = span_end
            while text[closing - 1] == "`":
                closing -= 1
            block = self._read_block(text, start, n)
            if block is not None and block[0] > closing:
                return backtick_run_end(text, tick)
        return span_end

    @staticmethod
    def _quoted(text: str, start: int, end: int) -> bool:
        closer = _QUOTE_PAIRS.get(text[start - 1]) if start > 0 else None
        return closer is not None and text.startswith(closer, end)

    def _read_block(self, text: str, start: int, n: int) -> tuple[int, tuple[str, dict] | str, Any, str] | None:
        """Parse the block opening at ``start`` (call attempt ``n``): ``(end, call or error, the
        decoded value or None, the block's body text)``, where ``end`` is the index just past the
        block, or None when no JSON follows the tag."""
        body = start + len(self.open_tag)
        first = skip_ws(text, body)
        if text.startswith(self.close_tag, first):
            # An empty block is a call attempt, not a mention of the syntax: read as no call, it ended
            # the episode as a final answer where a broken call's error lets the model try again.
            error = f'tool call {n}: empty <tool_call> block (expected {{"name": ..., "arguments": {{...}}}})'
            return first + len(self.close_tag), error, None, ""
        if not text.startswith(("{", "["), first):
            return None
        try:
            value, end = decode_json(text, first)
        except ValueError as exc:
            body_end, stop = self._block_stop(text, body)
            raw = text[body:body_end]
            return stop, f"tool call {n}: invalid JSON in <tool_call> ({json_error(exc)}): {snippet(raw)}", None, raw
        raw = text[first:end]
        after = skip_ws(text, end)
        if text.startswith(self.close_tag, after):
            end = after + len(self.close_tag)
        else:
            close, reopen = text.find(self.close_tag, end), text.find(self.open_tag, end)
            if close != -1 and (reopen == -1 or close < reopen):
                error = (
                    f"tool call {n}: unexpected text after the JSON object in <tool_call>: "
                    f"{snippet(text[end:close])}"
                )
                return close + len(self.close_tag), error, value, text[body:close]
        return end, call_from_object(value, n), value, raw

    def _block_stop(self, text: str, body: int) -> tuple[int, int]:
        """Where an unparseable block's body ends and where the block ends: at its ``</tool_call>``,
        else at the next ``<tool_call>``, else at the end of the text."""
        close, reopen = text.find(self.close_tag, body), text.find(self.open_tag, body)
        if close != -1 and (reopen == -1 or close < reopen):
            return close, close + len(self.close_tag)
        stop = len(text) if reopen == -1 else reopen
        return stop, stop
