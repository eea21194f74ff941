"""The hf engine's own CUDA stream: its worker's kernels run beside the learner's, not behind them.

A thread that picks no stream issues on the device's default stream, so an engine worker and a learner
in one process queue every kernel one behind the other. Under the ``one_step_off`` pipeline (step
k+1's rollout during step k's update) that made the two phases take as long as one after the other:
SmolLM2, 8 x 8, one H100, the update 0.446-0.453 s beside a rollout against 0.196-0.197 s alone, the
rollout 0.374-0.394 s against 0.300-0.324 (``benchmarks/results/fp8_unit_h100_2026-12-06``). The
worker issues on a stream of its own at the device's highest priority: a decode step is a few hundred
short kernels, and the block scheduler then starts each as soon as the update's running blocks leave
room, instead of after the update's queued ones. With it (one H200, two seeds each), ``one_step_off``
took SmolLM2's step to 0.497 s against 0.526 s for ``sync`` (``benchmarks/results/attention_stream_2026-12-06``);
the two phases still slow each other (the rollout 0.42-0.45 s beside the update, 0.28-0.31 alone):
both are host-bound in one interpreter.

Where the two streams meet, the order is kept here:

- :func:`batch_start`: a batch's first kernels follow the work already queued on the default stream
  (a caller that trains the engine's model in place, its optimizer step queued just before
  ``generate``);
- :func:`before_copies` / :func:`copies_done`: ``update_weights`` copies after the worker's queued
  kernels (an ``async_scheduling`` step may still run after its rows were answered) and returns once
  its copies are done.

Off CUDA every function does nothing (``stream`` is None).
"""

from __future__ import annotations

from typing import Any

# The highest priority a device has (PyTorch maps any lower number to it).
HIGHEST = -(1 << 10)


def make_current(device: Any, after: Any = None) -> Any:
    """A new stream of the highest priority on CUDA ``device``, made the calling thread's current
    stream (the worker calls it as it starts: PyTorch's current stream is per thread); None off CUDA.
    It first waits for ``after`` (the stream of the worker before, after ``close``: an
    ``async_scheduling`` step it queued may still be writing the KV slots the new worker fills)."""
    import torch

    if device.type != "cuda":
        return None
    stream = torch.cuda.Stream(device=device, priority=HIGHEST)
    if after is not None:
        stream.wait_stream(after)
    torch.cuda.set_stream(stream)
    return stream


def batch_start(stream: Any, device: Any) -> None:
    """``stream`` (the worker's, current) waits for what the default stream holds now."""
    import torch

    if stream is not None:
        stream.wait_stream(torch.cuda.default_stream(device))


def before_copies(stream: Any, device: Any) -> None:
    """The calling thread's stream waits for what the worker's ``stream`` holds now."""
    import torch

    if stream is not None:
        torch.cuda.current_stream(device).wait_stream(stream)


def copies_done(device: Any) -> None:
    """Block until the calling thread's stream has run what it holds (the weight copies), on CUDA."""
    import torch

    if device.type == "cuda":
        torch.cuda.current_stream(device).synchronize()
