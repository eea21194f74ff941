"""The transformers engine: a plain PyTorch decode loop with continuous batching.

For GPUs without vLLM and for quick tests. One worker thread owns the model's running batch: at every
decode step, requests that arrived meanwhile are prefilled and join the batch (up to
``max_batch_size`` rows), and rows that finish leave it and are answered at once (iteration-level
scheduling, Orca, Yu et al., OSDI 2022; the cache handling is in :mod:`.hf_batch`; on CUDA it issues on
a stream of its own, :mod:`.hf_stream`, beside a learner's kernels). Nothing waits for
a whole batch to end, which matters under the collector's traffic: episodes send their turns at
different times. Each row keeps its own sampling settings (temperature, top-p, top-k, stop ids, stop
strings, max tokens, seed). Stop strings are matched on the decoded text after every token
(``common.StopStringChecker``: the row ends on the token that completes one, which is kept).

Logprobs: each returned logprob is ``log_softmax(logits)[sampled id]`` of the model's RAW next-token
logits (upcast to float32) — temperature 1, before top-p/top-k — i.e. exactly what a trainer gets from
a forward pass of the same weights over prompt + completion. (vLLM's ``logprobs_mode="raw_logprobs"``,
its default, has the same meaning.) Left padding and the KV cache change only float rounding.

Two decode paths (``decode=``): the padded ``DynamicCache`` batch of :mod:`.hf_batch` (the CPU default),
and on CUDA the per-slot KV cache of :mod:`.hf_static`, whose decode step (:mod:`.hf_fused`) is captured
once per batch/length bucket as a CUDA graph and replayed. Both give the same ids and logprobs up to
float rounding. The static KV cache is allocated up front: ``2 x layers x max_batch_size x kv_heads x
max_model_len x head_dim`` elements (SmolLM2, 64 rows, bf16: 0.7 GiB at 512 tokens, 11.3 at its 8,192).

The decode loop is ours rather than ``model.generate`` because ``generate`` applies one sampling
setting and one seed to a whole batch, and its ``output_scores`` are the processed scores.
transformers' own continuous batching (``generate_batch`` / ``ContinuousBatchingManager``) has the
same limits: one ``do_sample`` and one seed for the manager, and its logprobs are taken after the
logits processors (temperature, top-k/top-p), not from the raw logits.
"""

from __future__ import annotations

import asyncio
import os
import random
import threading
from collections import deque
from typing import Any

from chatgym.trainer.engines import hf_batch, hf_draw, hf_fp8, hf_sampling, hf_static, hf_stream, hf_vision
from chatgym.trainer.engines.base import Completion, SamplingParams
from chatgym.trainer.engines.common import (
    StopStringChecker,
    check_prompt,
    check_token_ids,
    choose_pad_id,
    completion_text,
    copy_weights_in_place,
    embedding_rows,
    eos_token_ids_of,
    judge_stop,
    stop_ids,
)
from chatgym.trainer.engines.hf_options import check_kv_cache, check_options
from chatgym.trainer.engines.hf_rows import Request, Row, check_batching, compacts, resolve, wait_for_burst
from chatgym.trainer.models.cuda import without_cudnn_attention


