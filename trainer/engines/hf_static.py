"""Static-slot decoding for the transformers engine: a fixed KV cache, CUDA graphs per shape bucket.

On a GPU a small model's decode step is bound by kernel launches, not arithmetic: SmolLM2-135M's step
is ~30 layers x ~15 kernels, ~35 ms through eager PyTorch on an H200 against a few ms of GPU work.
Replaying a captured CUDA graph launches the whole step at once, but a graph needs fixed shapes and
fixed addresses, which a growing ``DynamicCache`` (:mod:`.hf_batch`) cannot give. So this module keeps
the running rows in *slots* of one preallocated KV cache per layer, ``(slots, kv_heads, max_len,
head_dim)``, and writes each token's keys/values at the column equal to its position:

* a request joins by a prefill (one eager forward of the joiners, right-padded, so each row's real
  tokens sit at columns ``0 .. len-1``) whose keys/values land in the next free slots (written there
  by :meth:`.hf_fused.FusedDecoder.prefill`, or copied from the model's own forward's cache);
* a decode step feeds every running row its last token at position ``pos[r]``, writes its keys/values
  at column ``pos[r]`` (one ``index_put_`` per layer) and attends to columns ``<= pos[r]`` (a boolean
  mask); nothing changes shape, so the step can be captured;
* finished rows leave and the rows after them are moved down to keep slots ``0 .. m-1`` in use (one
  gather over all layers' keys and values, only the columns written), so a step over ``m`` rows runs
  the graph of the smallest bucket ``>= m``.

Graphs are captured lazily, one per (row bucket, column bucket): rows in powers of two up to
``max_rows``, columns in powers of two (>= 64) up to ``max_len``, so attention reads only the columns
in use; :meth:`StaticSlots.precapture` captures the whole grid a workload needs at once. A weight
update copies into the parameters in place, so captured graphs stay valid (no recapture, no
recompilation; the fused step's concatenated weights are refreshed in place when rows join an idle
engine). Modules or weight tensors *replaced* (``load_state_dict(assign=True)``, an
adapter wrapped in) are noticed then too: the graphs are dropped and captured again. Sampling stays
outside the graph (per-row seeds and settings), so the returned ids and raw logprobs mean exactly
what the engine's other path returns.

The step (and the prefill) is :mod:`.hf_fused`'s (the model's weights, fused: ~18 kernels a layer
instead of ~45; 2.04 against 5.19 ms a step at 64 rows on an H200) when the model allows it, else the
model's own layers (``model.model.layers``, its rotary embedding, norm and LM head) with our cache
object and loop. Both restrict the path to decoder-only models whose layers have that shape and plain
full attention (Llama, Qwen2, Qwen3, Mistral without a sliding window; RoPE whose scaling does not
depend on the sequence length) — :func:`supports` checks it; others use the dynamic path. The same
idea — static per-slot KV cache, decode captured per batch-size bucket — is what vLLM's CUDA-graph mode and
nano-vllm do over a paged cache; transformers' ``cache_implementation="static"`` does it for a batch
whose rows all start together (no joining).
"""

from __future__ import annotations

import logging
import threading
from typing import Any

logger = logging.getLogger(__name__)

# Held while any StaticSlots in the process captures a graph (see StaticSlots._graph).
_CAPTURE_LOCK = threading.Lock()

SUPPORTED_MODEL_TYPES = frozenset({"llama", "qwen2", "qwen3", "mistral"})
LENGTH_DEPENDENT_ROPE = frozenset({"dynamic", "longrope"})
MIN_COLUMN_BUCKET = 64


def supports(model: Any) -> tuple[bool, str]:
    """Whether ``model`` can decode through slots; the reason when it cannot."""
    config = model.config
    kind = getattr(config, "model_type", None)
    if kind not in SUPPORTED_MODEL_TYPES:
        return False, f"model_type {kind!r} is not one of {sorted(SUPPORTED_MODEL_TYPES)}"
    if getattr(config, "sliding_window", None) and getattr(config, "use_sliding_window", True):
        return False, "sliding-window attention"
    inner = getattr(model, "model", None)
    for part in ("embed_tokens", "layers", "norm", "rotary_emb"):
        if not hasattr(inner, part):
            return False, f"model.model has no {part}"
    if getattr(config, "_attn_implementation", "sdpa") not in ("sdpa", "eager"):
        return False, f"attention implementation {config._attn_implementation!r}"
    rope = getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None) or {}
    kind = rope.get("rope_type", rope.get("type")) if isinstance(rope, dict) else None
    if kind in LENGTH_DEPENDENT_ROPE:
        # Their frequencies depend on the longest position in the forward pass, so one row's logits
        # would depend on the other rows decoded with it (and differ from a forward pass of its own).
        return False, f"RoPE type {kind!r} (its scaling depends on the sequence length)"
    return True, ""


