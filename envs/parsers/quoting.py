"""Markdown code spans and fenced code blocks in prose: tool-call syntax inside them is quoted, not a call.

A model that explains the call format to a user (``Write `<tool_call>{...}</tool_call>` to call a
tool``, or a fenced example) is not calling a tool. The spans follow CommonMark
(https://spec.commonmark.org/0.31.2/, sections 4.5 "Fenced code blocks" and 6.1 "Code spans") in the
parts that matter here:

* a fence is a run of at least three backticks that opens a line (after at most three spaces); it
  closes at a later line holding only a run of at least as many backticks (and spaces);
* a code span opens with a run of n backticks and closes at the next run of exactly n backticks; it
  does not cross a blank line (a paragraph break ends the paragraph it is in);
* backticks that never close are literal text. Unlike CommonMark, an unclosed fence does not run to
  the end of the text: a model that forgets to close a fence and then calls a tool is still calling.
"""

from __future__ import annotations

import re

_RUN = re.compile(r"`+")


def backtick_run_end(text: str, pos: int) -> int:
    """Index just past the run of backticks starting at ``text[pos]``."""
    return _RUN.match(text, pos).end()


def _opens_line(text: str, pos: int) -> bool:
    line_start = text.rfind("\n", 0, pos) + 1
    return pos - line_start <= 3 and text[line_start:pos].strip(" ") == ""


def code_span_end(text: str, pos: int) -> int | None:
    """End of the closed code span or fenced block whose backtick run starts at ``text[pos]``.

    Returns the index just past the closing run (a fence: past its closing line's backticks), or
    None when the backticks never close (they are then literal text).
    """
    run_end = backtick_run_end(text, pos)
    n = run_end - pos
    if n >= 3 and _opens_line(text, pos):
        close = re.compile(rf"^ {{0,3}}(`{{{n},}})[ \t]*$", re.M)
        first_line_end = text.find("\n", run_end)
        if first_line_end == -1:
            return None
        m = close.search(text, first_line_end + 1)
        return m.end(1) if m else None
    paragraph_end = text.find("\n\n", run_end)
    stop = len(text) if paragraph_end == -1 else paragraph_end
    for m in _RUN.finditer(text, run_end, stop):
        if m.end() - m.start() == n:
            return m.end()
    return None
