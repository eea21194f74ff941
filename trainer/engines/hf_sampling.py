"""One token per running row of the transformers engine, with no device sync while drawing.

``torch.multinomial(p, 1, generator=g)`` is, in PyTorch's own implementation (the one-sample fast path
of ``aten/src/ATen/native/Distributions.cpp``), ``argmax(p / q)`` with ``q = empty_like(p)
.exponential_(generator=g)`` (the exponential form of the Gumbel-max trick) — preceded by two checks
of ``p`` that each read a value back to the host (``.item()``). Called once per seeded row, that would be
two GPU syncs per row per decode step (128 at 64 rows), which stalls the launch queue every time. Here
each row's ``q`` is drawn into one buffer from the row's own generator (the same ``exponential_`` call
on a tensor of the same size, so the same numbers), one division and one argmax serve every row, and
the validity check becomes a per-row flag that travels back with the step's ids and logprobs in the
engine's one device-to-host copy. The ids are the ones the per-row ``multinomial`` calls give.

The per-row settings (temperature, top-k, top-p, which generator) only change when rows join or
leave, so they are turned into device tensors once per set of rows (:func:`build_plan`), not per step.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from chatgym.trainer.engines.base import SamplingParams


@dataclass
class SamplingPlan:
    """The per-row settings of one set of running rows, as device tensors.

    Attributes:
        rows: number of rows.
        sampled: rows not :attr:`~.base.SamplingParams.greedy` (the others take the argmax).
        index: ``(len(sampled),)`` int64 device tensor of ``sampled``; None when every row samples (or
            none does).
        temperature: ``(len(sampled), 1)`` float32; None when every sampled row has temperature 1
            (``x / 1`` is ``x`` exactly, so the division is skipped).
        top_k, top_p: ``(len(sampled), 1)`` int64 / float32; None when no sampled row filters.
        shared: positions in ``sampled`` drawing from the engine's shared generator.
        shared_index: device tensor of ``shared``; None when ``shared`` is all of ``sampled``.
        own: ``(position in sampled, generator)`` of rows with their own ``seed``.
        shared_generator: the engine's generator.
    """

    rows: int
    sampled: list[int]
    index: Any
    temperature: Any
    top_k: Any
    top_p: Any
    shared: list[int]
    shared_index: Any
    own: list[tuple[int, Any]]
    shared_generator: Any
    philox: Any = None  # sampler 'philox': the rows' hf_draw.PhiloxPlan, drawn by its kernel instead


def build_plan(
    params: Sequence[SamplingParams],
    generators: Sequence[Any],
    shared_generator: Any,
    vocab: int,
    device: Any,
) -> SamplingPlan:
    """The :class:`SamplingPlan` of rows with these settings (``generators[r]`` is row ``r``'s)."""
    sampled = [r for r, sp in enumerate(params) if not sp.greedy]
    n = len(sampled)
    temps = [params[r].temperature for r in sampled]
    top_k = [params[r].top_k if 0 < params[r].top_k < vocab else vocab for r in sampled]
    top_p = [params[r].top_p for r in sampled]
    filters = n > 0 and (min(top_k) < vocab or min(top_p) < 1.0)
    shared = [i for i, r in enumerate(sampled) if generators[r] is shared_generator]

    def tensor(values: list[Any]) -> Any:
        return device_tensor(values, device)

    return SamplingPlan(
        rows=len(params),
        sampled=sampled,
        index=None if n == 0 or n == len(params) else tensor(sampled),
        temperature=None if n == 0 or all(t == 1 for t in temps) else tensor(temps)[:, None],
        top_k=tensor(top_k)[:, None] if filters else None,
        top_p=tensor(top_p)[:, None] if filters else None,
        shared=shared,
        shared_index=None if len(shared) in (0, n) else tensor(shared),
        own=[(i, generators[r]) for i, r in enumerate(sampled) if generators[r] is not shared_generator],
        shared_generator=shared_generator,
    )


def device_tensor(values: Sequence[Any], device: Any) -> Any:
    """``torch.tensor(values, device=device)`` (same dtype), without waiting for the device.

    A plain host-to-GPU copy would synchronise the stream: PyTorch's ``copy_`` with
    ``non_blocking=False`` waits for it to finish, and with it every kernel queued before. From pinned
    memory with ``non_blocking=True`` it is queued like a kernel (PyTorch's pinned-memory cache keeps
    the host buffer until the copy has run).
    """
    import torch

    if torch.device(device).type != "cuda":
        return torch.tensor(values, device=device)
    return torch.tensor(values).pin_memory().to(device, non_blocking=True)


def sample(logits: Any, plan: SamplingPlan) -> tuple[Any, Any]:
    """One id per row: argmax for temperature 0, else temperature → top-k → top-p → a draw.

    Args:
        logits: ``(rows, vocab)`` float32 next-token logits (raw).
        plan: the rows' :func:`build_plan`.

    Returns:
        ``(ids, invalid)``: ``(rows,)`` int64 device tensor, and a ``(len(plan.sampled),)`` bool device
        tensor, True where a sampled row's probabilities are not a distribution (nan/inf logits: its
        id is meaningless), or None when no row samples. Nothing is read back to the host.
    """
    import torch

    if not plan.sampled:
        return logits.argmax(dim=-1), None
    x = logits if plan.index is None else logits[plan.index]
    if plan.temperature is not None:
        x = x / plan.temperature
    if plan.top_k is not None:
        vocab = x.shape[-1]
        sorted_x, order = torch.sort(x, dim=-1, descending=True)
        ranks = torch.arange(vocab, device=x.device)[None, :]
        drop = ranks >= plan.top_k
        probs = torch.softmax(sorted_x.masked_fill(drop, float("-inf")), dim=-1)
        # Top-p drops a token when the tokens ranked above it already hold top_p of the mass: the
        # kept set is the smallest prefix reaching top_p (the top token is always kept).
        drop |= (probs.cumsum(-1) - probs) >= plan.top_p
        x = x.scatter(1, order, sorted_x.masked_fill(drop, float("-inf")))
    probs = torch.softmax(x, dim=-1)
    drawn, invalid = _draw(probs, plan)
    if plan.index is None:
        return drawn, invalid
    ids = logits.argmax(dim=-1)
    ids[plan.index] = drawn
    return ids, invalid


def _draw(probs: Any, plan: SamplingPlan) -> tuple[Any, Any]:
    """``torch.multinomial(probs[i], 1, generator)`` of every row, with no device sync (module doc)."""
    import torch

    q = torch.empty_like(probs)
    if plan.shared:
        if plan.shared_index is None:  # the shared rows' one multinomial call drew for all of them
            q.exponential_(generator=plan.shared_generator)
        else:
            q[plan.shared_index] = torch.empty(
                (len(plan.shared), probs.shape[-1]), dtype=probs.dtype, device=probs.device
            ).exponential_(generator=plan.shared_generator)
    for i, generator in plan.own:
        q[i].exponential_(generator=generator)  # a contiguous row: the same draws as a fresh tensor
    total = probs.sum(dim=-1)
    invalid = ~((total > 0) & (total < float("inf")))  # nan anywhere makes the sum nan
    return (probs / q).argmax(dim=-1), invalid


def draw_packed(logits: Any, plan: SamplingPlan) -> tuple[Any, Any]:
    """One id per row of ``logits`` ``(rows, vocab)`` (raw, any float dtype) by ``plan`` (:func:`sample`):
    the ids ``(rows,)`` int64 on the device and the float64 ``[ids | raw logprobs | invalid flags]`` to
    read back (:func:`pack`). (A plan with a Philox part is drawn by :func:`.hf_draw.draw` instead.)"""
    import torch

    logits = logits.float()
    tokens, invalid = sample(logits, plan)
    logprobs = torch.log_softmax(logits, dim=-1).gather(1, tokens[:, None])[:, 0]
    return tokens, pack(tokens, logprobs, invalid)


def to_host(ids: Any, logprobs: Any, invalid: Any) -> tuple[list[int], list[float], list[int]]:
    """The step's ids, logprobs and invalid sampled rows as Python lists, in ONE device-to-host copy.

    Ids go through float64 (exact below 2**53) and float32 logprobs convert to float64 exactly, so the
    values are those of separate ``.tolist()`` calls.
    """
    return packed_to_host(pack(ids, logprobs, invalid), ids.shape[0])


def packed_to_host(packed: Any, n: int) -> tuple[list[int], list[float], list[int]]:
    """:func:`to_host` of a :func:`pack` of ``n`` rows (or of :func:`.hf_draw.draw`'s buffer)."""
    return _unpack(packed.cpu().tolist(), n)


def start_to_host(packed: Any, n: int, sizes: Sequence[int] | None = None) -> Callable[[], Any]:
    """:func:`packed_to_host` in two halves: the copy is queued now (on CUDA into pinned memory, with an
    event after it) and the returned function waits for that event alone and gives the same lists — so
    work queued after this call (the next decode step) does not delay them. With ``sizes``, ``packed`` is
    several steps' packs laid end to end (``sizes``: each one's length) and it gives a triple a step."""
    import torch

    host, event = packed, None
    if host.device.type == "cuda":
        device, host = host, torch.empty(host.shape, dtype=host.dtype, pin_memory=True)
        host.copy_(device, non_blocking=True)
        event = torch.cuda.Event()
        event.record()

    def wait() -> tuple[list[int], list[float], list[int]]:
        if event is not None:
            event.synchronize()
        return _unpack_steps(host.tolist(), n, sizes)

    return wait


def pack(ids: Any, logprobs: Any, invalid: Any) -> Any:
    """ids, logprobs (and the invalid flags) as one float64 device tensor: one copy reads them all."""
    import torch

    parts = [ids.to(torch.float64), logprobs.to(torch.float64)]
    if invalid is not None:
        parts.append(invalid.to(torch.float64))
    return torch.cat(parts)


def _unpack_steps(values: list[float], n: int, sizes: Sequence[int] | None) -> Any:
    if sizes is None:
        return _unpack(values, n)
    out, at = [], 0
    for size in sizes:
        out.append(_unpack(values[at : at + size], n))
        at += size
    return out


def _unpack(values: list[float], n: int) -> tuple[list[int], list[float], list[int]]:
    bad = [i for i, flag in enumerate(values[2 * n :]) if flag]
    return [int(v) for v in values[:n]], values[n : 2 * n], bad
