"""The transformers engine: a plain PyTorch decode loop with request batching.

For GPUs without vLLM and for quick tests. Concurrent ``generate`` calls that arrive within
``batch_window_s`` (or until ``max_batch_size``) are left-padded into one batch and decoded together
with a KV cache; rows leave the batch as soon as they finish. Each row keeps its own sampling settings
(temperature, top-p, top-k, stop ids, max tokens, seed).

Logprobs: each returned logprob is ``log_softmax(logits)[sampled id]`` of the model's RAW next-token
logits (upcast to float32) — temperature 1, before top-p/top-k — i.e. exactly what a trainer gets from
a forward pass of the same weights over prompt + completion. (vLLM's ``logprobs_mode="raw_logprobs"``,
its default, has the same meaning.) Left padding and the KV cache change only float rounding.

The decode loop is ours rather than ``model.generate`` because ``generate`` applies one sampling
setting and one seed to a whole batch, and its ``output_scores`` are the processed scores.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import threading
from dataclasses import dataclass
from typing import Any

from .base import Completion, SamplingParams
from .common import check_prompt, completion_text, eos_token_ids, iter_weights, judge_finish, stop_ids


@dataclass
class _Request:
    prompt_ids: list[int]
    params: SamplingParams
    future: asyncio.Future[Completion]


class TransformersEngine:
    """:class:`~chatgym.trainer.engines.base.Engine` on a ``transformers`` causal LM.

    Args:
        model: packaged model name (``"smollm2"``), a local model directory, or a loaded
            ``PreTrainedModel`` (used as is, e.g. the trainer's own model; the engine then shares its
            weights and ``update_weights`` is not needed; its train/eval mode is left alone).
        tokenizer: a tokenizer for ``Completion.text``; loaded from ``model`` when it is a name/path,
            else none (text is empty).
        dtype: ``torch.dtype`` or name, when the engine loads the model (``"float32"`` default;
            ``"bfloat16"`` is ~1.3x faster on CPUs with AVX-512 BF16 and on GPUs).
        device: ``"cpu"``, ``"cuda"``, ...; default CUDA when available.
        max_batch_size: most requests decoded together.
        batch_window_s: how long (seconds) the first request of a batch waits for more to join.
        seed: seed of the generator used by requests without their own ``seed``.
        eos_token_ids: override the EOS ids (default: every id in the generation config).
        max_model_len: prompt + completion limit in tokens (default: ``max_position_embeddings``);
            completions are cut there with ``finish_reason="length"``.
        num_threads: torch CPU threads (default: leave torch's setting).
    """

    def __init__(
        self,
        model: Any = "smollm2",
        tokenizer: Any = None,
        *,
        dtype: Any = "float32",
        device: str | None = None,
        max_batch_size: int = 32,
        batch_window_s: float = 0.005,
        seed: int = 0,
        eos_token_ids: Any = None,
        max_model_len: int | None = None,
        num_threads: int | None = None,
    ) -> None:
        import torch

        from ..models import load_model

        if max_batch_size < 1:
            raise ValueError(f"max_batch_size must be >= 1, got {max_batch_size}")
        if batch_window_s < 0:
            raise ValueError(f"batch_window_s must be >= 0, got {batch_window_s}")
        if num_threads:
            torch.set_num_threads(num_threads)
        if isinstance(model, (str, os.PathLike)):
            device = device or ("cuda" if torch.cuda.is_available() else "cpu")
            if tokenizer is None:
                from ..tokenizer import get_tokenizer

                tokenizer = get_tokenizer(model)
            model = load_model(model, dtype=dtype, device=device)  # in eval mode
        # A model passed in is used as is (train/eval mode included): it may be the trainer's own.
        self.model = model
        self.tokenizer = tokenizer
        self.device = next(model.parameters()).device
        config = model.config
        self.vocab_size = int(config.vocab_size)
        self.max_model_len = int(max_model_len or getattr(config, "max_position_embeddings", 1 << 30))
        self.eos_token_ids = (
            frozenset(eos_token_ids) if eos_token_ids is not None else eos_token_ids_of(model, tokenizer)
        )
        pad = getattr(getattr(model, "generation_config", None), "pad_token_id", None)
        self.pad_token_id = int(pad if pad is not None else min(self.eos_token_ids, default=0))
        self.max_batch_size = max_batch_size
        self.batch_window_s = batch_window_s
        self._generator = torch.Generator(device=self.device).manual_seed(seed)
        # One lock for the model: decoding (in a worker thread) and weight updates never interleave.
        self._model_lock = threading.Lock()
        # One long-lived decode thread: CUDA/cuBLAS and PyTorch keep per-thread state, and a fresh
        # thread per batch (asyncio.to_thread after a new event loop) paid seconds of set-up on a GPU.
        self._executor = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="hf-engine")
        self._loop: asyncio.AbstractEventLoop | None = None
        self._queue: asyncio.Queue[_Request] | None = None
        self._batcher: asyncio.Task[None] | None = None
        self.batches_run = 0  # counters for tests and benchmarks
        self.rows_run = 0

    # ---- Engine contract -------------------------------------------------------------------------

    async def generate(self, prompt_ids: list[int], params: SamplingParams) -> Completion:
        """Generate one completion; see the module docstring for the logprob definition.

        Args:
            prompt_ids: token ids (``list[int]``), 1 ≤ length < ``max_model_len``.
            params: sampling settings; ``temperature=0`` is greedy (argmax), ``seed`` makes sampling
                reproducible for this request whatever else is in its batch.

        Returns:
            ``Completion`` with ``token_ids`` as sampled (the final EOS/stop id included),
            ``logprobs`` aligned 1:1 (empty when ``params.logprobs`` is False), ``finish_reason``
            judged on the completion ids only, and ``info["prompt_tokens"]``.

        Raises:
            TypeError / ValueError: a malformed prompt (see ``check_prompt``).
            RuntimeError: the model failed (the exception is chained).
        """
        ids = check_prompt(prompt_ids, self.vocab_size, self.max_model_len)
        if not isinstance(params, SamplingParams):
            raise TypeError(f"params must be SamplingParams, got {type(params).__name__}")
        queue = self._ensure_batcher()
        future: asyncio.Future[Completion] = asyncio.get_running_loop().create_future()
        queue.put_nowait(_Request(ids, params, future))
        return await future

    def update_weights(self, weights: Any) -> None:
        """Copy new weights into the model in place (blocks while a batch is decoding).

        Args:
            weights: a state dict or an iterable of ``(name, tensor)``; names as in the model's
                ``state_dict()`` (tied weights may come under either name). Tensors are cast to the
                engine's dtype/device; a subset of the weights is fine.

        Raises:
            KeyError: a name the model does not have.
            ValueError: a shape that does not match.
        """
        import torch

        targets = dict(self.model.named_parameters(remove_duplicate=False))
        targets.update(dict(self.model.named_buffers(remove_duplicate=False)))
        with self._model_lock, torch.no_grad():
            for name, tensor in iter_weights(weights):
                target = targets.get(name)
                if target is None:
                    raise KeyError(f"update_weights: the model has no weight named {name!r}")
                if tuple(target.shape) != tuple(tensor.shape):
                    raise ValueError(
                        f"update_weights: {name!r} has shape {tuple(tensor.shape)}, "
                        f"the model's is {tuple(target.shape)}"
                    )
                target.copy_(tensor)

    async def close(self) -> None:
        """Stop the batcher (pending requests fail with ``CancelledError``); the engine can be used again."""
        if self._batcher is not None and not self._batcher.done():
            self._batcher.cancel()
            try:
                await self._batcher
            except (asyncio.CancelledError, RuntimeError):
                pass
        self._batcher = None
        self._queue = None
        self._loop = None

    # ---- batching -------------------------------------------------------------------------------

    def _ensure_batcher(self) -> asyncio.Queue[_Request]:
        loop = asyncio.get_running_loop()
        # A queue and task belong to one event loop; a new loop (e.g. a new asyncio.run) gets new ones.
        if self._loop is not loop or self._batcher is None or self._batcher.done():
            self._loop = loop
            self._queue = asyncio.Queue()
            self._batcher = loop.create_task(self._run_batcher(self._queue), name="hf-engine-batcher")
        assert self._queue is not None
        return self._queue

    async def _run_batcher(self, queue: asyncio.Queue[_Request]) -> None:
        loop = asyncio.get_running_loop()
        batch: list[_Request] = []
        try:
            while True:
                batch = [await queue.get()]
                deadline = loop.time() + self.batch_window_s
                while len(batch) < self.max_batch_size:
                    if not queue.empty():
                        batch.append(queue.get_nowait())
                        continue
                    remaining = deadline - loop.time()
                    if remaining <= 0:
                        break
                    try:
                        batch.append(await asyncio.wait_for(queue.get(), remaining))
                    except asyncio.TimeoutError:
                        break
                batch = [r for r in batch if not r.future.done()]  # drop requests cancelled meanwhile
                if not batch:
                    continue
                try:
                    results = await loop.run_in_executor(
                        self._executor,
                        self._generate_batch,
                        [r.prompt_ids for r in batch],
                        [r.params for r in batch],
                    )
                except Exception as exc:  # the whole batch failed: every caller sees why
                    error = RuntimeError(f"TransformersEngine: batch of {len(batch)} failed: {exc!r}")
                    error.__cause__ = exc
                    for r in batch:
                        if not r.future.done():
                            r.future.set_exception(error)
                else:
                    for r, completion in zip(batch, results, strict=True):
                        if not r.future.done():
                            r.future.set_result(completion)
                batch = []
        finally:
            for r in batch:
                if not r.future.done():
                    r.future.cancel()
            while not queue.empty():
                r = queue.get_nowait()
                if not r.future.done():
                    r.future.cancel()

    # ---- the decode loop (worker thread) --------------------------------------------------------

    def _generate_batch(self, prompts: list[list[int]], params: list[SamplingParams]) -> list[Completion]:
        import torch

        with self._model_lock, torch.inference_mode():
            return self._decode(prompts, params)

    def _decode(self, prompts: list[list[int]], params: list[SamplingParams]) -> list[Completion]:
        import torch
        from transformers import DynamicCache

        device, n = self.device, len(prompts)
        self.batches_run += 1
        self.rows_run += n
        width = max(len(p) for p in prompts)
        input_ids = torch.full((n, width), self.pad_token_id, dtype=torch.long, device=device)
        attention = torch.zeros((n, width), dtype=torch.long, device=device)
        for i, p in enumerate(prompts):
            input_ids[i, width - len(p) :] = torch.tensor(p, device=device)
            attention[i, width - len(p) :] = 1
        positions = (attention.cumsum(-1) - 1).clamp(min=0)
        budgets = [
            min(sp.max_tokens, self.max_model_len - len(p)) for sp, p in zip(params, prompts, strict=True)
        ]
        stops = [stop_ids(self.eos_token_ids, sp) for sp in params]
        generators = [
            torch.Generator(device=device).manual_seed(sp.seed) if sp.seed is not None else self._generator
            for sp in params
        ]
        out_ids: list[list[int]] = [[] for _ in range(n)]
        out_lps: list[list[float]] = [[] for _ in range(n)]

        cache = DynamicCache(config=self.model.config)
        logits = self.model(
            input_ids=input_ids,
            attention_mask=attention,
            position_ids=positions,
            past_key_values=cache,
            use_cache=True,
            logits_to_keep=1,
        ).logits[:, -1, :]
        next_pos = positions[:, -1] + 1
        active = list(range(n))  # row r of the running tensors is request active[r]
        while True:
            logits = logits.float()
            tokens = self._sample(logits, [params[i] for i in active], [generators[i] for i in active])
            logprobs = torch.log_softmax(logits, dim=-1).gather(1, tokens[:, None])[:, 0]
            tokens_l, logprobs_l = tokens.tolist(), logprobs.tolist()
            keep = []
            for r, i in enumerate(active):
                out_ids[i].append(tokens_l[r])
                out_lps[i].append(logprobs_l[r])
                if tokens_l[r] not in stops[i] and len(out_ids[i]) < budgets[i]:
                    keep.append(r)
            if not keep:
                break
            if len(keep) < len(active):  # finished rows leave the batch (and its KV cache)
                index = torch.tensor(keep, device=device)
                cache.batch_select_indices(index)
                attention, next_pos, tokens = attention[index], next_pos[index], tokens[index]
                active = [active[r] for r in keep]
            attention = torch.cat([attention, attention.new_ones((len(active), 1))], dim=1)
            logits = self.model(
                input_ids=tokens[:, None],
                attention_mask=attention,
                position_ids=next_pos[:, None],
                past_key_values=cache,
                use_cache=True,
            ).logits[:, -1, :]
            next_pos = next_pos + 1

        completions = []
        for i in range(n):
            finish = judge_finish(out_ids[i], stops[i])
            completions.append(
                Completion(
                    token_ids=out_ids[i],
                    logprobs=out_lps[i] if params[i].logprobs else [],
                    finish_reason=finish,
                    text=completion_text(self.tokenizer, out_ids[i], finish),
                    info={"prompt_tokens": len(prompts[i])},
                )
            )
        return completions

    def _sample(self, logits: Any, params: list[SamplingParams], generators: list[Any]) -> Any:
        """One id per row: argmax for temperature 0, else temperature → top-k → top-p → multinomial.

        Filtering is batched over the sampling rows; rows drawing from the engine's shared generator
        are sampled in one ``multinomial`` call, rows with their own ``seed`` one by one (so their
        draws do not depend on the rest of the batch).
        """
        import torch

        tokens = logits.argmax(dim=-1)
        rows = [r for r, sp in enumerate(params) if sp.temperature > 0]
        if not rows:
            return tokens
        device, vocab = logits.device, logits.shape[-1]
        x = logits[rows] / torch.tensor([params[r].temperature for r in rows], device=device)[:, None]
        top_k = [params[r].top_k if 0 < params[r].top_k < vocab else vocab for r in rows]
        top_p = [params[r].top_p for r in rows]
        if min(top_k) < vocab or min(top_p) < 1.0:
            sorted_x, order = torch.sort(x, dim=-1, descending=True)
            ranks = torch.arange(vocab, device=device)[None, :]
            drop = ranks >= torch.tensor(top_k, device=device)[:, None]
            probs = torch.softmax(sorted_x.masked_fill(drop, float("-inf")), dim=-1)
            # Top-p drops a token when the tokens ranked above it already hold top_p of the mass: the
            # kept set is the smallest prefix reaching top_p (the top token is always kept).
            drop |= (probs.cumsum(-1) - probs) >= torch.tensor(top_p, device=device)[:, None]
            x = x.scatter(1, order, sorted_x.masked_fill(drop, float("-inf")))
        probs = torch.softmax(x, dim=-1)
        shared = [i for i, r in enumerate(rows) if generators[r] is self._generator]
        if shared:
            drawn = torch.multinomial(probs[shared], 1, generator=self._generator)[:, 0]
            tokens[torch.tensor([rows[i] for i in shared], device=device)] = drawn
        for i, r in enumerate(rows):
            if generators[r] is not self._generator:
                tokens[r] = torch.multinomial(probs[i], 1, generator=generators[r])[0]
        return tokens


def eos_token_ids_of(model: Any, tokenizer: Any = None) -> frozenset[int]:
    """EOS ids of a loaded model (generation config, else config, else tokenizer)."""
    return eos_token_ids(getattr(model, "generation_config", None), model.config, tokenizer)
