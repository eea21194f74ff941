"""The `hf` engine's Triton kernels compiled for an H100 / H200 (sm_90a) on any machine, no GPU needed.

For each kernel of the fused decode step at the Qwen2.5-7B shape (256 rows), as the engine launches it:
the PTX's instruction count (and the libdevice functions named in it, e.g. ``__nv_logf``), the
registers a thread and spill bytes from Triton's own ``ptxas -v``, the shared memory, and how many
programs a multiprocessor holds by registers and by shared memory (65,536 registers, 228 KiB). It is
how the sampler's ``tl.log`` polynomial and the one-pass MLP quantization's register count were found
without a device (docs/gpu.md); a GPU run is still what measures time.

    python benchmarks/kernels_sm90.py
"""

from __future__ import annotations

import os
import re
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

REGISTERS, SHARED = 65536, 228 * 1024  # a Hopper multiprocessor's
# Triton 3.9's default (fused multiply-adds), set so the counts do not move with 3.10's (and no warning)
os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")


@dataclass
class Compiled:
    """One kernel compiled for sm_90a."""

    name: str
    ptx: str
    registers: int
    spill_bytes: int
    shared: int
    warps: int

    @property
    def instructions(self) -> int:
        return len(re.findall(r"^\s+[a-z@][^\n]*;", self.ptx, re.M))

    @property
    def resident(self) -> int:
        """About how many programs a multiprocessor holds: the lower of the register and shared-memory limits
        (registers counted exactly, not in their allocation granules)."""
        by_regs = REGISTERS // max(1, self.registers * 32 * self.warps)
        return min(by_regs, SHARED // self.shared) if self.shared else by_regs


def compile_sm90(name: str, fn, values: dict, constexprs: dict, warps: int, stages: int = 3) -> Compiled:
    """``fn`` (a ``triton.jit`` function) compiled for sm_90a. ``values``: each runtime argument as a
    Triton type string for pointers (``"*bf16"``) or an example value (ints and floats), from which it
    takes Triton's divisible-by-16 specialization as a launch would."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.backends.nvidia.compiler import get_ptxas

    signature, attrs = {}, {}
    for i, arg in enumerate(fn.arg_names):
        if arg in constexprs:
            signature[arg] = "constexpr"
            continue
        value = values[arg]
        if isinstance(value, str):
            signature[arg] = value
            attrs[(i,)] = [["tt.divisibility", 16]]  # torch's allocations and the step's views are 16-byte aligned
        elif isinstance(value, float):
            signature[arg] = "fp32"
        else:
            signature[arg] = "i32"
            if value % 16 == 0:
                attrs[(i,)] = [["tt.divisibility", 16]]
    source = triton.compiler.ASTSource(fn=fn, signature=signature, constexprs=constexprs, attrs=attrs)
    compiled = triton.compile(source, target=GPUTarget("cuda", 90, 32), options={"num_warps": warps, "num_stages": stages})
    ptx = compiled.asm["ptx"]
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "k.ptx"
        path.write_text(ptx)
        out = subprocess.run([get_ptxas(90).path, "-arch=sm_90a", "-v", str(path), "-o", str(path.with_suffix(".cubin"))],
                             capture_output=True, text=True, check=True).stderr
    registers = int(re.search(r"Used (\d+) registers", out).group(1))
    spills = sum(int(n) for n in re.findall(r"(\d+) bytes spill", out))
    return Compiled(name, ptx, registers, spills, int(compiled.metadata.shared), warps)


def engine_kernels() -> list[Compiled]:
    """The decode step's kernels at the Qwen2.5-7B shape, 256 rows, as the engine launches them."""
    from chatgym.trainer.engines import hf_attention, hf_draw, hf_norm_quant, hf_silu_quant

    rows, hidden, inner, vocab, heads, kv_heads, d = 256, 3584, 18944, 152064, 28, 4, 128
    out = []
    qkv_row = (heads + 2 * kv_heads) * d
    for cache in ("*fp8e4nv", "*bf16"):
        block, warps, stages = hf_attention.launch_config(cache == "*fp8e4nv")  # CHATGYM_DECODE_ATTENTION_CONFIG too
        out.append(compile_sm90(
            f"decode_attention ({'e4m3' if cache == '*fp8e4nv' else 'bf16'} cache)", hf_attention._kernel(),
            dict(q="*bf16", k="*bf16", v="*bf16", k_cache=cache, v_cache=cache, positions="*i64", out="*bf16",
                 scale=d**-0.5, q_row=qkv_row, q_head=d, k_row=qkv_row, k_head=d, v_row=qkv_row, v_head=d,
                 c_slot=kv_heads * 512 * d, c_head=512 * d, c_col=d, o_row=heads * d, o_head=d, a="*fp32",
                 s="*fp32", b="*bf16", k_col=heads * d, v_col=(heads + kv_heads) * d, cos="*bf16", sin="*bf16",
                 cs_row=d),
            dict(GROUP=heads // kv_heads, GROUP_ROWS=16, D=d, BLOCK=block, PRECISION="tf32",
                 FP8=cache == "*fp8e4nv", FP8_MAX=448.0, SCALED=True, BIAS=True, ROPE=True, HALF=True,
                 RAW=hf_attention._raw_value()),
            warps, stages))
    out.append(compile_sm90(
        "philox_chunk (sampler)", hf_draw._chunk_kernel(),
        dict(logits="*bf16", stride=vocab, seeds="*i64", counts="*i64", inv_temps="*fp32", parts="*fp32", n=rows,
             vocab=vocab, chunks=-(-vocab // hf_draw.CHUNK)),
        dict(CHUNK=hf_draw.CHUNK, BLOCK=hf_draw.BLOCK, FAST_LOG=hf_draw.fast_log()), 4))
    head, tail, warps = hf_silu_quant.one_pass_launch(inner)
    out.append(compile_sm90(
        "silu_mul_row (MLP quantization, one pass)", hf_silu_quant._row_kernel(),
        dict(gate_up="*bf16", a="*fp32", s="*fp32", out="*fp8e4nv", scales="*fp32", row_stride=2 * inner,
             inner=inner, fp8_max=448.0, min_scale=1e-12),
        dict(SCALED=True, HEAD=head, TAIL=tail), warps))
    block, warps = hf_norm_quant.launch(hidden)
    out.append(compile_sm90(
        "row_quant (add + RMSNorm + quantization)", hf_norm_quant._kernel(),
        dict(x="*bf16", x_row=hidden, out="*bf16", out_row=hidden, a="*fp32", s="*fp32", weight="*bf16",
             hidden="*bf16", hidden_row=hidden, q="*fp8e4nv", scales="*fp32", width=hidden, eps=1e-6,
             fp8_max=448.0, min_scale=1e-12),
        dict(ADD=True, SCALED=True, NORM=True, BLOCK=block), warps))
    return out


def main() -> None:
    import argparse

    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args()  # --help; no options
    print("the decode step's Triton kernels at the Qwen2.5-7B shape, 256 rows, compiled for sm_90a; programs a "
          "multiprocessor: how many its registers and shared memory let run at once", flush=True)
    for k in engine_kernels():
        slow = sorted(set(re.findall(r"__nv_[a-z0-9_]+", k.ptx)))
        print(f"{k.name:46} {k.instructions:5d} PTX instructions, {k.registers:3d} registers x {k.warps * 32:4d} "
              f"threads, {k.spill_bytes} bytes spilled, {k.shared:6d} B shared: {k.resident} a multiprocessor"
              + (f"; libdevice: {', '.join(slow)}" if slow else ""), flush=True)


if __name__ == "__main__":
    main()
