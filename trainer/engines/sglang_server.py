"""A running SGLang server, token ids in and out, through its native ``/generate`` endpoint.

SGLang has no CPU build on PyPI, so this engine is written to SGLang's documented API (the
``/generate`` parameters of ``GenerateReqInput`` and ``SamplingParams``; the response built by its
``TokenizerManager``) and tested against a fake server that answers in that shape, not against a real
SGLang. Request::

    {"input_ids": [...], "sampling_params": {"max_new_tokens", "temperature", "top_p", "top_k",
     "stop_token_ids", "stop", "sampling_seed", "skip_special_tokens": false, "no_stop_trim": true},
     "return_logprob": true, "stream": false}

Response (one prompt)::

    {"text": ..., "output_ids": [...], "meta_info": {"id", "finish_reason": {"type": "stop",
     "matched": 2} | {"type": "length", "length": n} | {"type": "abort", ...}, "prompt_tokens",
     "completion_tokens", "cached_tokens", "output_token_logprobs": [[logprob, id, text|null], ...]}}

The ids are taken from ``output_token_logprobs`` (every generated id, the final stop id included,
aligned with its logprob — as slime and verl read them), else from ``output_ids``.
``no_stop_trim`` keeps the stop id in the output, and a matched stop string in the text (SGLang
never drops the ids of a stop string: it ends the request on the token that completes the match,
checked on the decoded tail after every token); ``finish_reason.matched`` names the stop string or id.

Logprob definition: SGLang returns logprobs AFTER temperature scaling unless the server runs with
``SGLANG_RETURN_ORIGINAL_LOGPROB=1``; start it with that variable so the logprobs are the raw
(temperature-1) ones every chatgym engine returns. (At temperature 1 and for greedy requests — SGLang
runs greedy as temperature 1, top-k 1 — the two agree.)

Weight updates: weights are written as safetensors (plus the model's config) to a directory the
server can read, then ``POST /update_weights_from_disk {"model_path": dir}`` and ``POST /flush_cache``.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from chatgym.trainer.engines.base import Completion, SamplingParams
from chatgym.trainer.engines.common import (
    check_prompt,
    completion_text,
    local_model_info,
    refuse_images,
    save_weights,
    server_stop,
    stop_ids,
)
from chatgym.trainer.engines.http import JSONClient, ServerError, server_url


class SGLangServerEngine:
    """:class:`~chatgym.trainer.engines.base.Engine` on an SGLang server's ``/generate``.

    Args:
        model: the served model: packaged name / local directory (tokenizer and EOS ids are then read
            locally), or any name for a remote model (the server's finish reason is used).
        base_url: server root (default ``$CHATGYM_SGLANG_URL`` or ``http://127.0.0.1:30000``).
        tokenizer, api_key, timeout_s, retries, weights_dir: as in ``VLLMServerEngine``.
    """

    def __init__(
        self,
        model: Any = "smollm2",
        base_url: str | None = None,
        *,
        tokenizer: Any = None,
        api_key: str | None = None,
        timeout_s: float = 600.0,
        retries: int = 3,
        weights_dir: str | os.PathLike[str] | None = None,
    ) -> None:
        self.model_path, self.tokenizer, self.eos_token_ids = local_model_info(model, tokenizer)
        self.client = JSONClient(
            server_url("sglang", base_url),
            api_key=api_key,
            timeout_s=timeout_s,
            retries=retries,
        )
        self._weights_dir = Path(weights_dir) if weights_dir else None
        self._owns_weights_dir = False  # a temp dir we made is removed on close()

    @staticmethod
    def request_body(prompt_ids: list[int], params: SamplingParams) -> dict[str, Any]:
        """The ``/generate`` JSON body for one request."""
        sampling: dict[str, Any] = {
            "max_new_tokens": params.max_tokens,
            "temperature": params.temperature,
            "top_p": params.top_p,
            "top_k": params.top_k if params.top_k > 0 else -1,  # SGLang: -1 = whole vocabulary
            "stop_token_ids": list(params.stop_token_ids),
            "skip_special_tokens": False,
            "no_stop_trim": True,  # keep the stop id / stop string: ids must be exactly what was sampled
        }
        if params.stop:
            sampling["stop"] = list(params.stop)
        if params.seed is not None:
            sampling["sampling_seed"] = params.seed
        return {
            "input_ids": prompt_ids,
            "sampling_params": sampling,
            "return_logprob": params.logprobs,
            "stream": False,
        }

    async def generate(self, prompt_ids: list[int], params: SamplingParams, *, images: Any = ()) -> Completion:
        """Generate one completion on the server (token ids only: ``images`` must be empty).

        Raises:
            TypeError / ValueError: a malformed prompt, or images (SGLang's ``image_data`` beside
            pre-expanded ``input_ids`` is neither wired nor tested here). ServerError: the server
            refused or failed, or its answer is malformed.
        """
        refuse_images(
            "SGLangServerEngine", images, "this engine sends token ids only; use the vllm or hf engine for images"
        )
        ids = check_prompt(prompt_ids)
        if not isinstance(params, SamplingParams):
            raise TypeError(f"params must be SamplingParams, got {type(params).__name__}")
        response = await self.client.post("/generate", self.request_body(ids, params))
        return self.parse_response(response, params)

    def parse_response(self, response: Any, params: SamplingParams) -> Completion:
        """Turn a ``/generate`` answer into a :class:`Completion`.

        Raises:
            ServerError: no ``meta_info``, no ids, or ids and logprobs that do not line up.
        """
        if isinstance(response, list):  # a batch answer; we send one prompt
            response = response[0] if response else {}
        meta = response.get("meta_info") if isinstance(response, dict) else None
        if not isinstance(meta, dict):
            raise ServerError(f"/generate answer has no meta_info: {str(response)[:500]}")
        entries = meta.get("output_token_logprobs")
        logprobs: list[float] = []
        if entries is not None:
            token_ids = [int(e[1]) for e in entries]
            logprobs = [float(e[0]) for e in entries]
            if "output_ids" in response and [int(t) for t in response["output_ids"]] != token_ids:
                raise ServerError("output_ids and output_token_logprobs name different ids")
        elif "output_ids" in response:
            token_ids = [int(t) for t in response["output_ids"]]
        else:
            raise ServerError("/generate answer has neither output_token_logprobs nor output_ids")
        if params.logprobs and len(logprobs) != len(token_ids):
            raise ServerError(f"server returned {len(token_ids)} ids but {len(logprobs)} logprobs")
        stop = stop_ids(self.eos_token_ids, params)
        server_reason = meta.get("finish_reason")
        matched = server_reason.get("matched") if isinstance(server_reason, dict) else None
        finish, reason = server_stop(token_ids, stop, bool(self.eos_token_ids), server_reason, matched)
        return Completion(
            token_ids=token_ids,
            logprobs=logprobs if params.logprobs else [],
            finish_reason=finish,
            stop_reason=reason,
            text=completion_text(self.tokenizer, token_ids, finish, reason)
            if self.tokenizer
            else response.get("text", ""),
            info={
                "server_finish_reason": meta.get("finish_reason"),
                "prompt_tokens": meta.get("prompt_tokens"),
                "cached_tokens": meta.get("cached_tokens"),
            },
        )

    def update_weights(self, weights: Any) -> None:
        """Write ``weights`` (and the model's config) to disk and make the server load them (blocking).

        Raises:
            TypeError: a value that is not a torch.Tensor, or an item that is not a ``(name, tensor)``
                pair (named; :func:`~chatgym.trainer.engines.common.save_weights`), before the server
                is asked to load.
            ServerError: the server answered ``success: false`` or failed.
        """
        from chatgym.trainer.models.packaged import cache_dir

        if self._weights_dir is None:
            root = cache_dir() / "weights"
            root.mkdir(parents=True, exist_ok=True)
            self._weights_dir = Path(tempfile.mkdtemp(prefix="sglang-", dir=root))
            self._owns_weights_dir = True
        directory = save_weights(weights, self._weights_dir, config_from=self.model_path)
        answer = self.client.post_sync("/update_weights_from_disk", {"model_path": str(directory)})
        if not (isinstance(answer, dict) and answer.get("success")):
            raise ServerError(f"SGLang refused the weights: {answer!r}")
        self.client.post_sync("/flush_cache", {})

    async def close(self) -> None:
        """Close the HTTP sessions and remove the temp weights dir this engine made (if any)."""
        await self.client.close()
        if self._owns_weights_dir and self._weights_dir is not None:
            shutil.rmtree(self._weights_dir, ignore_errors=True)