class TransformersEngine:
    """:class:`~chatgym.trainer.engines.base.Engine` on a ``transformers`` causal LM, or a
    vision-language model (``"smolvlm"``) taking images (:mod:`.hf_vision`; decoded through its text side).

    Args:
        model: packaged model name (``"smollm2"``), a local model directory, or a loaded
            ``PreTrainedModel`` (used as is, e.g. the trainer's own model; the engine then shares its
            weights and ``update_weights`` is not needed; its train/eval mode is left alone).
        tokenizer: for ``Completion.text``; loaded from ``model`` when it is a name/path, else none (no text).
        dtype: ``torch.dtype`` or name, when the engine loads the model (``"float32"`` default;
            ``"bfloat16"`` is ~1.3x faster on CPUs with AVX-512 BF16 and on GPUs).
        device: ``"cpu"``, ``"cuda"``, ...; default CUDA when available.
        max_batch_size: most requests decoded together (running rows; the rest wait their turn).
        batch_window_s: most seconds the first request waits for others when the engine is idle;
            ``batch_quiet_s``: the wait ends sooner once no request arrived for that long (a burst is
            prefilled in one pass, a lone request waits ``batch_quiet_s``: :func:`.hf_rows.wait_for_burst`);
            requests arriving while rows decode join at the next step.
        seed: seed of the generator used by requests without their own ``seed``.
        eos_token_ids: the EOS ids (default: every id in the generation config); ``[]``: none (rows run to budget).
        max_model_len: prompt + completion limit in tokens (default: ``max_position_embeddings``);
            completions are cut there with ``finish_reason="length"``.
        num_threads: torch CPU threads (default: leave torch's setting).
        decode: ``"dynamic"``: the padded ``DynamicCache`` batch of :mod:`.hf_batch`; ``"static"``: the
            preallocated per-slot KV cache of :mod:`.hf_static`, replayed as CUDA graphs on a GPU (no
            per-token launch overhead; one graph capture per batch/length bucket on first use, reused
            across weight updates); ``"auto"`` (default): static on CUDA when the model supports it,
            dynamic otherwise (on the CPU the dynamic path is as fast).
        async_scheduling: static path: queue decode step ``k + 1`` before step ``k``'s ids are read
            back, so the host's per-step work overlaps it (as vLLM's async scheduling); same ids and
            logprobs up to float rounding. Default False: faster generation on an H200, but its training
            runs had slower updates and more peak memory (``benchmarks/results/vs_trl_h200_fused_step/``).
        image_processor: a VLM's image processor (default: loaded from the model's directory).
        fused_step: static path: prefill and decode through :mod:`.hf_fused` (~18 kernels a layer; 2.5x
            faster steps on an H200) when the model allows; False: the model's own layers; ``"compiled"``:
            fused, its element-wise pieces compiled (:mod:`.hf_elementwise`) and, on CUDA, its attention one
            Triton kernel a layer (:mod:`.hf_attention`). Same function up to rounding.
        quantization: ``"fp8"``: the fused static step on FP8 weights (:mod:`.hf_fp8`; needs a CUDA GPU
            of compute capability >= 8.9, refused elsewhere); ``fp8_lm_head``: the LM head in FP8 too.
            ``update_weights`` re-quantizes (scales recomputed) into the same buffers. None: the dtype's.
        kv_cache_dtype: ``"fp8"``: the KV cache in e4m3 (:mod:`.hf_attention`: compiled fused step, CUDA
            of compute capability >= 8.9); ``"auto"`` (default): the model's dtype.
        sampler: ``"generators"`` (default): each seeded row draws from its own ``torch.Generator``, the
            ids ``torch.multinomial`` gives (:mod:`.hf_sampling`); ``"philox"`` (CUDA): one Triton kernel
            a step draws, scores and packs every row (:mod:`.hf_draw`: counter-based Philox keyed by the
            row's seed; other ids, the same distribution; steps with top-k / top-p rows fall back).
        multi_step: static path: decode steps issued per read-back of the sampled ids (1: every step);
            with N each step's ids are drawn and fed to the next on the device, and the host waits, checks
            stops and records once per N steps (as vLLM's multi-step scheduling): fewer waits, each a
            hand-off of the interpreter lock. A row that stops mid-run rides along to its end (those ids
            are dropped); seeded rows draw the ids they draw with 1; joiners wait for the run's end.
        precapture: static path on CUDA: as requests join, capture every graph their decode can need at
            once, not each on first use mid-rollout (:meth:`.hf_static.StaticSlots.precapture`).

    Padding: prompts joining together are padded with ``pad_token_id``, the generation config's
    ``pad_token_id`` when it is a token of the model, else the smallest EOS id, else the tokenizer's
    pad id, else 0 (``common.choose_pad_id``; padded positions are masked, so the choice changes no
    output). ``vocab_size`` is the model's embedding rows (``config.vocab_size`` when smaller).

    Raises:
        ValueError: ``max_batch_size < 1``, ``batch_window_s`` or ``batch_quiet_s`` < 0, ``eos_token_ids``
            holding an id outside ``[0, vocab_size)`` (``eos_token_ids=[-1]``, say: the message names the
            argument and the vocabulary size), ``async_scheduling`` or ``multi_step`` > 1 without the
            static path, a bad ``fused_step``, ``multi_step`` not an int >= 1, ``precapture`` not a bool.
        TypeError: ``eos_token_ids`` not ints.

    Counters (for tests and benchmarks): ``batches_run`` prefill passes (each admits a group of
    requests), ``rows_run`` requests admitted, ``decode_steps`` decode passes.
    """

    _stream: Any = None  # the worker's CUDA stream (:mod:`.hf_stream`), made as the worker starts

    def __init__(
        self,
        model: Any = "smollm2",
        tokenizer: Any = None,
        *,
        dtype: Any = "float32",
        device: str | None = None,
        max_batch_size: int = 64,
        batch_window_s: float = 0.05,
        batch_quiet_s: float = 0.005,
        seed: int = 0,
        eos_token_ids: Any = None,
        max_model_len: int | None = None,
        num_threads: int | None = None,
        decode: str = "auto",
        async_scheduling: bool = False,
        fused_step: bool | str = True,
        image_processor: Any = None,
        quantization: str | None = None,
        fp8_lm_head: bool = False,
        sampler: str = "generators",
        multi_step: int = 1,
        precapture: bool = False,
        kv_cache_dtype: str = "auto",
    ) -> None:
        import torch

        from chatgym.trainer.models.packaged import load_model

        check_batching(max_batch_size, batch_window_s, batch_quiet_s)
        if num_threads:
            torch.set_num_threads(num_threads)
        source = model if isinstance(model, (str, os.PathLike)) else None
        device = (device or ("cuda" if torch.cuda.is_available() else "cpu")) if source else model.device
        self.fp8 = hf_fp8.check_quantization(quantization, device)  # before the model loads: refuse early
        self.fp8_lm_head, self.kv_cache_dtype = self.fp8 and bool(fp8_lm_head), check_kv_cache(kv_cache_dtype, device)
        if source is not None:
            if tokenizer is None:
                from chatgym.trainer.chat.tokenizer import get_tokenizer

                tokenizer = get_tokenizer(model)
            model = load_model(model, dtype=dtype, device=device)  # in eval mode
        # A model passed in is used as is (train/eval mode included): it may be the trainer's own.
        self.model, self.tokenizer, self.device = model, tokenizer, next(model.parameters()).device
        self.vision = hf_vision.EngineVision.of(model, image_processor, source)
        self._decoder = hf_vision.text_decoder(model)  # the model itself unless it is a VLM
        config = self._decoder.config
        self.vocab_size = embedding_rows(self._decoder)
        self.max_model_len = int(max_model_len or getattr(config, "max_position_embeddings", 1 << 30))
        self.eos_token_ids = (
            check_token_ids(eos_token_ids, self.vocab_size, "eos_token_ids")
            if eos_token_ids is not None
            else eos_token_ids_of(model, tokenizer)
        )
        declared = getattr(getattr(model, "generation_config", None), "pad_token_id", None)
        self.pad_token_id = choose_pad_id(declared, self.eos_token_ids, tokenizer, self.vocab_size)
        self.max_batch_size, self.batch_window_s, self.batch_quiet_s = max_batch_size, batch_window_s, batch_quiet_s
        self._generator = torch.Generator(device=self.device).manual_seed(seed)
        self._seeds = random.Random(seed)
        # The worker holds the model lock from the moment rows start decoding until the batch is
        # empty, so a weight update never lands in the middle of a sequence; while an update waits,
        # no new rows are admitted (the batch drains, the update runs, admission resumes).
        self._model_lock, self._cond = threading.Lock(), threading.Condition()
        self._inbox: deque[Request] = deque()
        self._updates_waiting, self._stopping = 0, False
        # One long-lived worker thread: CUDA/cuBLAS and PyTorch keep per-thread state, and a fresh
        # thread per batch paid seconds of set-up on a GPU.
        self._worker: threading.Thread | None = None
        self._can_join: bool | None = None  # known after the first prefill (see hf_batch.can_join)
        self.decode = self._choose_decode(decode)
        self._slots: Any = None  # hf_static.StaticSlots, made by the worker on first use
        self.async_scheduling, self.sampler, self.multi_step, self.precapture = (
            bool(async_scheduling), sampler, multi_step, precapture)
        self.fused_step = check_options(
            self.decode, fp8=self.fp8, async_scheduling=async_scheduling, fused_step=fused_step,
            sampler=sampler, cuda=self.device.type == "cuda", multi_step=multi_step, precapture=precapture,
            kv_cache_dtype=kv_cache_dtype, dtype=next(model.parameters()).dtype)
        self._ahead: Any = None  # async_scheduling: logits of the decode step queued for the running rows
        self._plan: tuple[list[Row], Any] = ([], None)  # the running rows' hf_sampling plan
        self.batches_run = self.rows_run = self.decode_steps = 0

    # ---- Engine contract -------------------------------------------------------------------------

    async def generate(self, prompt_ids: list[int], params: SamplingParams, *, images: Any = ()) -> Completion:
        """Generate one completion; see the module docstring for the logprob definition.

        Args:
            prompt_ids: token ids (``list[int]``), 1 ≤ length < ``max_model_len``.
            params: sampling settings; ``temperature=0`` is greedy (argmax), ``seed`` makes sampling
                reproducible for this request whatever else is in its batch.
            images: a VLM's prompt images (``PIL.Image.Image``) in the order of their ``<image>`` runs in
                ``prompt_ids`` (each encoded once per engine and weights, :mod:`.hf_vision`).

        Returns:
            ``Completion`` with ``token_ids`` as sampled (the final EOS/stop id included; for a stop
            string, every id through the one that completed it), ``logprobs`` aligned 1:1 (empty
            when ``params.logprobs`` is False), ``finish_reason`` judged on the completion ids only,
            ``stop_reason`` (the stop string or id), and ``info["prompt_tokens"]``.

        Raises:
            TypeError / ValueError: a malformed prompt (see ``check_prompt``); a stop id outside
                ``[0, vocab_size)``; ``params.stop`` without a tokenizer (matched on the decoded text).
            ValueError: images for a model without vision, or not matching the prompt's ``<image>`` tokens.
            RuntimeError: the model failed (the exception is chained); every request decoding in
                that step fails with it, later requests are served normally.
        """
        ids = check_prompt(prompt_ids, self.vocab_size, self.max_model_len)
        images = hf_vision.check_images(self.vision, ids, images)
        if not isinstance(params, SamplingParams):
            raise TypeError(f"params must be SamplingParams, got {type(params).__name__}")
        check_token_ids(params.stop_token_ids, self.vocab_size, "SamplingParams.stop_token_ids")
        if params.stop and self.tokenizer is None:
            raise ValueError("TransformersEngine needs a tokenizer for stop strings: pass tokenizer=")
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Completion] = loop.create_future()
        with self._cond:
            self._ensure_worker()
            self._inbox.append(Request(ids, params, future, loop, images))
            self._cond.notify_all()
        return await future

    def update_weights(self, weights: Any) -> None:
        """Copy new weights into the model in place, and into the fused step (FP8: re-quantized).

        Blocks until the rows decoding now have finished (no sequence mixes two sets of weights);
        requests arriving meanwhile start after the update. On CUDA it returns once the copies are done.

        Args:
            weights: a state dict or an iterable of ``(name, tensor)`` (names as in ``state_dict()``, tied
                ones under either; a subset is fine), cast to the engine's dtype/device. A state dict,
                list or tuple is checked whole before any copy; an iterator is copied pair by pair.

        Raises:
            KeyError: an unknown name. ValueError: a shape that does not match.
            TypeError: a value that is not a torch.Tensor (numpy array, list: named), or not a pair.
        """
        with self._cond:
            self._updates_waiting += 1
        try:
            with self._model_lock:
                hf_stream.before_copies(self._stream, self.device)
                copy_weights_in_place(self.model, weights)
                if self._slots is not None:  # re-concatenate / re-quantize now: the cost is the update's
                    self._slots.follow_the_model()
                hf_stream.copies_done(self.device)  # timing/sync_s holds the copies' kernels
        finally:
            with self._cond:
                self._updates_waiting -= 1
                self._cond.notify_all()

    async def close(self) -> None:
        """Stop the worker (pending and running requests are cancelled; one sent after the worker's last
        look at its inbox starts the next worker); the engine can be used again."""
        with self._cond:
            worker, self._stopping = self._worker, True
            self._cond.notify_all()
        if worker is not None:
            await asyncio.to_thread(worker.join)
        with self._cond:
            if self._worker is worker:
                self._worker = None
            self._stopping = False

    # ---- the worker thread ----------------------------------------------------------------------

    def _ensure_worker(self) -> None:
        """Start the worker if none runs (called with ``_cond`` held)."""
        if self._worker is None or not self._worker.is_alive():
            self._stopping = False
            self._worker = threading.Thread(target=self._serve, name="hf-engine", daemon=True)
            self._worker.start()

    def _take_joiners(self, running: int) -> list[Request] | None:
        """Requests to admit before the next step (None: the worker should stop); blocks while there is
        nothing to do. Called without any lock held."""
        with self._cond:
            while True:
                if self._stopping:
                    return None
                admit = self._updates_waiting == 0 and (running == 0 or self._can_join is not False)
                if admit and self._inbox:
                    break
                if running:
                    return []  # keep decoding; nothing (admissible) to add
                self._cond.wait()
            if running == 0 and self.batch_window_s > 0:  # idle: let a burst arrive, prefill it in one pass
                wait_for_burst(self._cond, self._inbox, self.max_batch_size, self.batch_window_s,
                               self.batch_quiet_s, lambda: self._stopping)
                if self._stopping:
                    return None
            joiners = []
            while self._inbox and running + len(joiners) < self.max_batch_size:
                request = self._inbox.popleft()
                if not request.future.done():  # cancelled while it waited
                    joiners.append(request)
            return joiners

    def _serve(self) -> None:
        self._stream = hf_stream.make_current(self.device, after=self._stream)
        rows: list[Row] = []
        batch: hf_batch.Batch | None = None
        try:
            while True:
                joiners = self._take_joiners(sum(not row.done for row in rows))
                if joiners is None:
                    break
                if not rows and not joiners:
                    continue
                if not rows:
                    self._model_lock.acquire()
                    hf_stream.batch_start(self._stream, self.device)
                try:
                    rows, batch = self._step(rows, batch, joiners)
                except Exception as exc:  # this step failed: its requests see why; the engine goes on
                    error = RuntimeError(f"TransformersEngine: decoding {len(rows) + len(joiners)} rows failed: {exc!r}")
                    error.__cause__ = exc
                    for request in [r.request for r in rows] + joiners:
                        self._answer(request, error)
                    rows, batch, self._ahead = [], None, None
                    if self._slots is not None:
                        self._slots.clear()
                if not rows:
                    batch = None
                    self._model_lock.release()
        finally:
            self._ahead = None
            if self._slots is not None:
                self._slots.clear()
            if rows:
                self._model_lock.release()
            with self._cond:
                pending, self._inbox = [r.request for r in rows] + list(self._inbox), deque()
                if self._worker is threading.current_thread():  # a request from now on starts a new worker
                    self._worker = None
            for request in pending:
                self._answer(request, None)

    def _answer(self, request: Request, result: Any) -> None:
        try:
            request.loop.call_soon_threadsafe(resolve, request.future, result)
        except RuntimeError:  # the caller's event loop is closed: nobody is waiting
            pass

    def _step(
        self, rows: list[Row], batch: hf_batch.Batch | None, joiners: list[Request]
    ) -> tuple[list[Row], hf_batch.Batch | None]:
        """One token for every running row and every joiner; returns the rows still running."""
        import torch

        if self.decode == "static":
            return self._step_static(rows, joiners), None
        with torch.inference_mode(), without_cudnn_attention(self.device):
            parts = []
            if rows:
                assert batch is not None
                parts.append(hf_batch.decode(self._decoder, batch))
                self.decode_steps += 1
            if joiners:
                prompts = [r.prompt_ids for r in joiners]
                new, logits = hf_batch.prefill(self._decoder, prompts, self.pad_token_id, *self._embeds(joiners))
                self.batches_run += 1
                self.rows_run += len(joiners)
                if self._can_join is None:
                    self._can_join = hf_batch.can_join(new.cache)
                batch = new if batch is None else hf_batch.join(batch, new)
                parts.append(logits)
                rows = rows + [self._new_row(r) for r in joiners]
            assert batch is not None
            batch.tokens, keep = self._take_tokens(rows, parts)
            if len(keep) < len(rows):
                rows = [rows[r] for r in keep]
                if rows:
                    hf_batch.select(batch, keep)
        return rows, (batch if rows else None)

    def _take_tokens(
        self, rows: list[Row], parts: list[Any], ahead: Any = None, steps: int = 1
    ) -> tuple[Any, list[int]]:
        """Sample one id per row from the step's logits (``parts``, row order), then ``steps - 1`` more
        steps on the device, each decoding the ids just drawn (``multi_step``); record the ids and raw
        logprobs in order; returns the last ids ``(rows,)`` (on the device) and the rows still running.

        The steps read back from the device once (ids, logprobs and the sampler's validity flags in one
        copy, :func:`.hf_sampling.start_to_host`); nothing else waits for the device.
        ``ahead(tokens)`` (``async_scheduling``) runs between the last draw and the wait for it.
        """
        import torch

        logits = parts[0] if len(parts) == 1 else torch.cat(parts)
        plan = self._plan_for(rows)
        tokens, packed = _draw(logits, plan)
        packs = [packed]
        for _ in range(steps - 1):
            self._slots.set_tokens(tokens)
            tokens, packed = _draw(self._slots.decode(), plan)
            self.decode_steps += 1
            packs.append(packed)
        sizes = [p.numel() for p in packs]
        wait = hf_sampling.start_to_host(packs[0] if steps == 1 else torch.cat(packs), len(rows), sizes)
        if ahead is not None:
            ahead(tokens)
        keep: list[int] = []
        for ids, lps, bad in wait():
            bad = set(bad if plan.philox is not None else [plan.sampled[i] for i in bad])
            bad |= {r for r, lp in enumerate(lps) if lp != lp}  # a NaN raw logprob: nan/inf logits, greedy rows too
            bad = [r for r in sorted(bad) if not rows[r].done]
            if bad:
                raise RuntimeError(
                    f"sampling: the next-token probabilities of {len(bad)} row(s) are not a distribution "
                    "(nan/inf logits)"
                )
            keep = self._record(rows, ids, lps)
        return tokens, keep

    def _plan_for(self, rows: list[Row]) -> hf_sampling.SamplingPlan:
        """The rows' sampling plan, rebuilt only when the running rows changed (joined or left)."""
        cached_rows, plan = self._plan
        if (
            plan is None
            or len(cached_rows) != len(rows)
            or any(a is not b for a, b in zip(cached_rows, rows, strict=True))
        ):
            plan = hf_sampling.build_plan(
                [r.request.params for r in rows], [r.generator for r in rows], self._generator,
                self.vocab_size, self.device
            )
            if self.sampler == "philox" and plan.top_k is None:  # top-k / top-p rows: the default path
                plan.philox = hf_draw.build_plan([r.seed for r in rows], [len(r.token_ids) for r in rows],
                                                 [r.request.params.temperature for r in rows], self.device)
            self._plan = (list(rows), plan)  # holds the rows: their identity is the cache key
        return plan

    def _record(self, rows: list[Row], tokens: list[int], logprobs: list[float]) -> list[int]:
        """Append each running row's new token; answer (and mark ``done``) the rows that finished; returns
        the indices still running (rows already ``done`` ride along in their slots and are skipped)."""
        keep = []
        for r, row in enumerate(rows):
            if row.done:
                continue
            row.token_ids.append(tokens[r])
            row.logprobs.append(logprobs[r])
            if row.request.future.done():  # cancelled by its caller: stop spending steps on it
                row.done = True
                continue
            done = tokens[r] in row.stops
            if not done and row.checker is not None:
                row.stop_string = row.checker(row.token_ids)
                done = row.stop_string is not None
            if done or len(row.token_ids) >= row.budget:
                row.done = True
                self._answer(row.request, self._completion(row))
            else:
                keep.append(r)
        return keep

    def _choose_decode(self, decode: str) -> str:
        if decode not in ("auto", "static", "dynamic"):
            raise ValueError(f"decode must be 'auto', 'static' or 'dynamic', got {decode!r}")
        ok, why = hf_static.supports(self._decoder)
        if decode == "static" and not ok:
            raise ValueError(f"decode='static' cannot run this model: {why}")
        if decode == "auto":
            return "static" if ok and self.device.type == "cuda" else "dynamic"
        return decode

    def _step_static(self, rows: list[Row], joiners: list[Request]) -> list[Row]:
        """:meth:`_step` over :class:`.hf_static.StaticSlots` (row ``r`` is slot ``r``). A row that
        finishes keeps its slot (``done``, retired to position 0) until the live rows fit a smaller row
        bucket or joiners come (:func:`.hf_rows.compacts`): in an H100 profile of SmolLM2's rollouts the
        worker spent 15% of its busy samples moving rows, 5% rebuilding the plan, as each row left."""
        import torch

        if self._slots is None:
            self._slots = hf_static.StaticSlots(
                self._decoder, self.max_batch_size, self.max_model_len, fused=self.fused_step,
                fp8=self.fp8, fp8_lm_head=self.fp8_lm_head, kv_cache_dtype=self.kv_cache_dtype,
            )
        slots = self._slots
        with torch.inference_mode(), without_cudnn_attention(self.device):
            if joiners and any(row.done for row in rows):  # joiners take the slots after the live rows
                rows = self._compact(rows, [r for r, row in enumerate(rows) if not row.done])
            parts = []
            if rows:
                queued, self._ahead = self._ahead, None
                parts.append(queued if queued is not None else slots.decode())
                self.decode_steps += 1
            if joiners:
                prompts = [r.prompt_ids for r in joiners]
                parts.append(slots.admit(prompts, self.pad_token_id, *self._embeds(joiners)))
                self.batches_run += 1
                self.rows_run += len(joiners)
                new = [self._new_row(r) for r in joiners]
                rows = rows + new
                if self.precapture:  # after admit: it drops graphs of a model whose modules were replaced
                    slots.precapture(max(len(row.request.prompt_ids) + row.budget for row in new))
            running = [r for r, row in enumerate(rows) if not row.done]
            ahead = self._decode_ahead if self.async_scheduling else None
            # multi_step: as many steps as fit the cache (the queued step ahead included)
            steps = max(1, min(self.multi_step, slots.room() + 1 - (ahead is not None)))
            tokens, keep = self._take_tokens(rows, parts, ahead, steps)
            if ahead is None:
                slots.set_tokens(tokens)
            if len(keep) < len(running):
                if compacts(len(keep), len(rows), slots.row_bucket):
                    rows = self._compact(rows, keep)
                else:
                    slots.retire(sorted(set(running) - set(keep)))
        return rows

    def _compact(self, rows: list[Row], keep: list[int]) -> list[Row]:
        """Rows ``keep`` (ascending) become slots ``0 .. len(keep)-1``; the others' slots are freed."""
        self._slots.select(keep)
        if self._ahead is not None:  # the queued step ran for the rows that left too
            self._ahead = self._ahead[hf_sampling.device_tensor(keep, self.device)] if keep else None
        return [rows[r] for r in keep]

    def _embeds(self, joiners: list[Request]) -> tuple[Any, ...]:
        """``(embeds,)``: the joiners' prompt embeddings with their images; ``()`` when no joiner has
        images (the prefill then takes the ids, as for a text-only model)."""
        if not any(r.images for r in joiners):
            return ()
        return (self.vision.embeds([r.prompt_ids for r in joiners], [r.images for r in joiners]),)

    def _decode_ahead(self, tokens: Any) -> None:
        """``async_scheduling``: queue the next step for every row now (rows that finish here are decoded
        once more for nothing). It fits: a row's last id sits at ``prompt + budget - 1 < max_model_len``."""
        self._slots.set_tokens(tokens)
        self._ahead = self._slots.decode()

    def _new_row(self, request: Request) -> Row:
        import torch

        sp = request.params
        own = sp.seed is not None
        generator = torch.Generator(device=self.device).manual_seed(sp.seed) if own else self._generator
        budget = min(sp.max_tokens, self.max_model_len - len(request.prompt_ids))
        checker = StopStringChecker(self.tokenizer, sp.stop) if sp.stop else None
        seed = sp.seed if own else self._seeds.getrandbits(63)  # the philox sampler's key for the row
        return Row(request, budget, stop_ids(self.eos_token_ids, sp), generator, checker, seed=seed)

    def _completion(self, row: Row) -> Completion:
        finish, reason = judge_stop(row.token_ids, row.stops, row.stop_string)
        return Completion(token_ids=row.token_ids, logprobs=row.logprobs if row.request.params.logprobs else [],
                          finish_reason=finish, text=completion_text(self.tokenizer, row.token_ids, finish, reason),
                          info={"prompt_tokens": len(row.request.prompt_ids)}, stop_reason=reason)


def _draw(logits: Any, plan: hf_sampling.SamplingPlan) -> tuple[Any, Any]:
    """A step's ids and packed read-back: one Triton kernel (sampler 'philox') or the default path."""
    return hf_draw.draw(logits, plan.philox) if plan.philox is not None else hf_sampling.draw_packed(logits, plan)

