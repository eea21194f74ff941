"""An OpenAI-compatible chat API (OpenAI, a vLLM/SGLang server's ``/v1/chat/completions``, ...):
messages in, an assistant message out — for EVALUATING API models only.

The server applies its own chat template and tokenizer, so token ids and their logprobs are not
available: ``generate`` and ``update_weights`` raise. Use it for evaluation, or as a simulated user /
judge (``respond(messages)`` is the protocol ``chatgym.envs`` expects).

Configuration: ``base_url`` (default ``$OPENAI_BASE_URL``, else ``https://api.openai.com/v1``) and
``api_key`` (default ``$OPENAI_API_KEY``). The base URL includes the ``/v1`` part, as in the OpenAI SDK.

Stop strings (``SamplingParams.stop``, e.g. an env's ``stop_strings``): the reply's content ends with
the first stop string, which is kept (the rule of the token engines, on text: content through the end
of the earliest-ending match). OpenAI's API drops the stop sequence from the reply and does not say
which one matched, so by default (``stop_mode="client"``) no ``stop`` is sent and the reply is cut
here — exact on any server, at the price of the tokens generated past the stop. With
``stop_mode="server"`` the ``stop`` list is sent and the matched string is put back from the
server's ``stop_reason`` (vLLM) or ``matched_stop`` (SGLang); a server that names neither is an error.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from typing import Any

from chatgym.envs.messages import Message, ToolCall
from chatgym.envs.parsers.base import call_ids, calls_before, unique_call_ids
from chatgym.trainer.engines.base import Completion, SamplingParams
from chatgym.trainer.engines.common import earliest_stop, refuse_images
from chatgym.trainer.engines.http import JSONClient, ServerError

STOP_MODES = ("client", "server")


class OpenAIChatEngine:
    """Chat with an API model.

    Args:
        model: the API's model name (e.g. ``"gpt-4o-mini"``, or a vLLM server's served name).
        base_url: API root including ``/v1``.
        api_key: bearer token.
        params: default sampling settings for ``chat`` (``max_tokens``, ``temperature``, ``top_p``,
            ``seed``; ``top_k``/``stop_token_ids`` are not part of the OpenAI API and are not sent).
        timeout_s, retries: per-request timeout (seconds) and retries (429/5xx/connection errors).
        stop_mode: how ``params.stop`` is honoured (see the module docstring): ``"client"`` (cut the
            reply here; works with any API) or ``"server"`` (send ``stop``; for vLLM/SGLang servers).

    Raises:
        ValueError: an empty ``model`` or an unknown ``stop_mode``.

    Attributes:
        usage: running totals of ``prompt_tokens`` / ``completion_tokens`` reported by the API.
    """

    def __init__(
        self,
        model: str,
        base_url: str | None = None,
        api_key: str | None = None,
        *,
        params: SamplingParams | None = None,
        timeout_s: float = 600.0,
        retries: int = 3,
        stop_mode: str = "client",
    ) -> None:
        if not isinstance(model, str) or not model:
            raise ValueError(f"model must be the API's model name, got {model!r}")
        if stop_mode not in STOP_MODES:
            raise ValueError(f"stop_mode must be one of {STOP_MODES}, got {stop_mode!r}")
        self.model = model
        self.stop_mode = stop_mode
        self.params = params or SamplingParams(max_tokens=1024, temperature=0.0)
        self.client = JSONClient(
            base_url or os.environ.get("OPENAI_BASE_URL") or "https://api.openai.com/v1",
            api_key=api_key if api_key is not None else os.environ.get("OPENAI_API_KEY"),
            timeout_s=timeout_s,
            retries=retries,
        )
        self.usage = {"prompt_tokens": 0, "completion_tokens": 0}

    def request_body(
        self, messages: list[Message], tools: list[dict[str, Any]] | None, params: SamplingParams
    ) -> dict[str, Any]:
        """The ``/chat/completions`` JSON body."""
        body: dict[str, Any] = {
            "model": self.model,
            "messages": list(messages),
            "max_tokens": params.max_tokens,
            "temperature": params.temperature,
            "top_p": params.top_p,
        }
        if params.seed is not None:
            body["seed"] = params.seed
        if params.stop and self.stop_mode == "server":
            body["stop"] = list(params.stop)
        if tools:
            body["tools"] = tools
        return body

    async def chat(
        self,
        messages: list[Message],
        tools: list[dict[str, Any]] | None = None,
        params: SamplingParams | None = None,
    ) -> Message:
        """One assistant turn.

        Args:
            messages: the conversation (OpenAI chat format).
            tools: OpenAI tool schemas the model may call.
            params: sampling settings (default: the engine's ``params``).

        Returns:
            An assistant :class:`~chatgym.envs.messages.Message`; ``tool_calls`` (if any) in the OpenAI
            shape with ``arguments`` as JSON text.

        Raises:
            ServerError: the API refused or failed (after retries), or answered without a message.
        """
        params = params or self.params
        response = await self.client.post("/chat/completions", self.request_body(messages, tools, params))
        return self.parse_response(response, params.stop, messages)

    def parse_response(
        self, response: Any, stop: tuple[str, ...] | list[str] = (), history: Iterable[Any] = ()
    ) -> Message:
        """The assistant message of a ``/chat/completions`` answer (usage is added to ``self.usage``).

        Args:
            response: the decoded JSON answer.
            stop: the request's stop strings: the content is cut after the first one (kept), and in
                ``stop_mode="server"`` the one the server names is put back.
            history: the conversation the answer follows. A tool call the server sent without an id,
                or with one that ``history`` or an earlier call of this answer already holds, gets
                ``call_<n>`` by the envs' rule (:func:`~chatgym.envs.parsers.base.unique_call_ids`):
                ``n`` counted from the calls ``history`` made, never an id it or this turn holds.

        Raises:
            ServerError: no message, ``tool_calls`` that are not a list of objects; or, in
                ``stop_mode="server"``, a reply that ended on ``stop`` without the server naming what
                matched.
        """
        try:
            choice = response["choices"][0]
            message = choice["message"]
        except (KeyError, IndexError, TypeError) as exc:
            raise ServerError(f"/chat/completions answer has no message: {str(response)[:500]}") from exc
        usage = response.get("usage") or {}
        for key in self.usage:
            self.usage[key] += int(usage.get(key) or 0)
        content = message.get("content") or ""
        if stop:
            content = self._apply_stop(content, choice, tuple(stop))
        out: Message = {"role": "assistant", "content": content}
        calls: list[ToolCall] = []
        raw = message.get("tool_calls") or []
        if not isinstance(raw, list) or not all(isinstance(c, dict) for c in raw):
            raise ServerError(f"/chat/completions answer's tool_calls is not a list of objects: {str(raw)[:500]}")
        # Every id must differ from every other id of the episode (a bare call_{i} repeated call_0
        # each turn, so a client pairing results with calls by id across turns mixed them up); the
        # envs' rule, so an env that parses this message keeps its ids.
        history = list(history)
        ids = unique_call_ids([c.get("id") for c in raw], calls_before(history), call_ids(history))
        for call, call_id in zip(raw, ids, strict=True):
            fn = call.get("function") or {}
            arguments = fn.get("arguments", "{}")
            if not isinstance(arguments, str):  # some servers send the object itself
                arguments = json.dumps(arguments, ensure_ascii=False)
            calls.append(
                {
                    "id": call_id,
                    "type": "function",
                    "function": {"name": fn.get("name", ""), "arguments": arguments},
                }
            )
        if calls:
            out["tool_calls"] = calls
        return out

    def _apply_stop(self, content: str, choice: dict[str, Any], stop: tuple[str, ...]) -> str:
        if self.stop_mode == "server" and choice.get("finish_reason") == "stop":
            if "stop_reason" in choice:  # vLLM: the stop string, a stop id, or null (EOS)
                matched = choice["stop_reason"]
            elif "matched_stop" in choice:  # SGLang
                matched = choice["matched_stop"]
            else:
                raise ServerError(
                    "the server ended the reply on a stop without saying which (no stop_reason / "
                    "matched_stop): use OpenAIChatEngine(stop_mode='client') with this API"
                )
            if isinstance(matched, str) and matched in stop and not content.endswith(matched):
                content += matched  # the server dropped the stop string it matched
        # Cut after the earliest-ending stop string (client mode; in server mode a server that
        # ignored ``stop`` is caught here too).
        found = earliest_stop(content, stop)
        if found is not None:
            content = content[: content.find(found) + len(found)]
        return content

    async def respond(self, messages: list[Message]) -> Message:
        """The ``respond(messages) -> Message`` protocol of simulated users and judges in ``chatgym.envs``."""
        return await self.chat(messages)

    async def generate(self, prompt_ids: list[int], params: SamplingParams, *, images: Any = ()) -> Completion:
        """Not available: raises ``ValueError`` for images (send them as message parts to
        :meth:`chat`), else ``NotImplementedError`` (a chat API neither takes nor returns token ids)."""
        refuse_images("OpenAIChatEngine", images, "a chat API takes images as message parts, through chat()")
        raise NotImplementedError(
            "OpenAIChatEngine is for evaluating API models: a chat API takes messages, not token ids, "
            "and returns no token ids/logprobs to train on; use chat(messages, tools), or the vllm / "
            "vllm-server / sglang / hf engines for rollouts"
        )

    def update_weights(self, weights: Any) -> None:
        """Not available: an API model's weights cannot be changed."""
        raise NotImplementedError("OpenAIChatEngine serves an API model; its weights cannot be updated")

    async def close(self) -> None:
        await self.client.close()
