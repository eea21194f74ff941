"""Chat-template deltas: the token ids that new messages add to a running token stream.

The collector never re-tokenizes what the model sampled. After a completion it appends only the
tokens of what came after: the rest of the template's end-of-turn text, then the new observation
messages, then the next assistant header. Those tokens are the *delta*

    render(history + new, add_generation_prompt=True)  minus  render(history)

where ``history`` already ends with the assistant turn just sampled. The longer rendering must start
with the shorter one (the template is *prefix-preserving*); :meth:`ChatRenderer.delta_text` checks
that on every call and raises :class:`TemplateError` when it does not hold.

What sits between a completion and the next observation. A template closes an assistant turn with a
fixed *turn suffix*, found by :func:`probe_template` (ChatML: ``<|im_end|>\\n``, ids ``[2, 198]`` on
SmolLM2). Its first token must be one of the EOS ids, so generation stops at the turn's end. Then:

* the completion ended with the suffix's first token (``<|im_end|>``): the closing tokens are the
  rest of the suffix (``\\n``);
* the completion ended with another EOS id, or was cut by ``max_tokens`` without any EOS: the
  closing tokens are the whole suffix (``<|im_end|>\\n``), so the stream has a well-formed turn end.

Closing tokens are observation tokens (loss mask 0). The same rendering of ``history`` that yields the
delta also contains the assistant turn, so the delta never depends on how the template prints the
assistant's content (some templates re-format tool calls) — only on what follows it.

The idea of a text-level delta over a prefix-preserving template is shared with SkyRL's
``SkyRLGymGenerator`` (token-in-token-out) and verl's multi-turn rollout; the probe, the checks and the
closing-token rule here are our own.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from chatgym.envs.messages import Message


class TemplateError(ValueError):
    """The chat template cannot produce token-exact deltas (not prefix-preserving, bad turn end)."""


# A small multi-turn tool conversation: system, user, a tool call, its result, an answer, a second
# user turn, two tool results in one step and a final answer. Every place the collector cuts a
# delta (after each assistant turn) is checked.
PROBE_TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Current weather of a city.",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string", "description": "City name."}},
                "required": ["city"],
            },
        },
    }
]
_CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "%s"}}\n</tool_call>'
PROBE_CONVERSATION: list[Message] = [
    {"role": "system", "content": "You are a weather assistant."},
    {"role": "user", "content": "Weather in Paris?"},
    {"role": "assistant", "content": _CALL % "Paris"},
    {"role": "tool", "content": "sunny, 21 C", "tool_call_id": "call_0", "name": "get_weather"},
    {"role": "assistant", "content": "It is sunny in Paris."},
    {"role": "user", "content": "And Rome and Oslo?"},
    {"role": "assistant", "content": _CALL % "Rome" + "\n" + _CALL % "Oslo"},
    {"role": "tool", "content": "rain, 15 C", "tool_call_id": "call_0", "name": "get_weather"},
    {"role": "tool", "content": "snow, -3 C", "tool_call_id": "call_1", "name": "get_weather"},
    {"role": "assistant", "content": "Rome: rain. Oslo: snow."},
]


@dataclass
class TemplateProbe:
    """What :func:`probe_template` learned about a template.

    Attributes:
        turn_suffix: text the template writes after an assistant message's content.
        turn_suffix_ids: its token ids (``list[int]``); ``turn_suffix_ids[0]`` is an EOS id.
        renders_tools: whether ``tools=`` changes the rendering (False: the template ignores tools).
        checked_cuts: number of delta cut points verified in the probe conversation.
    """

    turn_suffix: str
    turn_suffix_ids: list[int]
    renders_tools: bool
    checked_cuts: int


@dataclass
class ChatRenderer:
    """Renders messages with a tokenizer's chat template and computes token deltas.

    Args:
        tokenizer: a Hugging Face tokenizer (``apply_chat_template``, ``encode``, ``decode``).
        chat_template: Jinja template text overriding the tokenizer's own (None: use the tokenizer's).
    """

    tokenizer: Any
    chat_template: str | None = None
    _tools_warned: bool = field(default=False, repr=False)

    def render(
        self,
        messages: Sequence[Message],
        tools: Sequence[dict[str, Any]] | None = None,
        add_generation_prompt: bool = False,
    ) -> str:
        """The template's text for ``messages`` (``tools``: OpenAI tool schemas, or None)."""
        return self.tokenizer.apply_chat_template(
            list(messages),
            tools=list(tools) if tools else None,
            chat_template=self.chat_template,
            add_generation_prompt=add_generation_prompt,
            tokenize=False,
        )

    def encode(self, text: str) -> list[int]:
        # Rendered text already holds every special token the template wants (BOS included).
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def prompt_ids(
        self, messages: Sequence[Message], tools: Sequence[dict[str, Any]] | None = None
    ) -> list[int]:
        """Token ids of the opening messages followed by the assistant header."""
        return self.encode(self.render(messages, tools, add_generation_prompt=True))

    def delta_text(
        self,
        history: Sequence[Message],
        new: Sequence[Message],
        tools: Sequence[dict[str, Any]] | None = None,
    ) -> str:
        """Text that ``new`` (plus the next assistant header) adds after ``history``.

        Raises:
            TemplateError: if ``render(history)`` is not a prefix of ``render(history + new)``.
        """
        before = self.render(history, tools)
        after = self.render([*history, *new], tools, add_generation_prompt=True)
        if not after.startswith(before):
            at = _first_difference(before, after)
            raise TemplateError(
                "chat template is not prefix-preserving: rendering the history plus "
                f"{len(new)} new message(s) changes earlier text at character {at}: "
                f"{before[max(0, at - 40) : at + 40]!r} became {after[max(0, at - 40) : at + 40]!r}"
            )
        return after[len(before) :]

    def warn_if_tools_ignored(self, probe: TemplateProbe, tools: Sequence[dict[str, Any]] | None) -> None:
        if tools and not probe.renders_tools and not self._tools_warned:
            self._tools_warned = True
            warnings.warn(
                "the chat template ignores tools=: the model never sees the tool schemas unless the "
                "env writes them into its prompt (use chatgym's chatml_tools template)",
                stacklevel=3,
            )


