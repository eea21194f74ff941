"""The static path's forward passes with few kernels: Llama-family layers on fused weights.

A replayed CUDA graph costs about the sum of its kernels, and at decode a small model's kernels are
tiny, so their NUMBER sets the step time. SmolLM2-135M's decode step through the model's own layers
launches 1,371 kernels (~45 a layer: RMSNorm alone is seven — upcast, square, mean, add, rsqrt,
multiply, downcast; RoPE about ten; grouped-query attention copies the keys and values to every query
head) and replays in 5.19 ms at 64 rows on an H200 (3.50 ms at 8 rows: launch-bound), where
``torch.compile`` of the whole step replayed in 3.0 ms after 140 s of compilation
(``benchmarks/results/vs_trl_h200_curve_subprocess/``). This module computes the same function in 558 kernels (~18 a
layer), with no compiler: 2.04 ms at 64 rows, 1.77 ms at 8 (``benchmarks/decode_step_gpu.py``,
``benchmarks/results/vs_trl_h200_fused_step/``):

* one matmul for q, k and v and one for gate and up, on concatenated copies of those weights (the
  layout vLLM's ``QKVParallelLinear`` / ``MergedColumnParallelLinear`` keep);
* the residual adds folded into the output and down projections (``addmm_`` into the residual in place:
  no copy of it first);
* ``torch.nn.functional.rms_norm`` (one fused kernel on CUDA; Inductor's with compiled pieces);
* RoPE on q and k together, as ``x * cos + roll(x) * sin'`` where ``sin'`` is ``sin`` with its first
  half negated: ``roll(x, d/2)`` is ``cat(x2, x1)``, so ``roll(x) * sin'`` is ``rotate_half(x) * sin``
  exactly;
* at decode, attention with each key/value head's query heads as its queries (``(rows, kv_heads,
  group, d)`` against the cache's ``(rows, kv_heads, columns, d)``): grouped-query attention without
  repeating the cache, in one ``scaled_dot_product_attention`` call, and the mask built once per step;
  with compiled pieces on CUDA, one Triton kernel a layer that also writes the step's keys and values
  and reads each row's columns only up to its position (:mod:`.hf_attention`), and that takes the q/k/v
  product as the GEMM left it: it applies the FP8 GEMM's scales, the bias and RoPE itself
  (:func:`.hf_attention.decode_qkv`; not for Qwen3, whose q/k norms come between).

The prompts' prefill (:meth:`FusedDecoder.prefill`, eager: prompts have every length) runs the same
layers over the prompts' real tokens, packed (padding only inside attention), and writes keys/values
straight into the slots: the model's own forward spent ~45 launches a layer there too, from Python, plus
transformers' mask building, over every padded token.

The result equals the model's own layers up to float rounding (fused kernels round once where the
layers round twice): in fp32 the logits match full forward passes within 2e-5 on CPU
(``tests/test_engines_hf_fused.py``) and 1e-4 on the H200 with SmolLM2's real weights; in bf16 both
this step and the model's layers are up to ~1 logit from fp32 there. The concatenated weights are
copies: they are refreshed when a source weight changed (its version counter or storage), which
:meth:`FusedDecoder.refresh` checks when rows join — ``update_weights`` copies in place while no row
decodes, so every row's tokens come from one set of weights. Memory: one more copy of the q/k/v and
gate/up weights (SmolLM2-135M in bf16: 133 MiB).

With ``fp8=True`` the four projections of each layer (q/k/v, o, gate/up, down; and the LM head with
``fp8_lm_head``) are held as :class:`.hf_fp8.Fp8Linear` (e4m3 weights, per-output-channel scales,
per-row activation scales, ``torch._scaled_mm``) instead: the residual adds are then separate adds
after the matmul (``_scaled_mm`` takes a 1-D bias only), the q/k/v bias an add as well, and no bf16
copies are kept. :meth:`FusedDecoder.refresh` re-quantizes into the same buffers (scales recomputed),
so captured graphs stay valid across weight updates.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

FUSED_MODEL_TYPES = frozenset({"llama", "qwen2", "qwen3", "mistral"})


def fusable(model: Any) -> tuple[bool, str]:
    """Whether :class:`FusedDecoder` computes ``model``'s decode step; the reason when it cannot.

    Needs the plain Llama layer: linear projections (bias only on q/k/v), SiLU-gated MLP without bias,
    RMSNorm, per-head q/k norms only as Qwen3 has them, no tensor-parallel slicing (``pretraining_tp``).
    A model wrapped by adapters (LoRA layers instead of ``nn.Linear``) is refused.
    """
    import torch

    config = model.config
    kind = getattr(config, "model_type", None)
    if kind not in FUSED_MODEL_TYPES:
        return False, f"model_type {kind!r}"
    if getattr(config, "hidden_act", "silu") != "silu":
        return False, f"hidden_act {config.hidden_act!r}"
    if getattr(config, "pretraining_tp", 1) not in (None, 1):
        return False, "pretraining_tp > 1"
    if getattr(config, "sliding_window", None) and getattr(config, "use_sliding_window", True):
        return False, "sliding-window attention"
    linear = torch.nn.Linear
    for i, layer in enumerate(model.model.layers):
        attn, mlp = layer.self_attn, layer.mlp
        parts = [getattr(attn, n, None) for n in ("q_proj", "k_proj", "v_proj", "o_proj")]
        parts += [getattr(mlp, n, None) for n in ("gate_proj", "up_proj", "down_proj")]
        if any(type(p) is not linear for p in parts):
            return False, f"layer {i}: a projection is not a plain torch.nn.Linear"
        if any(p.bias is not None for p in parts[3:]):
            return False, f"layer {i}: bias on o_proj or the MLP"
        if (parts[0].bias is None) != (parts[1].bias is None) or (parts[0].bias is None) != (parts[2].bias is None):
            return False, f"layer {i}: bias on some of q/k/v only"
        norms = [getattr(attn, n, None) for n in ("q_norm", "k_norm")]
        if any((m is None) != (kind != "qwen3") for m in norms):
            return False, f"layer {i}: q/k norms do not match model_type {kind!r}"
        for norm in (layer.input_layernorm, layer.post_attention_layernorm):
            if not hasattr(norm, "variance_epsilon") or getattr(norm, "weight", None) is None:
                return False, f"layer {i}: a norm that is not RMSNorm"
    final = getattr(model.model, "norm", None)
    if not hasattr(final, "variance_epsilon") or getattr(final, "weight", None) is None:
        return False, "the final norm is not RMSNorm"
    return True, ""


@dataclass
class _Layer:
    qkv: Any  # (q + 2 kv) x hidden, a copy
    qkv_bias: Any
    gate_up: Any  # 2 intermediate x hidden, a copy
    o: Any  # the model's own modules from here on (read at every step, never stale)
    down: Any
    norm_in: Any
    norm_post: Any
    q_norm: Any
    k_norm: Any
    scaling: float
    fp8: Any = None  # (qkv, o, gate_up, down) hf_fp8.Fp8Linear with fp8=True, else None


class FusedDecoder:
    """The decode step and the prefill of a :func:`fusable` model over the static slots' KV cache
    (module doc).

    Args:
        model: the causal LM (its modules are read, never changed).
        fp8: hold the projections as FP8 weights (module doc; :mod:`.hf_fp8`). The caller checks the
            device has FP8 (:func:`chatgym.trainer.models.cuda.fp8_unsupported`); this class does not,
            so the CPU tests can run it.
        fp8_lm_head: with ``fp8``, the LM head too (its logits then carry the FP8 error as well).
        compile_elementwise: the element-wise pieces between the matmuls (RoPE, the gated MLP's
            activation, FP8 activation quantization with the norm before it) through ``torch.compile``
            (:mod:`.hf_elementwise`: fewer kernels a step; compiled on the first call); on CUDA with
            ``fp8`` the MLP's quantization is :mod:`.hf_silu_quant`'s Triton kernels instead, and
            the other quantizations (with their residual add and norm) :mod:`.hf_norm_quant`'s kernel.
        fp8_gemm: with ``fp8``, how the projections multiply (:data:`.hf_fp8.GEMMS`; default
            :func:`.hf_fp8.default_gemm`: ``"unit"`` with compiled pieces, but ``"rowwise"`` for a float16
            model, and ``"rowwise"`` without them; an unscaled GEMM with FP8 weights in float16 is refused,
            :func:`.hf_fp8.check_gemm_dtype`).
        attention: the decode step's attention (:data:`.hf_attention.ATTENTIONS`; default
            :func:`.hf_attention.default_attention`: the Triton kernel with compiled pieces on CUDA).
            ``"triton"`` is taken on any device (the CPU tests run it in Triton's interpreter).

    Raises:
        ValueError: the model is not :func:`fusable` (the reason is in the message), with ``fp8`` a
            projection whose sizes ``torch._scaled_mm`` cannot take on this device, or an unscaled
            ``fp8_gemm`` with a float16 model (:func:`.hf_fp8.check_gemm_dtype`), ``"triton"``
            attention for a head size the kernel does not take (:func:`.hf_attention.supports`).
    """

    def __init__(self, model: Any, *, fp8: bool = False, fp8_lm_head: bool = False,
                 compile_elementwise: bool = False, fp8_gemm: str | None = None,
                 attention: str | None = None) -> None:
        from chatgym.trainer.engines import hf_attention, hf_elementwise, hf_fp8, hf_norm_quant, hf_silu_quant

        ok, why = fusable(model)
        if not ok:
            raise ValueError(f"fused decode step: {why}")
        config, inner = model.config, model.model
        self.model = model
        self.heads = int(config.num_attention_heads)
        self.kv_heads = int(config.num_key_value_heads)
        self.head_dim = int(getattr(config, "head_dim", None) or config.hidden_size // self.heads)
        # Without FP8 weights CHATGYM_FP8_GEMM is read but unused: a float16 model with 'unit' set is no error then.
        dtype = next(model.parameters()).dtype if fp8 else None
        self.fp8, self.fp8_gemm = bool(fp8), fp8_gemm or hf_fp8.default_gemm(compile_elementwise, dtype)
        hf_fp8.check_gemm_dtype(self.fp8_gemm, dtype)
        self.ops = hf_elementwise.compiled() if compile_elementwise else hf_elementwise.EAGER
        cuda = next(model.parameters()).device.type == "cuda"
        if compile_elementwise and cuda and self.fp8:  # Inductor's one program a row left most of the GPU idle
            self.ops = dataclasses.replace(self.ops, silu_mul_quant=hf_silu_quant.silu_mul_quant)
            if hf_norm_quant.fits(int(config.hidden_size)) and hf_norm_quant.fits(self.heads * self.head_dim):
                self.ops = dataclasses.replace(self.ops, norm_quant=hf_norm_quant.norm_quant, quant=hf_norm_quant.quant,
                                               add_norm_quant=hf_norm_quant.add_norm_quant)
        # The prefill runs eagerly: a compiled RMSNorm there is one kernel as aten's is, plus a guard check
        # and a launch from Python on the host, 61 times a prefill at SmolLM2's depth.
        self._prefill_ops = dataclasses.replace(self.ops, norm=hf_elementwise.EAGER.norm)
        self.attention = attention or hf_attention.default_attention(compile_elementwise, cuda, self.head_dim)
        if self.attention not in hf_attention.ATTENTIONS:
            raise ValueError(f"attention must be one of {hf_attention.ATTENTIONS}, got {self.attention!r}")
        if self.attention == "triton" and not hf_attention.supports(self.head_dim):
            raise ValueError(f"attention 'triton': head size {self.head_dim} is not a power of two >= 16")
        self.layers: list[_Layer] = []
        # (write the copy from its sources, the tensors it joins): bf16 concatenations or FP8 weights.
        self._copies: list[tuple[Callable[[list[Any]], None], list[Any]]] = []
        for layer in inner.layers:
            attn, mlp = layer.self_attn, layer.mlp
            qkv_src = [attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight]
            gate_up_src = [mlp.gate_proj.weight, mlp.up_proj.weight]
            bias = None
            if attn.q_proj.bias is not None:
                bias = self._copy([attn.q_proj.bias, attn.k_proj.bias, attn.v_proj.bias])
            qkv = gate_up = fp8_parts = None
            if self.fp8:
                fp8_parts = tuple(
                    self._fp8(srcs) for srcs in (qkv_src, [attn.o_proj.weight], gate_up_src, [mlp.down_proj.weight])
                )
            else:
                qkv, gate_up = self._copy(qkv_src), self._copy(gate_up_src)
            self.layers.append(_Layer(
                qkv, bias, gate_up, attn.o_proj, mlp.down_proj, layer.input_layernorm,
                layer.post_attention_layernorm, getattr(attn, "q_norm", None), getattr(attn, "k_norm", None),
                float(getattr(attn, "scaling", self.head_dim**-0.5)), fp8_parts,
            ))
        # The head's GEMM applies its scales itself (row-wise): a unit product would need a pass of its own
        # over the (rows, vocab) logits.
        self.lm_head_fp8 = self._fp8([model.lm_head.weight], "rowwise") if self.fp8 and fp8_lm_head else None
        self._seen = self._stamps()
        self.refreshes = 0

    def _copy(self, sources: list[Any]) -> Any:
        """A concatenated copy of ``sources``, registered for :meth:`refresh`."""
        import torch

        copy = torch.cat([w.detach() for w in sources])
        self._copies.append((lambda srcs, out=copy: torch.cat([w.detach() for w in srcs], out=out), sources))
        return copy

    def _fp8(self, sources: list[Any], gemm: str | None = None) -> Any:
        """An :class:`~.hf_fp8.Fp8Linear` of ``sources`` (``gemm``, default the step's), registered for
        :meth:`refresh`."""
        from chatgym.trainer.engines import hf_fp8

        for w in sources:
            if not hf_fp8.fp8_shape_ok(w):
                raise ValueError(f"fp8: a weight of shape {tuple(w.shape)} is not a multiple of 16 (torch._scaled_mm)")
        linear = hf_fp8.Fp8Linear(sources, gemm or self.fp8_gemm)
        self._copies.append((linear.requantize, sources))
        return linear

    def _stamps(self) -> list[tuple[int | None, int]]:
        return [(_version(w), w.data_ptr()) for _, sources in self._copies for w in sources]

    def refresh(self) -> bool:
        """Copy the sources of every concatenated weight in place if any may have changed since the
        last copy (captured graphs keep reading the same buffers); returns whether it copied.

        A change is seen by the source tensors' version counters, which every in-place write bumps.
        Inference tensors have none (and may be written in place inside ``torch.inference_mode``):
        with such sources it copies every time (SmolLM2-135M: 133 MiB). Parameters *replaced* by
        other tensors, or modules replaced, are :class:`~.hf_static.StaticSlots`' to notice: it builds
        a new decoder then.
        """
        import torch

        stamps = self._stamps()
        if stamps == self._seen and all(v is not None for v, _ in stamps):
            return False
        with torch.no_grad():
            for write, sources in self._copies:
                write(sources)
        self._seen = stamps
        self.refreshes += 1
        return True

    def step(self, tokens: Any, positions: Any, keys: list[Any], values: list[Any], rows: Any, width: int,
             columns: Any) -> Any:
        """Next-token logits ``(n, vocab)`` of ``n`` rows, writing each row's key/value at its position.

        Args:
            tokens: ``(n,)`` int64, each row's last id; positions: ``(n,)`` int64, its position (the cache
                column written).
            keys, values: per layer, ``(slots, kv_heads, max_len, head_dim)`` caches.
            rows: ``(n,)`` int64 slot of each row (``arange(n)``).
            width: columns attended (a bucket ``> max(positions)``); columns: ``(>= width,)`` int64 arange.
        """
        import torch
        import torch.nn.functional as F

        from chatgym.trainer.engines import hf_attention

        n, heads, kv_heads, d = tokens.shape[0], self.heads, self.kv_heads, self.head_dim
        hidden, cos, sin = self._embed(tokens, positions[:, None])  # (n, hidden), (n, 1, d)
        kernel = self.attention == "triton"  # writes the cache and attends in one kernel
        if not kernel:
            mask = torch.zeros((n, 1, 1, width), dtype=hidden.dtype, device=hidden.device)
            mask.masked_fill_((columns[:width] > positions[:, None])[:, None, None, :], float("-inf"))
        pending = None  # FP8: the last down projection's output, added to the residual in the next norm's kernel
        for layer, k_cache, v_cache in zip(self.layers, keys, values, strict=True):
            if kernel and layer.q_norm is None:  # the kernel scales, adds the bias and ropes q and k too
                hidden, qkv, a, s, bias = self._project_qkv(layer, hidden, self.ops, pending)
                attended = hf_attention.decode_qkv(qkv, heads, k_cache, v_cache, positions, layer.scaling, cos, sin,
                                                   a, s, bias)
                hidden, pending = self._after_attention(layer, hidden, attended.reshape(n, heads * d))
                continue
            hidden, qk, v = self._qkv(layer, hidden, cos, sin, pending=pending)  # qk (n, heads + kv_heads, d), v (n, kv_heads, d)
            if kernel:
                attended = hf_attention.decode(qk[:, :heads], qk[:, heads:], v, k_cache, v_cache, positions,
                                               layer.scaling)
            else:
                k_cache[rows, :, positions] = qk[:, heads:]
                v_cache[rows, :, positions] = v
                attended = F.scaled_dot_product_attention(
                    qk[:, :heads].view(n, kv_heads, heads // kv_heads, d), k_cache[:n, :, :width],
                    v_cache[:n, :, :width], attn_mask=mask, scale=layer.scaling,
                )  # (n, kv_heads, group, d): query head kv * group + g, the model's own head order
            hidden, pending = self._after_attention(layer, hidden, attended.reshape(n, heads * d))
        return self._logits(hidden, pending=pending)

    def prefill(self, ids: Any, lengths: Any, keys: list[Any], values: list[Any], start: int,
                embeds: Any = None, real: Any = None) -> Any:
        """The prompts' forward pass: next-token logits ``(j, vocab)`` at each prompt's last token, with
        every layer's keys/values written to slots ``start .. start + j - 1``, columns ``0 .. width - 1``.

        Args:
            ids: ``(j, width)`` int64 prompts, right-padded (real tokens at columns ``0 .. len - 1``).
            lengths: ``(j,)`` int64 prompt lengths (on the device).
            keys, values: per layer, ``(slots, kv_heads, max_len, head_dim)`` caches.
            start: first slot written.
            embeds: ``(j, width, hidden)`` input embeddings to feed instead of ``ids``' (a VLM's
                prompts with their images' features); None: the ids' embeddings.
            real: ``(t,)`` int64, the flat indices into ``(j, width)`` of the real tokens, row by row
                (``nonzero`` of the attention mask); None: computed here from ``lengths``.

        The projections, norms and MLPs run on the ``t`` real tokens only, packed (prompts of 40-120
        tokens padded to 120 would spend a third of the prefill's matmuls on padding); attention alone
        runs padded, each layer's q/k/v scattered into ``(j, width)`` with zeros at the padding.
        Causal attention keeps the padding apart: a real token at column ``i < len`` sees columns
        ``<= i``, all real; the padding's keys and outputs are never read (the decode step stops at
        each row's position, and decoding overwrites those columns).
        """
        import torch
        import torch.nn.functional as F

        from chatgym.trainer.engines import hf_attention

        j, width = ids.shape
        heads, kv_heads, d = self.heads, self.kv_heads, self.head_dim
        if real is None:
            columns = torch.arange(width, device=ids.device)
            real = (columns[None, :] < lengths[:, None]).view(-1).nonzero().squeeze(1)
        t, ends = real.shape[0], lengths.cumsum(0) - 1  # ends: each prompt's last token among the t
        flat = ids.view(-1)[real]
        packed = None if embeds is None else embeds.reshape(j * width, -1)[real][None]
        hidden, cos, sin = self._embed(flat[None], (real % width)[None], packed)  # (1, t, hidden), (1, t, d)
        hidden, cos, sin = hidden.view(t, -1), cos.reshape(t, 1, d), sin.reshape(t, 1, d)
        group, ops, pending = heads // kv_heads, self._prefill_ops, None
        for layer, k_cache, v_cache in zip(self.layers, keys, values, strict=True):
            hidden, qk, v = self._qkv(layer, hidden, cos, sin, ops, pending)  # (t, heads + kv_heads, d), (t, kv_heads, d)
            grid = qk.new_zeros((j * width, heads + 2 * kv_heads, d))
            grid[real] = torch.cat((qk, v), dim=1)
            grid = grid.view(j, width, heads + 2 * kv_heads, d).transpose(1, 2)  # (j, all heads, width, d)
            q, k, v = grid.split((heads, kv_heads, kv_heads), dim=1)
            if k_cache.dtype == torch.float8_e4m3fn:  # saturated, as the decode kernel writes (hf_attention)
                k_cache[start : start + j, :, :width] = k.clamp(-hf_attention.FP8_MAX, hf_attention.FP8_MAX)
                v_cache[start : start + j, :, :width] = v.clamp(-hf_attention.FP8_MAX, hf_attention.FP8_MAX)
            else:
                k_cache[start : start + j, :, :width] = k
                v_cache[start : start + j, :, :width] = v
            attended = F.scaled_dot_product_attention(  # query head h reads key/value head h // group
                q, k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1), is_causal=True,
                scale=layer.scaling,
            )  # (j, heads, width, d)
            attended = attended.transpose(1, 2).reshape(j * width, heads * d)[real]
            hidden, pending = self._after_attention(layer, hidden, attended, ops)
        if pending is not None:
            hidden = ops.add(hidden, *pending)
        return self._logits(hidden[ends], ops)

    # ---- the pieces both passes share (rows are tokens: (t, hidden)) -------------------------------

    def _embed(self, ids: Any, positions: Any, embeds: Any = None) -> tuple[Any, Any, Any]:
        """Embeddings of ``ids`` (or ``embeds`` as given) and RoPE's ``cos`` / signed ``sin`` at
        ``positions`` (``(..., d)``)."""
        import torch

        inner = self.model.model
        hidden = inner.embed_tokens(ids) if embeds is None else embeds.to(inner.embed_tokens.weight.dtype)
        cos, sin = inner.rotary_emb(hidden, positions)
        half = self.head_dim // 2
        return hidden, cos, torch.cat((-sin[..., :half], sin[..., half:]), dim=-1)

    def _project_qkv(self, layer: _Layer, hidden: Any, ops: Any, pending: Any) -> tuple[Any, Any, Any, Any, Any]:
        """Pre-norm and the fused q/k/v projection: ``(hidden, qkv, a, s, bias)``: the residual stream
        (``pending``, the FP8 down projection's ``(out, a, s)`` of the layer before, added to it in the
        norm's kernel), the ``(t, (heads + 2 kv_heads) d)`` product, the ``"unit"`` FP8 GEMM's scales
        still to apply to it (else None) and the bias still to add (else None)."""
        import torch.nn.functional as F

        norm = layer.norm_in
        if layer.fp8 is None:
            x = ops.norm(hidden, norm.weight, norm.variance_epsilon)
            return hidden, F.linear(x, layer.qkv, layer.qkv_bias), None, None, None
        if pending is None:
            xq, xa = ops.norm_quant(hidden, norm.weight, norm.variance_epsilon)
        else:
            hidden, xq, xa = ops.add_norm_quant(hidden, pending[0], norm.weight, norm.variance_epsilon, *pending[1:])
        linear = layer.fp8[0]
        bias = layer.qkv_bias if linear.takes_bias else None  # in the GEMM's epilogue
        qkv, a, s = linear.project(xq, xa, hidden.dtype, bias)
        return hidden, qkv, a, s, (layer.qkv_bias if bias is None else None)

    def _qkv(self, layer: _Layer, hidden: Any, cos: Any, sin: Any, ops: Any = None,
             pending: Any = None) -> tuple[Any, Any, Any]:
        """:meth:`_project_qkv`, then the scales and bias applied, q/k norms (Qwen3), RoPE on q and k
        together: ``(hidden, qk, v)``: the residual stream, ``(t, heads + kv_heads, d)`` roped q and k,
        and ``(t, kv_heads, d)`` v."""
        import torch

        t, heads, kv_heads, d = hidden.shape[0], self.heads, self.kv_heads, self.head_dim
        ops = ops or self.ops
        hidden, qkv, a, s, bias = self._project_qkv(layer, hidden, ops, pending)
        if a is not None or bias is not None:
            qkv = ops.dequant(qkv, a, s, bias)
        split = (heads + kv_heads) * d
        qk = qkv[:, :split].view(t, heads + kv_heads, d)
        if layer.q_norm is not None:
            qk = torch.cat((
                ops.norm(qk[:, :heads], layer.q_norm.weight, layer.q_norm.variance_epsilon),
                ops.norm(qk[:, heads:], layer.k_norm.weight, layer.k_norm.variance_epsilon),
            ), dim=1)
        return hidden, ops.rope(qk, cos, sin), qkv[:, split:].view(t, kv_heads, d)

    def _after_attention(self, layer: _Layer, hidden: Any, attended: Any, ops: Any = None) -> tuple[Any, Any]:
        """The output projection and the MLP, each added to the residual stream in its matmul:
        ``(hidden, None)``; on FP8 weights ``(hidden, (out, a, s))``, the down projection's output not
        yet added (the next layer's norm adds it in its own kernel: one kernel a layer fewer)."""
        import torch.nn.functional as F

        ops, norm, dtype = ops or self.ops, layer.norm_post, hidden.dtype
        if layer.fp8 is not None:  # the residual added after the FP8 matmul (its bias is 1-D only)
            _, o, gate_up, down = layer.fp8
            out, a, s = o.project(*ops.quant(attended), dtype)
            hidden, xq, xa = ops.add_norm_quant(hidden, out, norm.weight, norm.variance_epsilon, a, s)
            return hidden, down.project(*ops.silu_mul_quant(*gate_up.project(xq, xa, dtype)), dtype)
        # In place: out of place, addmm first copies the residual into its output (a kernel each).
        hidden = hidden.addmm_(attended, layer.o.weight.t())
        x = ops.norm(hidden, norm.weight, norm.variance_epsilon)
        return hidden.addmm_(ops.silu_mul(F.linear(x, layer.gate_up)), layer.down.weight.t()), None

    def _logits(self, hidden: Any, ops: Any = None, pending: Any = None) -> Any:
        norm, ops, head = self.model.model.norm, ops or self.ops, self.lm_head_fp8
        if head is not None:  # the norm quantized for the head in the norm's kernel
            if pending is not None:  # the last layer's FP8 down projection (_after_attention), added there too
                _, xq, xa = ops.add_norm_quant(hidden, pending[0], norm.weight, norm.variance_epsilon, *pending[1:])
            else:
                xq, xa = ops.norm_quant(hidden, norm.weight, norm.variance_epsilon)
            return head.mm(xq, xa, hidden.dtype)
        if pending is not None:
            hidden = ops.add(hidden, *pending)
        return self.model.lm_head(ops.norm(hidden, norm.weight, norm.variance_epsilon))


def _version(tensor: Any) -> int | None:
    """The tensor's in-place version counter; None for an inference tensor (it keeps none)."""
    try:
        return tensor._version
    except RuntimeError:
        return None