def _bucket(n: int, cap: int, floor: int = 1) -> int:
    size = floor
    while size < n:
        size *= 2
    return min(size, cap)


def buckets(cap: int, upto: int, floor: int = 1) -> list[int]:
    """Every ``_bucket(n, cap, floor)`` for ``1 <= n <= upto``, ascending: the row or column sizes a
    decode step is captured at (powers of two from ``floor``, the last one cut to ``cap``)."""
    sizes, size = [], floor
    while True:
        sizes.append(min(size, cap))
        if size >= min(upto, cap):
            return sizes
        size *= 2


def capture(graph: Any, pool: Any, stream: Any, fn: Any) -> Any:
    """``fn()`` captured into ``graph`` on ``stream``, its memory from ``pool``, in "thread_local" error
    mode; returns what ``fn`` returned (the graph's output buffers).

    ``torch.cuda.graph`` without what its ``__enter__`` does first: a device-wide synchronize and the
    emptying of the CUDA and pinned-host caching allocators. Each capture of a new bucket mid-training
    (a new row count or column width comes up for many steps) handed the learner's cached blocks back
    to the driver, and its next update allocated them again: 57 ``cudaMalloc`` (5.6 GB) after each
    such step at SmolLM2 on an H100 (``benchmarks/vs_trl_gpu.py``'s probe, ``--torch-graph-capture``).
    The warm-up before the capture has already run on the device (the caller waits for it).

    Raises:
        Whatever ``fn`` or the capture raises; the capture is ended either way.
    """
    import torch

    with torch.cuda.stream(stream):
        graph.capture_begin(pool=pool, capture_error_mode="thread_local")
        try:
            out = fn()
        except BaseException:
            try:
                graph.capture_end()
            except Exception:  # the capture was already broken: fn's error says why
                pass
            raise
        graph.capture_end()
    return out


class _SlotCache:
    """The object handed to each attention layer as ``past_key_values`` (only ``update`` is used)."""

    def __init__(self, keys: list[Any], values: list[Any], rows: Any, pos: Any) -> None:
        self.keys, self.values = keys, values
        self.rows, self.pos = rows, pos  # static buffers: row indices, write columns
        self.n = 0
        self.width = 0

    def update(self, key_states: Any, value_states: Any, layer_idx: int, *args: Any, **kwargs: Any) -> Any:
        n, width = self.n, self.width
        keys, values = self.keys[layer_idx], self.values[layer_idx]
        # key_states: (n, kv_heads, 1, head_dim). Advanced indices on dims 0 and 2 around a slice:
        # the indexed shape is (n, kv_heads, head_dim).
        keys[self.rows[:n], :, self.pos[:n]] = key_states[:, :, 0]
        values[self.rows[:n], :, self.pos[:n]] = value_states[:, :, 0]
        return keys[:n, :, :width], values[:n, :, :width]


