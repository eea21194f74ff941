"""vLLM's sleep mode around the learner's update (``engine.options.sleep_level``, the in-process engine).

In the ``sync`` pipeline the engine idles while the learner updates; with a sleep level vLLM gives the
GPU memory it holds back for that time (``LLM(enable_sleep_mode=True)``, ``sleep(level)``,
``wake_up(tags)``; vLLM's cumem allocator unmaps the memory of each tag, so it needs CUDA):

- level 1: the KV cache is discarded and the weights are copied to CPU memory (pinned) and back;
- level 2: both are discarded; the weights come back only by a load (the sync's new weights).

The step (:meth:`~chatgym.trainer.pipeline.Pipeline.sync_step`, via
:class:`~chatgym.trainer.rollout.source.LocalRollout`): rollout, then ``sleep()``, the update, then at
the weight sync ``wake_up(["weights"])``, the new weights loaded (and the prefix cache reset), then
``wake_up(["kv_cache"])``: the KV cache is mapped again only after the learner's exported weights were
loaded and dropped, so the two never take memory together. That is the peers' order: verl's rollout
sharding managers wake the weights, sync, free the trainer's copy, then wake the KV cache; TRL 1.16
(``vllm_enable_sleep_mode``, ``VLLMGeneration``) sleeps at level 2 after generating, wakes the weights
(after ``torch.cuda.empty_cache()``, so the learner's cached blocks go back to the driver first) to
push new ones, and wakes the KV cache just before generating.

:class:`SleepState` is the bookkeeping of one engine's sleep mode, shared by
:class:`~chatgym.trainer.engines.vllm_inproc.VLLMEngine` and the CPU tests' fake engine: it checks each
call against what is asleep, so a call out of order fails with a message instead of vLLM writing to
unmapped memory or sampling from discarded weights.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

SLEEP_LEVELS = (0, 1, 2)
TAGS = ("kv_cache", "weights")  # vLLM's sleep tags (``vllm.v1.executor.abstract.SLEEP_TAGS``)
FIELD = "engine.options.sleep_level"


def check_sleep_level(level: Any, name: str = "sleep_level") -> int:
    """``level`` when it is 0, 1 or 2 (an int, not a bool).

    Raises:
        ValueError: any other value (the message starts with ``name``).
    """
    if isinstance(level, bool) or not isinstance(level, int) or level not in SLEEP_LEVELS:
        raise ValueError(f"{name} must be 0 (off), 1 or 2, got {level!r}")
    return level


def sleep_mode_unavailable() -> str | None:
    """Why vLLM's sleep mode cannot run on this machine, or None when it can: vLLM's own checks,
    ``current_platform.is_sleep_mode_available()`` and, on CUDA/ROCm, its cumem allocator (imports vLLM)."""
    try:
        from vllm.platforms import current_platform
    except ModuleNotFoundError:
        return "vLLM is not installed (pip install 'chatgym[vllm]')"
    name = getattr(current_platform, "device_name", None) or type(current_platform).__name__
    if not current_platform.is_sleep_mode_available():
        return f"vLLM's {name} platform has no sleep mode (it needs a CUDA GPU: vLLM's cumem allocator)"
    if current_platform.is_cuda_alike() and not current_platform.is_cumem_allocator_available():
        return f"vLLM's cumem allocator, which sleep mode needs, is not available on its {name} platform"
    return None


def sleep_config_refusal(cfg: Any) -> str | None:
    """Why a run config (``cfg``: a :class:`~chatgym.trainer.config.run.Config`) cannot honour its
    ``engine.options.sleep_level`` (one line naming the field), or None. Refused: a value other than
    0/1/2; an engine other than the in-process ``vllm``; ``trainer.backend: ray`` (its workers' engines
    are never put to sleep); a pipeline that generates during the update (anything but ``sync``); a
    machine without sleep mode (vLLM's platform check, last: it imports vLLM). Also refused:
    ``reward.judge_options.sleep_level`` (a separate judge's engine is never put to sleep, and vLLM's
    allocator, one per process, would put it to sleep with the policy's)."""
    judge = cfg.reward.judge_options.get("sleep_level", 0)
    if judge:
        return (
            f"reward.judge_options.sleep_level: {judge!r} is refused: only the policy's engine sleeps "
            "(engine.options.sleep_level), and vLLM's sleep mode, one allocator per process, would put the "
            "judge's to sleep with it; leave it 0"
        )
    try:
        level = check_sleep_level(cfg.engine.options.get("sleep_level", 0), FIELD)
    except ValueError as exc:
        return str(exc)
    if not level:
        return None
    refused = f"{FIELD}: {level} is refused:"
    if cfg.engine.backend != "vllm":
        return f"{refused} sleep mode is the in-process vLLM engine's; engine.backend is {cfg.engine.backend!r} (set vllm)"
    if cfg.trainer.backend != "local":
        return f"{refused} trainer.backend {cfg.trainer.backend!r}: its rollout workers' engines are never put to sleep (use local)"
    if cfg.trainer.pipeline != "sync":
        return (
            f"{refused} trainer.pipeline {cfg.trainer.pipeline!r} generates while the learner updates; "
            "the engine sleeps only in the sync pipeline"
        )
    why = sleep_mode_unavailable()
    return None if why is None else f"{refused} {why}"


def fall_asleep(llm: Any, level: int, in_flight: int) -> None:
    """``llm.sleep(level=level)`` (a ``vllm.LLM``) when no request is in flight.

    Raises:
        RuntimeError: ``in_flight`` requests (vLLM's sleep aborts them, and their callers would wait forever).
    """
    if in_flight:
        raise RuntimeError(f"sleep: {in_flight} requests in flight; sleep between rollouts")
    llm.sleep(level=level)


def wake_vllm(llm: Any, tags: list[str]) -> None:
    """``llm.wake_up(tags=tags)`` once torch's cached free blocks (the learner's, after its update) went
    back to the driver: vLLM maps the woken memory from the driver, not from torch's cache (TRL calls
    ``empty_cache()`` before its wake for the same reason)."""
    import torch

    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    llm.wake_up(tags=tags)


class SleepState:
    """What one engine's vLLM sleep mode holds asleep, and the order its calls must keep.

    Each method checks the call, runs the given vLLM call, then records its effect (a vLLM call that
    raises records nothing). Single-threaded: the engine calls it on its own thread.

    Attributes:
        level: 0 (off), 1 or 2.
        asleep: vLLM's tags asleep now (``"weights"``, ``"kv_cache"``; empty: awake).
        discarded: level 2 dropped the weights and none were loaded since (the memory may be mapped
            again, its contents are not the model's).

    Raises:
        ValueError: ``level`` is not 0, 1 or 2.
    """

    def __init__(self, level: int = 0):
        self.level = check_sleep_level(level)
        self.asleep: frozenset[str] = frozenset()
        self.discarded = False

    def sleep(self, fall_asleep: Callable[[int], Any], level: int | None = None) -> None:
        """``fall_asleep(level)`` (vLLM's ``sleep``; ``level`` None: :attr:`level`, else 1 or 2 for
        this sleep only, as vLLM takes it per call), then every tag is asleep.

        Raises:
            RuntimeError: :attr:`level` 0 (vLLM was started without sleep mode), or already asleep.
            ValueError: ``level`` other than None, 1 or 2.
        """
        if not self.level:
            raise RuntimeError("sleep: sleep_level is 0, so vLLM was started without sleep mode")
        if level is None:
            level = self.level
        elif isinstance(level, bool) or not isinstance(level, int) or level not in (1, 2):
            raise ValueError(f"sleep: level must be 1 or 2, got {level!r}")
        if self.asleep:
            raise RuntimeError(f"sleep: already asleep ({', '.join(sorted(self.asleep))})")
        fall_asleep(level)
        self.asleep, self.discarded = frozenset(TAGS), level == 2

    def wake(self, tags: list[str] | None, wake_up: Callable[[list[str]], Any]) -> None:
        """``wake_up(tags)`` (vLLM's, with the tags sorted; None: every tag asleep), then they are awake.
        Nothing asleep and ``tags`` None: no call.

        Raises:
            RuntimeError: a tag that is not asleep (or not one of vLLM's).
        """
        want = self.asleep if tags is None else frozenset(tags)
        if not want <= self.asleep:
            raise RuntimeError(
                f"wake_up: {sorted(want - self.asleep)} not asleep (asleep: {sorted(self.asleep) or 'nothing'})"
            )
        if want:
            wake_up(sorted(want))
            self.asleep -= want

    def load(self, load: Callable[[], Any]) -> None:
        """``load()`` (new weights into the model), then the weights are the model's again.

        Raises:
            RuntimeError: the weights are asleep (their memory is unmapped: wake them first).
        """
        if "weights" in self.asleep:
            raise RuntimeError("update_weights: the weights are asleep; wake_up(['weights']) first")
        load()
        self.discarded = False

    def check_awake(self) -> None:
        """Before a generate call.

        Raises:
            RuntimeError: something is asleep, or the weights were discarded and not loaded again.
        """
        if self.asleep:
            raise RuntimeError(f"the engine is asleep ({', '.join(sorted(self.asleep))}); wake_up() first")
        if self.discarded:
            raise RuntimeError("sleep level 2 discarded the weights; update_weights() before generating")
