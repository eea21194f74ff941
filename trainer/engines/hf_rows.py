"""The transformers engine's requests and running rows, and when an idle engine starts a batch.

A :class:`Request` waits in the engine's inbox; once admitted it becomes a :class:`Row` of the running
batch. On the static path a row that finishes keeps its slot (``done``) until the batch compacts
(:func:`compacts`), so most steps where a row leaves move no KV cache and rebuild no sampling plan.
"""

from __future__ import annotations

import asyncio
import math
import threading
import time
from collections.abc import Callable, Sized
from dataclasses import dataclass, field
from typing import Any

from chatgym.trainer.engines.base import Completion, SamplingParams
from chatgym.trainer.engines.common import StopStringChecker


@dataclass
class Request:
    prompt_ids: list[int]
    params: SamplingParams
    future: asyncio.Future[Completion]
    loop: asyncio.AbstractEventLoop
    images: tuple[Any, ...] = ()


@dataclass
class Row:
    """A request in the running batch and what it has generated so far."""

    request: Request
    budget: int  # most completion tokens (max_tokens, capped by max_model_len)
    stops: frozenset[int]
    generator: Any
    checker: StopStringChecker | None = None  # set when the request has stop strings
    seed: int = 0  # sampler 'philox': the row's key (its own seed, else drawn from the engine's seed)
    stop_string: str | None = None  # the stop string that ended the row
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    done: bool = False  # answered (or cancelled); on the static path its slot may still ride along


def resolve(future: asyncio.Future[Completion], result: Any) -> None:
    """Runs on the request's event loop: hands over a completion, an error, or a cancellation."""
    if future.done():
        return
    if result is None:
        future.cancel()
    elif isinstance(result, BaseException):
        future.set_exception(result)
    else:
        future.set_result(result)


def check_batching(max_batch_size: Any = 64, batch_window_s: Any = 0.05, batch_quiet_s: Any = 0.005) -> None:
    """Raises ValueError naming the first bad setting: ``max_batch_size`` not an int >= 1, a window
    that is not a finite number of seconds >= 0 (a string, a bool, ``inf`` or ``nan`` included: an
    infinite wait overflowed the worker's timer, a ``nan`` one silently waited for nothing)."""
    if isinstance(max_batch_size, bool) or not isinstance(max_batch_size, int) or max_batch_size < 1:
        raise ValueError(f"max_batch_size must be an int >= 1, got {max_batch_size!r}")
    for name, value in (("batch_window_s", batch_window_s), ("batch_quiet_s", batch_quiet_s)):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
            raise ValueError(f"{name} must be a finite number of seconds >= 0, got {value!r}")


def compacts(live: int, slots: int, bucket: Callable[[int], int]) -> bool:
    """Whether a static batch of ``slots`` rows, ``live`` of them still running, should move its live
    rows together now: when none is left, or when they fit a smaller row bucket (a smaller captured
    step). Otherwise the finished rows keep riding along in the same bucket at no extra cost."""
    return live == 0 or bucket(live) < bucket(slots)


def wait_for_burst(
    cond: threading.Condition, inbox: Sized, full: int, window_s: float, quiet_s: float, stopping: Callable[[], bool]
) -> None:
    """Called by an idle engine's worker with ``cond`` held and a request in ``inbox``: waits while
    requests keep arriving, so a burst (a rollout's episodes sending their first turns) is prefilled
    in one pass instead of a first few rows and then a prefill for every few that join.

    Returns once ``full`` requests wait, no request arrived for ``quiet_s`` seconds, ``window_s``
    seconds passed since the call, or ``stopping()``. (A fixed 5 ms window cut the 30-40 ms over which
    64 Math-v0 episodes send their prompts into several prefills: each a separate eager pass.)
    """
    deadline = time.monotonic() + window_s
    seen = len(inbox)
    while seen < full and not stopping():
        left = deadline - time.monotonic()
        if left <= 0:
            return
        cond.wait(min(left, quiet_s))
        if len(inbox) == seen:  # quiet: the burst is over
            return
        seen = len(inbox)