class StaticSlots:
    """The running rows of the transformers engine in a preallocated KV cache (see the module doc).

    Row ``r`` of the engine's running batch is slot ``r`` here. Not thread-safe: the engine's worker
    thread owns it.

    Args:
        model: a causal LM for which :func:`supports` is true, on its device, in eval mode.
        max_rows: slots (most rows decoded together).
        max_len: columns per slot, i.e. most tokens a row may hold (prompt + completion).
        use_graphs: capture and replay CUDA graphs (CUDA only); False runs the same step eagerly.
        fused: run the prefill and the decode step through :mod:`.hf_fused` (~18 kernels a layer
            instead of ~45, the same function up to float rounding) when the model is
            :func:`.hf_fused.fusable`; False, or a model it cannot run, uses the model's own layers;
            ``"compiled"``: fused, with the element-wise pieces compiled (:mod:`.hf_elementwise`).
        fp8: the fused step on FP8 weights (:mod:`.hf_fp8`; ``fp8_lm_head``: the LM head too); needs the
            fused step. The caller checks the device has FP8 (the engine does). ``fp8_gemm``: one of
            :data:`.hf_fp8.GEMMS` (default :func:`.hf_fp8.default_gemm`).
        kv_cache_dtype: ``"auto"`` (the model's dtype) or ``"fp8"``: the KV cache in float8_e4m3fn, read
            by the fused step's Triton attention (:mod:`.hf_attention`; half the bytes a step reads there).

    Raises:
        ValueError: the model is not supported (the reason is in the message), ``fp8`` without a
            fused step for it, ``kv_cache_dtype`` ``"fp8"`` without the fused step's Triton attention.
    """

    def __init__(self, model: Any, max_rows: int, max_len: int, *, use_graphs: bool = True,
                 fused: bool | str = True, fp8: bool = False, fp8_lm_head: bool = False,
                 fp8_gemm: str | None = None, kv_cache_dtype: str = "auto") -> None:
        import torch

        ok, why = supports(model)
        if not ok:
            raise ValueError(f"static-slot decoding does not support this model: {why}")
        config = model.config
        self.model = model
        self.device = next(model.parameters()).device
        self.dtype = next(model.parameters()).dtype
        self.max_rows, self.max_len = int(max_rows), int(max_len)
        self.use_graphs = bool(use_graphs) and self.device.type == "cuda"
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        shape = (self.max_rows, config.num_key_value_heads, self.max_len, head_dim)
        layers = len(model.model.layers)
        # Every layer's keys and values are views of ONE tensor (k/v, layer, slot, head, column, dim),
        # so moving rows between slots is one gather and one write for the whole cache, not two per
        # layer; each view has the layout a per-layer tensor would have.
        kv_dtype = torch.float8_e4m3fn if kv_cache_dtype == "fp8" else self.dtype
        self.kv = torch.zeros((2, layers, *shape), dtype=kv_dtype, device=self.device)
        keys = [self.kv[0, i] for i in range(layers)]
        values = [self.kv[1, i] for i in range(layers)]
        long = dict(dtype=torch.long, device=self.device)
        self.tokens = torch.zeros(self.max_rows, **long)  # each row's last sampled id
        self.pos = torch.zeros(self.max_rows, **long)  # its position = the column it is written to
        self.columns = torch.arange(self.max_len, **long)
        self.cache = _SlotCache(keys, values, torch.arange(self.max_rows, **long), self.pos)
        self.rows = 0  # slots 0 .. rows-1 hold running rows
        self._pos_host: list[int] = []  # pos[:rows] mirrored on the host: no device sync to pick a bucket
        self._graphs: dict[tuple[int, int], tuple[Any, Any]] = {}
        self._pool = torch.cuda.graph_pool_handle() if self.use_graphs else None
        self._capture_stream = torch.cuda.Stream(device=self.device) if self.use_graphs else None  # its own
        self.graphs_captured = 0
        self.capture_failures: dict[tuple[int, int], str] = {}
        self._want_fused = bool(fused)
        self._fp8 = {"fp8": bool(fp8), "fp8_lm_head": bool(fp8) and bool(fp8_lm_head),
                     "compile_elementwise": fused == "compiled", "fp8_gemm": fp8_gemm}
        self.fused: Any = None
        self.unfused_reason = ""  # why the step runs through the model's own layers ("" when fused)
        self.rebuilds = 0  # times the model's modules or weight tensors were found replaced
        self._structure = self._model_structure()
        self._build_step()

    def _build_step(self) -> None:
        from chatgym.trainer.engines import hf_fused

        ok, why = hf_fused.fusable(self.model) if self._want_fused else (False, "fused=False")
        if self._fp8["fp8"] and not ok:
            raise ValueError(f"FP8 weights run in the fused decode step, which cannot run here: {why}")
        self.fused = hf_fused.FusedDecoder(self.model, **self._fp8) if ok else None
        if self.kv.element_size() == 1 and (self.fused is None or self.fused.attention != "triton"):
            raise ValueError("kv_cache_dtype 'fp8' is read by the fused step's Triton attention kernel, which "
                             f"this step does not run ({why or 'attention ' + repr(self.fused.attention)})")
        self.unfused_reason = why

    def follow_the_model(self) -> None:
        """With no row decoding: take up weights written in place now (the fused copies refreshed, FP8
        weights re-quantized), so the cost lands in the weight update rather than in the next prefill."""
        if self.rows == 0:
            self._follow_the_model()

    def _model_structure(self) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """The model's modules and the storage of its weights, as identities: a captured graph reads
        those addresses, and the fused step its copies of them."""
        return (tuple(map(id, self.model.modules())), tuple(p.data_ptr() for p in self.model.parameters()))

    def _follow_the_model(self) -> None:
        """Before rows join: weights written in place are seen by the graphs as they are (the fused
        copies are refreshed); modules or weight tensors *replaced* (``load_state_dict(assign=True)``,
        an adapter wrapped in) drop every captured graph and rebuild the fused step."""
        import torch

        structure = self._model_structure()
        if structure != self._structure:
            self._structure = structure
            self._graphs.clear()
            self.capture_failures.clear()
            if self.use_graphs:
                self._pool = torch.cuda.graph_pool_handle()
            self._build_step()
            self.rebuilds += 1
        elif self.fused is not None:
            self.fused.refresh()

    # ---- joining ---------------------------------------------------------------------------------

    def admit(self, prompts: list[list[int]], pad_id: int, embeds: list[Any] | None = None) -> Any:
        """Prefill ``prompts`` into the next free slots; returns their next-token logits ``(j, vocab)``.
        ``embeds``: per prompt its ``(len, hidden)`` input embeddings, fed instead of the ids (a VLM's
        prompt with its images' features, :mod:`.hf_vision`).

        Raises:
            ValueError: no prompts or an empty one, ``embeds`` not one ``(len, hidden)`` tensor a prompt,
                more rows than free slots, or a prompt of ``max_len`` tokens or more.
        """
        import torch

        if self.rows == 0:  # no row is decoding: the model may have changed since the last one
            self._follow_the_model()
        j = len(prompts)
        if j == 0:
            raise ValueError("admit: no prompts")
        empty = [i for i, p in enumerate(prompts) if not p]
        if empty:
            raise ValueError(f"admit: prompt(s) {empty} empty (a prompt has at least one token)")
        if embeds is not None and [e.shape[0] for e in embeds] != [len(p) for p in prompts]:
            raise ValueError(f"admit: embeds give {[e.shape[0] for e in embeds]} rows for prompts of "
                             f"{[len(p) for p in prompts]} tokens (one (len, hidden) tensor a prompt)")
        if self.rows + j > self.max_rows:
            raise ValueError(f"{j} joiners do not fit: {self.rows} of {self.max_rows} slots in use")
        width = max(len(p) for p in prompts)
        if width >= self.max_len:
            raise ValueError(f"a prompt of {width} tokens leaves no room in {self.max_len} columns")
        # Right-padded (real tokens at columns 0 .. len-1), built in a few host ops rather than a few a row:
        # this thread shares the GIL with the collector's.
        lengths = torch.tensor([len(p) for p in prompts])
        mask = torch.arange(width) < lengths[:, None]
        ids = torch.full((j, width), pad_id, dtype=torch.long)
        ids[mask] = torch.tensor([t for p in prompts for t in p], dtype=torch.long)
        # The fused prefill computes the real tokens only: their flat positions in (j, width), row by row.
        real = mask.view(-1).nonzero().squeeze(1)
        if self.device.type == "cuda":  # queued, not waited for (see hf_sampling.device_tensor)
            ids, lengths, real = (t.pin_memory().to(self.device, non_blocking=True) for t in (ids, lengths, real))
        else:
            ids, lengths, real = ids.to(self.device), lengths.to(self.device), real.to(self.device)
        start = self.rows
        padded = None
        if embeds is not None:  # right-padded like the ids; padding rows are zeros
            padded = embeds[0].new_zeros((j, width, embeds[0].shape[-1]))
            for i, e in enumerate(embeds):
                padded[i, : e.shape[0]] = e
        if self.fused is not None:
            logits = self.fused.prefill(ids, lengths, self.cache.keys, self.cache.values, start, padded, real)
            return self._joined(prompts, lengths, start, logits)
        from transformers import DynamicCache

        prefill_cache = DynamicCache(config=self.model.config)
        inputs = {"input_ids": ids} if padded is None else {"inputs_embeds": padded}
        columns = torch.arange(width, device=self.device)
        hidden = self.model.model(
            **inputs,
            attention_mask=(columns < lengths[:, None]).long(),
            position_ids=columns[None, :].expand(j, -1),
            past_key_values=prefill_cache,
            use_cache=True,
        ).last_hidden_state
        last = hidden[torch.arange(j, device=self.device), lengths - 1]
        logits = self.model.lm_head(last)
        for layer, keys, values in zip(prefill_cache.layers, self.cache.keys, self.cache.values, strict=True):
            # Columns past a row's length hold padding keys; the mask never lets a row see them and
            # decoding overwrites them.
            keys[start : start + j, :, :width] = layer.keys
            values[start : start + j, :, :width] = layer.values
        return self._joined(prompts, lengths, start, logits)

    def _joined(self, prompts: list[list[int]], lengths: Any, start: int, logits: Any) -> Any:
        """Book the joiners' slots (their keys/values are written): positions, host mirror, row count."""
        self.pos[start : start + len(prompts)] = lengths
        self._pos_host += [len(p) for p in prompts]
        self.rows += len(prompts)
        return logits

    # ---- decoding --------------------------------------------------------------------------------

    def set_tokens(self, tokens: Any) -> None:
        """The ids just sampled for rows ``0 .. rows-1`` (the next step's inputs)."""
        self.tokens[: self.rows] = tokens

    def decode(self) -> Any:
        """One token for every running row: returns next-token logits ``(rows, vocab)``.

        The returned tensor may be a graph's output buffer: read it before the next call.
        """
        import torch

        m = self.rows
        if m == 0:
            raise ValueError("decode with no running rows")
        top = max(self._pos_host)
        if top >= self.max_len:
            raise ValueError(f"a row reached {self.max_len} columns")
        n = _bucket(m, self.max_rows)
        width = _bucket(top + 1, self.max_len, MIN_COLUMN_BUCKET)
        captured = self._graph(n, width) if self.use_graphs else None
        if captured is not None:
            graph, out = captured
            graph.replay()
            logits = out[:m]
        else:
            with torch.inference_mode():
                logits = self._forward(n, width)[:m]
        self.pos[:m] += 1
        self._pos_host = [p + 1 for p in self._pos_host]
        return logits

    def select(self, keep: list[int]) -> None:
        """Keep rows ``keep`` (ascending, the engine's order) as rows ``0 .. len(keep)-1``; free the
        other slots.

        Only rows whose slot changes are moved, and only the columns they have written (a row at
        position ``p`` has keys/values in columns ``0 .. p-1``; the rest of its new slot is masked
        until it writes there), in one gather over every layer's keys and values.
        """
        import torch

        from chatgym.trainer.engines.hf_sampling import device_tensor

        m = len(keep)
        moved = [(d, s) for d, s in enumerate(keep) if d != s]
        if moved:
            dst = device_tensor([d for d, _ in moved], self.device)
            src = device_tensor([s for _, s in moved], self.device)
            top = max(self._pos_host[s] for _, s in moved)
            kv = self.kv.view(torch.uint8) if self.kv.element_size() == 1 else self.kv  # e4m3: moved as bytes
            kv[:, :, dst, :, :top] = kv[:, :, src, :, :top]
            self.tokens[dst] = self.tokens[src]
            self.pos[dst] = self.pos[src]
        self._pos_host = [self._pos_host[r] for r in keep]
        # Freed slots still run inside a bucket's graph: position 0 keeps their writes in bounds.
        self.pos[m : self.rows] = 0
        self.rows = m

    def clear(self) -> None:
        self.select([])

    def room(self) -> int:
        """How many more :meth:`decode` calls fit before a running row reaches ``max_len`` columns."""
        return self.max_len - max(self._pos_host, default=0)

    def row_bucket(self, m: int) -> int:
        """The row count of the captured step that runs ``m`` rows."""
        return _bucket(m, self.max_rows)

    def retire(self, slots: list[int]) -> None:
        """Rows ``slots`` finished but keep their slots until the next :meth:`select`: their position
        goes back to 0, so the steps they still ride along in write inside their own slot and never
        widen the column bucket (a live row is always further along: it started at its prompt length)."""
        for r in slots:
            self.pos[r] = 0  # one fill each: an index tensor would cost a host-to-device copy
            self._pos_host[r] = 0

    def precapture(self, longest: int) -> int:
        """Capture now every step a decode of up to ``max_rows`` rows holding up to ``longest`` tokens
        (prompt + completion) will run: each row bucket by each column bucket up to ``longest``'s, as
        vLLM captures its batch sizes at start-up. Captured lazily, a new bucket is met mid-run for most
        of a training run (SmolLM2 at 8 x 8 on an H100: 7-8 graphs after the first step, 17-19 by the
        30th) and each capture stalls that rollout; here they all land in the first. Graphs already
        captured, or whose capture failed, are skipped; no-op without graphs. Safe with rows running:
        a step writes only the keys/values of the column each row decodes next, which that row's real
        step writes again before reading it. Returns the number of graphs captured.
        """
        if not self.use_graphs:
            return 0
        before = self.graphs_captured
        for n, width in self.capture_plan(longest):
            self._graph(n, width)
        return self.graphs_captured - before

    def capture_plan(self, longest: int) -> list[tuple[int, int]]:
        """Every ``(rows, columns)`` step :meth:`decode` runs while rows hold at most ``longest`` tokens."""
        widths = buckets(self.max_len, min(longest, self.max_len), MIN_COLUMN_BUCKET)
        return [(n, width) for width in widths for n in buckets(self.max_rows, self.max_rows)]

    # ---- the step ----------------------------------------------------------------------------------

    def _forward(self, n: int, width: int) -> Any:
        if self.fused is not None:
            return self.fused.step(self.tokens[:n], self.pos[:n], self.cache.keys, self.cache.values,
                                   self.cache.rows[:n], width, self.columns)
        inner = self.model.model
        positions = self.pos[:n, None]
        hidden = inner.embed_tokens(self.tokens[:n, None])
        position_embeddings = inner.rotary_emb(hidden, positions)
        mask = (self.columns[None, :width] <= positions)[:, None, None, :]
        self.cache.n, self.cache.width = n, width
        for layer in inner.layers:
            hidden = layer(
                hidden,
                attention_mask=mask,
                position_ids=positions,
                past_key_values=self.cache,
                position_embeddings=position_embeddings,
            )
        return self.model.lm_head(inner.norm(hidden)[:, -1])

    def _graph(self, n: int, width: int) -> tuple[Any, Any] | None:
        """The bucket's captured graph and its output buffer, captured on first use; None when its
        capture failed (that bucket then runs eagerly, and the failure is logged once)."""
        found = self._graphs.get((n, width))
        if found is not None or (n, width) in self.capture_failures:
            return found
        # One capture at a time in the process, each engine on its own capture stream: by default
        # torch.cuda.graph captures every graph on one class-level stream, and a capture registers the
        # default CUDA generator's state. Two engines in one process (a policy and a co-trained judge)
        # capturing from their threads at once met on that stream and that generator: "operation not
        # permitted when stream is capturing", "Cannot register the state during capturing stage" (H200).
        with _CAPTURE_LOCK:
            return self._capture(n, width)

    def _capture(self, n: int, width: int) -> tuple[Any, Any] | None:
        import torch

        # Warm-up on a side stream, as torch.cuda.graphs asks; it writes the same keys/values that the
        # replay right after writes (same tokens, same positions), so running it changes nothing.
        stream = torch.cuda.Stream(device=self.device)
        stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.inference_mode(), torch.cuda.stream(stream):
            self._forward(n, width)
        torch.cuda.current_stream(self.device).wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        # "thread_local": the collector's and the learner's threads may call CUDA (a sync, a pinned
        # host allocation) while this thread captures; in the default "global" mode any such call
        # invalidates the capture ("operation failed due to a previous error during capture").
        try:
            with torch.inference_mode():
                out = capture(graph, self._pool, self._capture_stream, lambda: self._forward(n, width))
        except Exception as exc:
            # A failed capture leaves its memory pool recording, and every later capture into it fails
            # ("beginAllocateToPool: already recording to mempool_id"): later graphs get a fresh pool.
            self._pool = torch.cuda.graph_pool_handle()
            self.capture_failures[(n, width)] = f"{type(exc).__name__}: {exc}"
            logger.warning("StaticSlots: capturing the (%d rows, %d columns) step failed, it runs eagerly: %s",
                           n, width, self.capture_failures[(n, width)])
            return None
        self._graphs[(n, width)] = (graph, out)
        self.graphs_captured += 1
        return graph, out
