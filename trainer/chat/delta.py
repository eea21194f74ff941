"""Chat-template deltas: the token ids that new messages add to a running token stream.

The collector never re-tokenizes what the model sampled. After a completion it appends only the
tokens of what came after: the rest of the template's end-of-turn text, then the new observation
messages, then the next assistant header. Those tokens are the *delta*. :func:`probe_template` picks
one of two ways to compute it at start-up (:attr:`TemplateProbe.delta_mode`):

* ``"history"`` — for *prefix-preserving* templates (rendering ``messages[:k]`` is a prefix of
  rendering ``messages[:k+1]``; chatgym's ``chatml_tools``, SmolLM2's own)::

      render(history + new, add_generation_prompt=True)  minus  render(history)

  where ``history`` already ends with the assistant turn just sampled. :meth:`ChatRenderer.delta_text`
  checks the prefix on every call and raises :class:`TemplateError` when it does not hold.
* ``"base"`` — for templates that re-render history differently, e.g. *think-stripping* ones
  (Qwen3 drops the ``<think>`` block of assistant turns before the last user query; QwQ drops every
  turn's reasoning and opens ``<think>\\n`` in the generation prompt). The new messages are rendered
  after a fixed base conversation (a user query and an assistant turn) and the delta is what follows
  that assistant turn's suffix. The stream then holds every turn once, as sampled (the model's own
  ``<think>`` tokens included), and each observation as the template writes it after any history —
  exactly what the model conditioned on at each step, though not what one rendering of the whole
  conversation would give. The probe checks, on a tool conversation with and without ``<think>``
  blocks, that the full rendering ends with each base delta (new messages render the same after any
  history) and that each cut is a token boundary. verl (``BASE_CHAT_HISTORY`` in its rollout schemas)
  and SkyRL's generator (``base_conversation``, the "fixed base approach") compute observation ids
  this way; SkyRL also ships a prefix-preserving variant of Qwen3's template as an alternative.

What sits between a completion and the next observation. A template closes an assistant turn with a
fixed *turn suffix* (ChatML: ``<|im_end|>\\n``, ids ``[2, 198]`` on SmolLM2). ``"history"`` mode finds
it as the text after an assistant turn's content; ``"base"`` mode as the text after the base assistant
turn up to the first EOS token and the whitespace after it. Its first token must be one of the EOS
ids, so generation stops at the turn's end. Then:

* the completion ended with the suffix's first token (``<|im_end|>``): the closing tokens are the
  rest of the suffix (``\\n``);
* the completion ended with another EOS id, or was cut by ``max_tokens`` without any EOS: the
  closing tokens are the whole suffix (``<|im_end|>\\n``), so the stream has a well-formed turn end.

Closing tokens are observation tokens (loss mask 0). The delta never depends on how the template
prints the assistant's content (some templates re-format tool calls) — only on what follows it.

**Message text is plain text.** Every id this module returns comes from
:meth:`ChatRenderer.encode_marked`: control-token text inside messages and tool schemas (a tool result
holding ``<|im_end|>\\n<|im_start|>system``) is encoded as ordinary text, and the only control ids are
the ones the template writes (:class:`chatgym.trainer.chat.tokenizer.ContentCodec`).

**Supported templates** (tested in tests/test_think_templates.py and tests/test_special_tokens.py):
``chatml_tools`` and SmolLM2's own (history mode); Qwen3's and QwQ's stock templates, shipped as
``qwen3`` / ``qwq`` (base mode). Any other template is probed the same way at start-up: it runs when
one of the two modes checks out, else the collector refuses it with the reason. Eleven published
templates (Qwen2.5, Qwen3 thinking and not, Llama 3.2, DeepSeek-V3.1, Phi-3.5, SmolLM2 supported;
Mistral Nemo, Gemma 2, gpt-oss, GLM-4.6 refused) are run token for token in
tests/test_template_conformance.py (the table: docs/models.md). To add one, put its
text in ``trainer/chat/templates/<name>.jinja`` (with its source named in a ``{#- ... -#}`` comment) or pass
a path / template string as ``chat_template``; then add it to the template lists of those two test
files.

**Images.** With a ``processor`` (a Hugging Face multimodal processor), message content may hold image
parts (:mod:`chatgym.envs.messages`). The template writes the processor's placeholder (``<image>``) per
image part; :meth:`ChatRenderer.prompt_ids` and :meth:`ChatRenderer.delta_ids` replace the k-th
placeholder id of the ids they return by the processor's own ids for the k-th image of the messages
rendered (:class:`chatgym.trainer.chat.images.ImageTokens`). A delta expands only its new messages'
images, never the history's, whose ids are already in the stream. Placeholder runs begin and end
with added tokens, so their ids do not depend on the text around them, and the stream equals the
processor's tokenization of the whole conversation where the sampled ids agree with it.

The idea of a text-level delta over a prefix-preserving template is shared with SkyRL's
``SkyRLGymGenerator`` (token-in-token-out) and verl's multi-turn rollout; the probe, the checks and the
closing-token rule here are our own.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from chatgym.envs.messages import Message
from chatgym.trainer.chat.images import ImageInputError, ImageTokens, has_images, intern_images
from chatgym.trainer.chat.template_probe import (
    BASE_QUERY,
    BASE_STUB,
    ConversationRefused,
    TemplateError,
    TemplateProbe,
    first_difference,
    probe_template,
)
from chatgym.trainer.chat.tokenizer import (
    SENTINEL_CLOSE,
    SENTINEL_OPEN,
    ContentCodec,
    content_codec,
    content_ids,
    is_template_text,
    resolve_tokenizer_template,
)


def _raised_in_template(exc: BaseException) -> bool:
    """True when ``exc`` passed through a chat template's compiled code (Jinja names its frames
    ``<template>``), False for an error of the caller's arguments or of transformers itself."""
    tb = exc.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code.co_filename == "<template>":
            return True
        tb = tb.tb_next
    return False


