"""Engines as the "other agents" of an episode (simulated users, judges).

``chatgym.envs`` talks to a simulated user or a judge through one protocol,
``async respond(messages) -> Message`` (:class:`chatgym.envs.agents.Responder`). This module turns an
engine into one:

* :class:`EngineResponder` — any token engine (``vllm``, ``vllm-server``, ``sglang``, ``hf``): renders
  the responder's conversation with a chat template, generates, and decodes the reply. With
  ``trace=True`` it also returns its own sample (prompt ids, token ids, logprobs) through
  ``respond_with_trace``, so an env can hand a co-trained judge's / user's trajectories back in
  ``info``;
* :class:`ChatResponder` — a chat engine (``openai``: an OpenAI-compatible API) with default
  sampling settings; no token ids, so no traces.

:func:`as_responder` picks the right one. The responder may share the policy's engine (a model
talking to itself) or use its own.
"""

from __future__ import annotations

from typing import Any

from chatgym.envs.messages import Message
from chatgym.trainer.chat.delta import ChatRenderer, resolve_eos_ids
from chatgym.trainer.engines.base import SamplingParams


class EngineResponder:
    """A token engine as a :class:`~chatgym.envs.agents.Responder`.

    Args:
        engine: an engine with ``async generate(prompt_ids, params) -> Completion``.
        tokenizer: tokenizer with the chat template to render the conversation (default: the
            engine's ``tokenizer`` attribute).
        params: sampling settings of one reply (``max_tokens`` in tokens; ``stop`` strings end it
            after the token completing one, kept in the reply). EOS ids are added to
            ``stop_token_ids``.
        chat_template: Jinja template overriding the tokenizer's (None: the tokenizer's own).
        trace: return the sample (``prompt_ids``, ``token_ids``, ``logprobs``, ``finish_reason``,
            ``stop_reason``, ``text``) from ``respond_with_trace`` — for a responder that is being trained.
        max_prompt_tokens: a conversation longer than this is refused (``ValueError``) rather than
            sent to the engine (None: no check; the engine still enforces its own context length).

    Raises:
        ValueError: no tokenizer given and the engine has none.
    """

    def __init__(
        self,
        engine: Any,
        tokenizer: Any = None,
        *,
        params: SamplingParams | None = None,
        chat_template: str | None = None,
        trace: bool = False,
        max_prompt_tokens: int | None = None,
    ) -> None:
        tokenizer = tokenizer if tokenizer is not None else getattr(engine, "tokenizer", None)
        if tokenizer is None:
            raise ValueError(f"{type(engine).__name__} has no tokenizer attribute; pass tokenizer=")
        self.engine = engine
        self.renderer = ChatRenderer(tokenizer, chat_template)
        self.tokenizer = tokenizer
        eos = tuple(getattr(engine, "eos_token_ids", None) or ()) or resolve_eos_ids(tokenizer)
        self.eos_token_ids = frozenset(int(i) for i in eos)
        base = params or SamplingParams(max_tokens=256, temperature=0.7)
        self.params = SamplingParams(
            max_tokens=base.max_tokens,
            temperature=base.temperature,
            top_p=base.top_p,
            top_k=base.top_k,
            stop_token_ids=tuple(sorted(set(base.stop_token_ids) | self.eos_token_ids)),
            seed=base.seed,
            logprobs=trace or base.logprobs,
            stop=base.stop,
        )
        self.trace = trace
        self.max_prompt_tokens = max_prompt_tokens

    async def respond_with_trace(self, messages: list[Message]) -> tuple[Message, dict[str, Any] | None]:
        """The next turn and, with ``trace=True``, the sample behind it (JSON-serialisable)."""
        prompt_ids = self.renderer.prompt_ids(messages)
        if self.max_prompt_tokens is not None and len(prompt_ids) > self.max_prompt_tokens:
            raise ValueError(
                f"responder prompt has {len(prompt_ids)} tokens > max_prompt_tokens={self.max_prompt_tokens}"
            )
        completion = await self.engine.generate(prompt_ids, self.params)
        ids = [int(i) for i in completion.token_ids]
        body = ids[:-1] if ids and ids[-1] in self.eos_token_ids else ids
        text = self.tokenizer.decode(body, skip_special_tokens=True).strip()
        message: Message = {"role": "assistant", "content": text}
        if not self.trace:
            return message, None
        return message, {
            "messages": list(messages),
            "prompt_ids": prompt_ids,
            "token_ids": ids,
            "logprobs": [float(x) for x in completion.logprobs],
            "finish_reason": completion.finish_reason,
            "stop_reason": getattr(completion, "stop_reason", None),
            "text": text,
        }

    async def respond(self, messages: list[Message]) -> Message:
        return (await self.respond_with_trace(messages))[0]


class ChatResponder:
    """A chat engine (``chat(messages, tools=None, params=None) -> Message``, e.g. the ``openai``
    engine) as a responder with its own sampling settings."""

    def __init__(self, engine: Any, *, params: SamplingParams | None = None) -> None:
        self.engine = engine
        self.params = params

    async def respond(self, messages: list[Message]) -> Message:
        out = await self.engine.chat(list(messages), None, self.params)
        return {"role": "assistant", "content": out.get("content") or ""}


def as_responder(engine: Any, tokenizer: Any = None, **kwargs: Any) -> EngineResponder | ChatResponder:
    """A responder for ``engine``: :class:`ChatResponder` for chat-only engines (they raise on
    ``generate``, e.g. ``OpenAIChatEngine``), otherwise :class:`EngineResponder`.

    Args:
        engine: any chatgym engine.
        tokenizer: for token engines (default: the engine's own).
        kwargs: passed to the responder class (``params``, ``trace``, ``chat_template``, ...).
    """
    from chatgym.trainer.engines.openai_chat import OpenAIChatEngine

    if isinstance(engine, OpenAIChatEngine):
        return ChatResponder(engine, **kwargs)
    return EngineResponder(engine, tokenizer, **kwargs)