def _first_difference(a: str, b: str) -> int:
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


def probe_template(renderer: ChatRenderer, eos_token_ids: Iterable[int]) -> TemplateProbe:
    """Check at start-up that ``renderer`` can produce token-exact deltas; fail loudly otherwise.

    Checks, on :data:`PROBE_CONVERSATION` with :data:`PROBE_TOOLS`:

    1. prefix preservation at every cut the collector makes (after each assistant turn, adding the
       next observation messages and the generation prompt), in text **and** in tokens
       (``encode(before) + encode(delta) == encode(after)``: the cut is a token boundary, so encoding
       the delta alone gives the same ids as encoding everything);
    2. the assistant turn renders as ``generation prompt + content + suffix`` with the same suffix
       after every assistant turn;
    3. the suffix's first token is one of ``eos_token_ids`` (else generation would not stop there).

    Raises:
        TemplateError: naming the check that failed and the text around the difference.
    """
    eos = set(eos_token_ids)
    if not eos:
        raise TemplateError("eos_token_ids is empty: the collector cannot tell where a turn ends")

    conv = PROBE_CONVERSATION
    suffix: str | None = None
    cuts = 0
    for k, i in enumerate(j for j, m in enumerate(conv) if m["role"] == "assistant"):
        content = conv[i]["content"]
        # (2) generation prompt + sampled content + turn suffix == the rendered assistant turn.
        upto = renderer.render(conv[:i], PROBE_TOOLS, add_generation_prompt=True)
        before = renderer.render(conv[: i + 1], PROBE_TOOLS)
        if not before.startswith(upto):
            at = _first_difference(upto, before)
            raise TemplateError(
                f"chat template is not prefix-preserving: adding probe assistant turn {k + 1} changes the "
                f"text before it at character {at}: {upto[max(0, at - 40) : at + 40]!r} became "
                f"{before[max(0, at - 40) : at + 40]!r}"
            )
        if suffix is None:
            if not before.startswith(upto + content):
                raise TemplateError(
                    f"chat template does not write an assistant turn's content as is ({before[len(upto) :]!r}); "
                    "sampled ids could not be continued token-exactly"
                )
            suffix = before[len(upto) + len(content) :]
        elif before[len(upto) :] != content + suffix:
            raise TemplateError(
                f"chat template renders probe assistant turn {k + 1} as {before[len(upto) :]!r}, not its "
                f"content followed by the first turn's ending {suffix!r}"
            )
        # (1) the delta of the observation messages that follow, in text and in tokens.
        j = i + 1
        while j < len(conv) and conv[j]["role"] != "assistant":
            j += 1
        if j == i + 1:
            continue
        delta = renderer.delta_text(conv[: i + 1], conv[i + 1 : j], PROBE_TOOLS)
        if renderer.encode(before) + renderer.encode(delta) != renderer.encode(before + delta):
            raise TemplateError(
                f"the delta after probe assistant turn {k + 1} does not start on a token boundary "
                f"({delta[:40]!r}): encoding it alone gives different ids than encoding the whole text"
            )
        cuts += 1

    # (3) the turn ends with an EOS id.
    assert suffix is not None
    suffix_ids = renderer.encode(suffix)
    if not suffix_ids:
        raise TemplateError("chat template writes nothing after an assistant turn: no end-of-turn token")
    if suffix_ids[0] not in eos:
        tok = renderer.tokenizer.convert_ids_to_tokens([suffix_ids[0]])[0]
        raise TemplateError(
            f"chat template ends assistant turns with {tok!r} (id {suffix_ids[0]}), which is not among "
            f"the EOS ids {sorted(eos)}: generation would run past the end of the turn "
            "(check the model's generation config / tokenizer eos_token)"
        )

    head = conv[:2]
    renders_tools = renderer.render(head, PROBE_TOOLS) != renderer.render(head, None)
    return TemplateProbe(suffix, suffix_ids, renders_tools, cuts)


