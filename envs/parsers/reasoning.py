"""Where reasoning (``<think>…</think>``) lies in an assistant turn, so calls inside it are skipped.

Rules (shared by every text parser):

* a ``<think>`` block runs to its ``</think>``; calls inside it are not calls;
* a ``</think>`` with no ``<think>`` before it closes a block the chat template opened in the prompt
  (DeepSeek-R1 and QwQ templates end the prompt with ``<think>``), so everything before it is
  reasoning. A ``</think>`` inside an argument string of a call with no reasoning before it is read
  the same way (the call is then lost), as vLLM does when its reasoning parser runs first;
* an unclosed ``<think>`` makes the rest of the turn reasoning — vLLM's DeepSeek-R1 reasoning parser
  does the same (no end tag: the whole output is reasoning).

``tags`` is ``(open, close)``, or None to turn reasoning handling off.
"""

from __future__ import annotations

from chatgym.envs.parsers.lenient_json import skip_ws

DEFAULT_REASONING_TAGS: tuple[str, str] = ("<think>", "</think>")


def leading_reasoning_end(text: str, tags: tuple[str, str] | None) -> int:
    """End of the reasoning opened by the chat template (a ``</think>`` before any ``<think>``), or 0."""
    if tags is None:
        return 0
    close = text.find(tags[1])
    if close == -1:
        return 0
    opened = text.find(tags[0])
    return close + len(tags[1]) if opened == -1 or close < opened else 0


def reasoning_end(text: str, start: int, tags: tuple[str, str]) -> int:
    """End of the ``<think>`` block opening at ``start``: past its ``</think>``, or the end of the text."""
    close = text.find(tags[1], start + len(tags[0]))
    return len(text) if close == -1 else close + len(tags[1])


def reasoning_spans(text: str, tags: tuple[str, str] | None) -> list[tuple[int, int]]:
    """``[start, end)`` of every reasoning block, in order."""
    if tags is None:
        return []
    spans, pos = [], leading_reasoning_end(text, tags)
    if pos:
        spans.append((0, pos))
    while (start := text.find(tags[0], pos)) != -1:
        pos = reasoning_end(text, start, tags)
        spans.append((start, pos))
    return spans


def answer_start(text: str, tags: tuple[str, str] | None) -> int:
    """Index of the first character after any reasoning (and whitespace) that opens the turn."""
    pos = skip_ws(text, leading_reasoning_end(text, tags))
    while tags is not None and text.startswith(tags[0], pos):
        pos = skip_ws(text, reasoning_end(text, pos, tags))
    return pos