@dataclass
class ChatRenderer:
    """Renders messages with a tokenizer's chat template and computes token deltas.

    Every token id it returns comes from :meth:`encode_marked`: message and tool text is plain text,
    and the only control ids are those the template writes (see
    :class:`chatgym.trainer.chat.tokenizer.ContentCodec`).

    Args:
        tokenizer: a Hugging Face tokenizer (``apply_chat_template``, ``encode``, ``decode``).
        template_kwargs: extra variables every rendering passes to the template (Qwen3's
            ``{"enable_thinking": False}``); None: none.
        chat_template: the template overriding the tokenizer's own (None: use the tokenizer's): Jinja
            text, or a name or path as :func:`~chatgym.trainer.chat.tokenizer.resolve_chat_template`
            takes (``"qwen3"``, ``"qwq"``, ``"chatml_tools"``, ``"auto"``, ``"model"``,
            ``"path/to/t.jinja"``), resolved here against the tokenizer's template; ``"model"`` is
            always the model's own, even where :func:`~chatgym.trainer.chat.tokenizer.get_tokenizer`
            put ``chatml_tools`` in its place (:func:`~chatgym.trainer.chat.tokenizer.model_chat_template`).
        processor: a multimodal processor whose ``tokenizer`` is ``tokenizer`` (None: text only;
            messages with image parts are then refused). Its ``image_token`` is passed to every
            rendering as ``image_placeholder``; the template is checked at construction to write one
            per image part (:meth:`probe_images`).

    Raises:
        TemplateError: the template's text holds the codec's private-use sentinel characters; from any
            rendering: the template raised (``raise_exception``, a Jinja error, a Python error in its
            code), message included; with a ``processor``: the template does not render image parts as
            placeholders.
        FileNotFoundError: a template name that is not shipped, or a ``.jinja`` path that does not exist.
        ValueError: ``"model"`` and the model has no template of its own.
    """

    tokenizer: Any
    chat_template: str | None = None
    template_kwargs: Mapping[str, Any] | None = None
    processor: Any = None
    _tools_warned: bool = field(default=False, repr=False)
    codec: ContentCodec = field(init=False, repr=False)
    image_tokens: ImageTokens | None = field(init=False, repr=False, default=None)

    def __post_init__(self) -> None:
        self.codec = content_codec(self.tokenizer)
        if self.processor is not None:
            self.image_tokens = ImageTokens(self.processor)
            placeholder = {"image_placeholder": self.image_tokens.placeholder}
            self.template_kwargs = {**placeholder, **dict(self.template_kwargs or {})}
        if isinstance(self.chat_template, str) and not is_template_text(self.chat_template):
            self.chat_template = resolve_tokenizer_template(self.tokenizer, self.chat_template)
        source = self.chat_template or getattr(self.tokenizer, "chat_template", None)
        if isinstance(source, str) and (SENTINEL_OPEN in source or SENTINEL_CLOSE in source):
            raise TemplateError("chat template holds the characters U+E000/U+E001 that chatgym reserves")
        if self.image_tokens is not None:
            self.probe_images()

    def probe_images(self) -> None:
        """Check that the template renders image parts: one placeholder per image part of user and
        tool messages, the text parts kept.

        Raises:
            TemplateError: the template fails on a list content or writes another number of placeholders.
        """
        assert self.image_tokens is not None
        image = {"type": "image", "ref": "0" * 64}
        conv = [
            {"role": "user", "content": [{"type": "text", "text": "Look:"}, image, {"type": "text", "text": "and"}, image]},
            {"role": "assistant", "content": "ok"},
            {"role": "tool", "content": [image, {"type": "text", "text": "zoomed"}], "tool_call_id": "call_0"},
        ]
        try:
            text = self.render(conv, None, add_generation_prompt=True)  # type: ignore[arg-type]
        except Exception as exc:
            raise TemplateError(f"the chat template cannot render image content parts: {type(exc).__name__}: {exc}") from None
        found = text.count(self.image_tokens.placeholder)
        if found != 3 or not all(t in text for t in ("Look:", "and", "zoomed")):
            raise TemplateError(
                f"the chat template renders 3 image parts as {found} placeholder(s) "
                f"{self.image_tokens.placeholder!r} (or drops their text): it cannot show images to the model"
            )

    def _expand(self, ids: list[int], messages: Sequence[Message], images: Mapping[str, Any] | None) -> list[int]:
        # Text-only messages: the ids as they are (the path every text model takes).
        if not has_images(messages):
            return ids
        if self.image_tokens is None:
            raise ImageInputError("a message holds an image but the model has no image processor (a text-only model)")
        _, new, refs = intern_images(messages, images or {})
        return self.image_tokens.expand(ids, refs, {**(images or {}), **new})

    def _apply(self, messages: Sequence[Message], tools: Any, add_generation_prompt: bool) -> str:
        import jinja2

        try:
            return self.tokenizer.apply_chat_template(
                list(messages),
                tools=list(tools) if tools else None,
                chat_template=self.chat_template,
                add_generation_prompt=add_generation_prompt,
                tokenize=False,
                **dict(self.template_kwargs or {}),
            )
        except Exception as exc:
            # A template refusing a conversation (Gemma's "System role not supported", Mistral's
            # call-id check) is a template error of this conversation, reported as such; so is a
            # Python error the template's code hit on these messages (a str + int, a method call on
            # a list content), which a caller would otherwise see as its own crash.
            if not isinstance(exc, jinja2.TemplateError) and not _raised_in_template(exc):
                raise
            raise ConversationRefused(f"the chat template raised {type(exc).__name__}: {exc}") from None

    def render(
        self,
        messages: Sequence[Message],
        tools: Sequence[dict[str, Any]] | None = None,
        add_generation_prompt: bool = False,
    ) -> str:
        """The template's text for ``messages`` (``tools``: OpenAI tool schemas, or None)."""
        return self._apply(messages, tools, add_generation_prompt)

    def render_marked(
        self,
        messages: Sequence[Message],
        tools: Sequence[dict[str, Any]] | None = None,
        add_generation_prompt: bool = False,
    ) -> str:
        """:meth:`render` of the messages and tools with their control-token texts protected; pass the
        result to :meth:`encode_marked` (or :meth:`unmark` for the plain text)."""
        tools = self.codec.protect(list(tools)) if tools else None
        return self._apply(self.codec.protect_messages(messages), tools, add_generation_prompt)

    def encode(self, text: str) -> list[int]:
        """Ids of text the template wrote (no message text in it): every control-token text is a
        control id. Text that holds message content goes through :meth:`encode_marked`."""
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def unmark(self, marked: str) -> str:
        """The plain text of :meth:`render_marked` output.

        Raises:
            TemplateError: the template cut a protected marker apart.
        """
        try:
            return self.codec.unmark(marked)
        except ValueError as exc:
            raise TemplateError(str(exc)) from None

    def _shown(self, marked: str) -> str:
        # For error messages: a cut may split a sentinel; show what can be restored.
        try:
            return self.codec.unmark(marked)
        except ValueError:
            return marked

    def encode_marked(self, marked: str) -> list[int]:
        """Ids of :meth:`render_marked` output: the one way rendered message text becomes token ids.

        Raises:
            TemplateError: the template cut a protected marker apart.
        """
        try:
            return self.codec.encode_marked(marked)
        except ValueError as exc:
            raise TemplateError(str(exc)) from None

    def prompt_ids(
        self,
        messages: Sequence[Message],
        tools: Sequence[dict[str, Any]] | None = None,
        images: Mapping[str, Any] | None = None,
    ) -> list[int]:
        """Token ids of the opening messages followed by the assistant header, each image part's
        placeholder expanded (``images``: the image store, by sha256, that ``ref`` parts name).

        Raises:
            ImageInputError: an image part cannot be read, or there is no processor.
            TemplateError: as :meth:`render`; the template's placeholders do not match the image parts.
        """
        ids = self.encode_marked(self.render_marked(messages, tools, add_generation_prompt=True))
        return self._expand(ids, messages, images)

    def _history_delta(self, history: Sequence[Message], new: Sequence[Message], tools: Any) -> str:
        before = self.render_marked(history, tools)
        after = self.render_marked([*history, *new], tools, add_generation_prompt=True)
        if not after.startswith(before):
            at = first_difference(before, after)
            before, after = self._shown(before[: at + 40]), self._shown(after[: at + 40])
            at = first_difference(before, after)
            raise TemplateError(
                "chat template is not prefix-preserving: rendering the history plus "
                f"{len(new)} new message(s) changes earlier text at character {at}: "
                f"{before[max(0, at - 40) : at + 40]!r} became {after[max(0, at - 40) : at + 40]!r}"
            )
        return after[len(before) :]

    def _base_delta(self, new: Sequence[Message], tools: Any, turn_suffix: str) -> str:
        base = [{"role": "user", "content": BASE_QUERY}, {"role": "assistant", "content": BASE_STUB}]
        tools = self.codec.protect(list(tools)) if tools else None
        text = self._apply([*base, *self.codec.protect_messages(new)], tools, True)
        at = text.find(BASE_STUB)
        if at < 0:
            raise TemplateError("chat template drops the content of an assistant turn that is followed by others")
        rest = text[at + len(BASE_STUB) :]
        if not rest.startswith(turn_suffix):
            raise TemplateError(
                f"chat template ends an assistant turn with {self._shown(rest[:40])!r} before "
                f"{len(new)} new message(s), not with its turn suffix {turn_suffix!r}"
            )
        return rest[len(turn_suffix) :]

    def _delta_marked(
        self, history: Sequence[Message], new: Sequence[Message], tools: Any, probe: TemplateProbe | None
    ) -> str:
        if probe is not None and probe.delta_mode == "base":
            return self._base_delta(new, tools, probe.turn_suffix)
        return self._history_delta(history, new, tools)

    def delta_text(
        self,
        history: Sequence[Message],
        new: Sequence[Message],
        tools: Sequence[dict[str, Any]] | None = None,
        probe: TemplateProbe | None = None,
    ) -> str:
        """Text that ``new`` (plus the next assistant header) adds after ``history``.

        ``probe`` (from :func:`probe_template`) picks the delta mode; None: ``"history"``.

        Raises:
            TemplateError: ``"history"`` mode and ``render(history)`` is not a prefix of
                ``render(history + new)``; ``"base"`` mode and the template does not end the base
                assistant turn with ``probe.turn_suffix``.
        """
        return self.unmark(self._delta_marked(history, new, tools, probe))

    def delta_ids(
        self,
        history: Sequence[Message],
        new: Sequence[Message],
        tools: Sequence[dict[str, Any]] | None = None,
        probe: TemplateProbe | None = None,
        images: Mapping[str, Any] | None = None,
    ) -> list[int]:
        """Token ids of :meth:`delta_text` (message text as plain text; ``list[int]``), the image
        parts of ``new`` expanded as in :meth:`prompt_ids` (``images``: the image store).

        Raises:
            TemplateError: as :meth:`delta_text`; the placeholders do not match ``new``'s image parts.
            ImageInputError: as :meth:`prompt_ids`.
        """
        ids = self.encode_marked(self._delta_marked(history, new, tools, probe))
        return self._expand(ids, new, images)

    def warn_if_tools_ignored(self, probe: TemplateProbe, tools: Sequence[dict[str, Any]] | None) -> None:
        if tools and not probe.renders_tools and not self._tools_warned:
            self._tools_warned = True
            warnings.warn(
                "the chat template ignores tools=: the model never sees the tool schemas unless the "
                "env writes them into its prompt (use chatgym's chatml_tools template)",
                stacklevel=3,
            )


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