def closing_ids(probe: TemplateProbe, completion_ids: Sequence[int]) -> list[int]:
    """Observation tokens that close an assistant turn after its sampled ids (see module docstring).

    Args:
        probe: the template's probe result (``turn_suffix_ids``, e.g. ``[2, 198]``).
        completion_ids: the ids sampled in this turn (judged on these only, never on the prompt).

    Returns:
        ``turn_suffix_ids[1:]`` when the completion ended with ``turn_suffix_ids[0]``, else the whole
        ``turn_suffix_ids`` (a cut completion, or one ended by a different EOS id).
    """
    suffix = probe.turn_suffix_ids
    if completion_ids and completion_ids[-1] == suffix[0]:
        return list(suffix[1:])
    return list(suffix)


def resolve_eos_ids(
    tokenizer: Any, generation_config: Any = None, extra: Iterable[int] = ()
) -> tuple[int, ...]:
    """Every EOS id of a model: the generation config's ``eos_token_id`` (int or list), the
    tokenizer's ``eos_token_id`` and ``extra``, sorted, without duplicates."""
    ids: set[int] = set(extra)
    for source in (
        getattr(generation_config, "eos_token_id", None),
        getattr(tokenizer, "eos_token_id", None),
    ):
        if isinstance(source, int):
            ids.add(source)
        elif source is not None:
            ids.update(int(i) for i in source)
    return tuple(sorted(ids))


def truncate_text_tokens(tokenizer: Any, text: str, max_tokens: int) -> tuple[str, int]:
    """Cut ``text`` to its first ``max_tokens`` tokens and add a visible marker.

    Returns:
        ``(text, cut)``: the text unchanged and 0 when it has at most ``max_tokens`` tokens; otherwise
        the decoded first ``max_tokens`` tokens followed by ``"\\n[... N more tokens truncated]"`` and N.
    """
    ids = tokenizer.encode(text, add_special_tokens=False)
    if len(ids) <= max_tokens:
        return text, 0
    cut = len(ids) - max_tokens
    head = tokenizer.decode(ids[:max_tokens], skip_special_tokens=False)
    return f"{head}\n[... {cut} more tokens truncated]", cut
