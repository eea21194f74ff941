"""Reply prefill: a responder whose reply starts with fixed text, given to the engine as prompt tokens.

A small model asked for a format (a judge's ``[[r]]`` or ``<score>N</score>``) often writes prose
instead; starting its reply with the format's opening (``"Rating: [["``, ``"<score>"``) after the
assistant header makes the next tokens the verdict itself. Used by co-training's party
(:class:`chatgym.trainer.cotrain.party.VersionedResponder`) and by GenRM's judge
(:mod:`chatgym.trainer.rewards.genrm`).
"""

from __future__ import annotations

from typing import Any

from chatgym.envs.messages import Message
from chatgym.trainer.engines.responder import EngineResponder


class PrefilledRenderer:
    """A chat renderer whose prompts end with fixed ids (the reply's prefill)."""

    def __init__(self, renderer: Any, ids: list[int]):
        self.renderer = renderer
        self.ids = list(ids)

    def prompt_ids(self, messages: list[Any]) -> list[int]:
        return [*self.renderer.prompt_ids(messages), *self.ids]

    def __getattr__(self, name: str) -> Any:
        return getattr(self.renderer, name)


class PrefillResponder(EngineResponder):
    """:class:`EngineResponder` whose reply starts with ``prefill``.

    Args:
        prefill: text the reply starts with. Its ids (``tokenizer.encode(prefill,
            add_special_tokens=False)``) are appended to the rendered prompt after the assistant
            header, so the engine samples the continuation; in a trace they are part of
            ``prompt_ids`` (loss mask 0 when the party is trained). The returned message, and a
            trace's ``text``, is ``prefill`` + the sampled text; the trace also records ``prefill``.
            ``""``: a plain :class:`EngineResponder`.
        engine, tokenizer, kwargs: as :class:`EngineResponder`.

    Raises:
        TypeError: ``prefill`` is not a string.
    """

    def __init__(self, engine: Any, tokenizer: Any = None, *, prefill: str = "", **kwargs: Any):
        if not isinstance(prefill, str):
            raise TypeError(f"prefill must be a string, got {prefill!r}")
        super().__init__(engine, tokenizer, **kwargs)
        self.prefill = prefill
        if prefill:
            self.renderer = PrefilledRenderer(
                self.renderer, self.tokenizer.encode(prefill, add_special_tokens=False)
            )

    async def respond_with_trace(self, messages: list[Message]) -> tuple[Message, dict[str, Any] | None]:
        message, trace = await super().respond_with_trace(messages)
        if self.prefill:
            message = {"role": "assistant", "content": self.prefill + message["content"]}
        if trace is not None:
            trace.update(text=message["content"], prefill=self.prefill)
        return message, trace
