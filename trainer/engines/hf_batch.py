"""The running decode batch of the transformers engine: left-padded rows over one ``DynamicCache``.

Continuous batching on plain transformers: requests that arrive while others decode are prefilled
on their own (left-padded among themselves), then joined to the running batch by left-padding the
shorter of the two KV caches to the other's width and concatenating along the batch axis. Rows that
finish leave with ``DynamicCache.batch_select_indices``; cache columns that no remaining row attends
to (all padding) are trimmed from the left. Every row carries its own position ids, so padding only
changes float rounding, never which positions a token sees. (The scheme is Orca's iteration-level
scheduling, Yu et al., OSDI 2022, over a padded cache instead of vLLM's paged one.)

Only plain full-attention layers (``DynamicLayer``) can be joined this way; :func:`can_join` says
whether a cache qualifies (sliding-window or indexed layers keep extra state that padding would
break), and the engine falls back to admitting requests only when the batch is empty otherwise.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass
class Batch:
    """Tensors of the running rows (row ``r`` everywhere is the same request).

    Attributes:
        cache: ``DynamicCache``, every layer's keys/values shaped ``(rows, kv_heads, width, head_dim)``.
        attention: ``(rows, width)`` int64, 1 where the cache column is a real token of that row.
        tokens: ``(rows,)`` int64, the last sampled id of each row (the next decode step's input).
        next_pos: ``(rows,)`` int64, the position id of ``tokens`` (= tokens the row holds so far).
    """

    cache: Any
    attention: Any
    tokens: Any
    next_pos: Any

    @property
    def rows(self) -> int:
        return int(self.attention.shape[0])


def prefill(model: Any, prompts: list[list[int]], pad_id: int, embeds: list[Any] | None = None) -> tuple[Batch, Any]:
    """One forward pass over left-padded prompts.

    ``embeds`` (optional): per prompt its ``(len, hidden)`` input embeddings (a VLM's prompt with its
    images' features, :mod:`.hf_vision`), fed instead of the ids; padding columns get zeros (masked).

    Returns the new rows' :class:`Batch` (``tokens`` still unset: zeros until the caller samples)
    and the next-token logits, ``(len(prompts), vocab)`` in the model's dtype.
    """
    import torch
    from transformers import DynamicCache

    device = next(model.parameters()).device
    n, width = len(prompts), max(len(p) for p in prompts)
    input_ids = torch.full((n, width), pad_id, dtype=torch.long)
    attention = torch.zeros((n, width), dtype=torch.long)
    for i, p in enumerate(prompts):
        input_ids[i, width - len(p) :] = torch.tensor(p)
        attention[i, width - len(p) :] = 1
    input_ids, attention = input_ids.to(device), attention.to(device)
    positions = (attention.cumsum(-1) - 1).clamp(min=0)
    cache = DynamicCache(config=model.config)
    inputs = {"input_ids": input_ids}
    if embeds is not None:
        padded = embeds[0].new_zeros((n, width, embeds[0].shape[-1]))
        for i, e in enumerate(embeds):
            padded[i, width - e.shape[0] :] = e
        inputs = {"inputs_embeds": padded}
    logits = model(
        **inputs,
        attention_mask=attention,
        position_ids=positions,
        past_key_values=cache,
        use_cache=True,
        logits_to_keep=1,
    ).logits[:, -1, :]
    lengths = torch.tensor([len(p) for p in prompts], device=device)
    return Batch(cache, attention, torch.zeros_like(lengths), lengths), logits


def decode(model: Any, batch: Batch) -> Any:
    """One decode step: feeds ``batch.tokens``, extends the cache by one column, advances positions.

    Returns next-token logits ``(rows, vocab)``.
    """
    batch.attention = _with_new_column(batch.attention)
    logits = model(
        input_ids=batch.tokens[:, None],
        attention_mask=batch.attention,
        position_ids=batch.next_pos[:, None],
        past_key_values=batch.cache,
        use_cache=True,
    ).logits[:, -1, :]
    batch.next_pos = batch.next_pos + 1
    return logits


def _with_new_column(attention: Any) -> Any:
    import torch

    return torch.cat([attention, attention.new_ones((attention.shape[0], 1))], dim=1)


def can_join(cache: Any) -> bool:
    """True when every layer of ``cache`` is a plain ``DynamicLayer`` (see the module docstring)."""
    from transformers.cache_utils import DynamicLayer

    layers = getattr(cache, "layers", None)
    return bool(layers) and all(type(layer) is DynamicLayer for layer in layers)


def _pad_left(batch: Batch, columns: int) -> None:
    import torch.nn.functional as F

    if columns <= 0:
        return
    for layer in batch.cache.layers:
        layer.keys = F.pad(layer.keys, (0, 0, columns, 0))
        layer.values = F.pad(layer.values, (0, 0, columns, 0))
    batch.attention = F.pad(batch.attention, (columns, 0))


def join(a: Batch, b: Batch) -> Batch:
    """Rows of ``a`` then rows of ``b`` in one batch (both caches must pass :func:`can_join`).

    The narrower cache is left-padded (masked columns) to the wider one's width; ``a`` and ``b`` are
    consumed.
    """
    import torch

    width = max(a.attention.shape[1], b.attention.shape[1])
    _pad_left(a, width - a.attention.shape[1])
    _pad_left(b, width - b.attention.shape[1])
    for la, lb in zip(a.cache.layers, b.cache.layers, strict=True):
        la.keys = torch.cat([la.keys, lb.keys], dim=0)
        la.values = torch.cat([la.values, lb.values], dim=0)
    return Batch(
        a.cache,
        torch.cat([a.attention, b.attention]),
        torch.cat([a.tokens, b.tokens]),
        torch.cat([a.next_pos, b.next_pos]),
    )


def select(batch: Batch, keep: list[int]) -> None:
    """Keep only rows ``keep`` (in that order), then trim the all-padding columns on the left."""
    import torch

    index = torch.tensor(keep, device=batch.attention.device)
    batch.cache.batch_select_indices(index)
    batch.attention = batch.attention[index]
    batch.tokens = batch.tokens[index]
    batch.next_pos = batch.next_pos[index]
    # Each row's tokens are the rightmost ``next_pos`` columns (prefill and join right-align rows and
    # decoding appends to all of them), so columns left of the longest remaining row are padding
    # for every row.
    unused = batch.attention.shape[1] - int(batch.next_pos.max())
    if unused > 0 and can_join(batch.cache):
        for layer in batch.cache.layers:
            layer.keys = layer.keys[:, :, unused:]
            layer.values = layer.values[:, :, unused:]
        batch.attention = batch.attention[:, unused:]