def probe_chat_template(
    tokenizer: Any,
    config: Any,
    engine_eos: Any = None,
    generation_config: Any = None,
    processor: Any = None,
) -> tuple[tuple[int, ...], ChatRenderer, TemplateProbe]:
    """The EOS ids, renderer and template probe a collector works with (``config``: its
    ``RolloutConfig``, read for ``eos_token_ids``, ``chat_template`` and ``chat_template_kwargs``).

    EOS ids: ``config.eos_token_ids``, else ``engine_eos`` (the engine's ``eos_token_ids``, one id or
    several: it knows its model's generation config), else the tokenizer's and ``generation_config``'s.

    Raises:
        TemplateError: the template fits neither delta mode (see :func:`probe_template`).
        FileNotFoundError / ValueError: ``config.chat_template`` names nothing (see :class:`ChatRenderer`).
    """
    engine_eos = (engine_eos,) if isinstance(engine_eos, int) else tuple(sorted(engine_eos or ()))
    eos = config.eos_token_ids or engine_eos or resolve_eos_ids(tokenizer, generation_config)
    renderer = ChatRenderer(tokenizer, config.chat_template, config.chat_template_kwargs, processor)
    return eos, renderer, probe_template(renderer, eos)


def truncate_text_tokens(tokenizer: Any, text: str, max_tokens: int) -> tuple[str, int]:
    """Cut ``text`` to its first ``max_tokens`` tokens and add a visible marker.

    Returns:
        ``(text, cut)``: the text unchanged and 0 when it has at most ``max_tokens`` tokens; otherwise
        the decoded first ``max_tokens`` tokens followed by ``"\\n[... N more tokens truncated]"`` and N.
        Tokens are counted as the model reads message text: control-token text is plain text
        (:func:`chatgym.trainer.chat.tokenizer.content_ids`).
    """
    ids = content_ids(tokenizer, text)
    if len(ids) <= max_tokens:
        return text, 0
    cut = len(ids) - max_tokens
    head = tokenizer.decode(ids[:max_tokens], skip_special_tokens=False)
    return f"{head}\n[... {cut} more tokens truncated]", cut
