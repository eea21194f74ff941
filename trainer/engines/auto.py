"""``engine.backend: auto``: the engine this machine runs fastest for the model, by a measured rule.

* no CUDA: ``vllm`` when vLLM is installed (the CPU main job's engine), else ``hf``;
* CUDA: ``hf`` (static decode, fused step) for a checkpoint of at most :data:`AUTO_VLLM_ABOVE`
  parameters, ``vllm`` above it (``hf`` when vLLM is not installed). When it picks vLLM on CUDA, vLLM
  takes :data:`AUTO_VLLM_MEMORY` of the GPU (its own default, 0.92, leaves a colocated learner nothing).
* CUDA with ``engine.options.quantization: fp8``: ``vllm`` at every size (when installed). The ``hf``
  engine's FP8 step decodes slower than its own bf16 one (Qwen2.5-7B shape, 64 / 256 rows: 6,024 /
  12,781 tokens/s against 8,069 / 14,993; ``benchmarks/results/fp8_h200/2026-12-02b/``; at SmolLM2 in
  ``vs_trl_gpu.py`` 0.774-0.803 s of generation a step against 0.448-0.471), vLLM's faster than its own
  bf16 at 64 rows (13,746 against 11,443).

The rule is from one H200 (``benchmarks/hf_decode_gpu.py``: bf16, 128 new tokens, temperature 1;
decode tokens/s at 64 / 256 rows, ``hf`` static vs vLLM 0.26's in-process engine; docs/gpu.md; the 135M
and 1.5B figures from the session that filed the GPU-speed issue, the 7B ones from
``benchmarks/results/fp8_h200/2026-12-02b/``):
SmolLM2-135M 21,601 / 53,078 vs 11,052 / 16,483; Qwen2.5-1.5B shape 15,339 / 32,793 vs 11,925 / 19,406;
Qwen2.5-7B shape 8,069 / 14,993 vs 11,443 / 24,096. The crossover between 1.5 B and 7 B was not
measured; 3 B is close to their geometric mean (3.2 B). Re-measured on one H100 with every ``hf`` speed
option (``benchmarks/results/tables_h100_2026-12-07/``, against vLLM's ``LLM.generate``): SmolLM2
42,284 / 116,257 vs 12,372 / 18,636; 1.5B 23,455 / 55,140 vs 11,639 / 27,037; 7B ``hf`` 8,728 / 19,655,
chatgym's vLLM engine 9,187 / 19,867 vs 9,166 / 19,562.

Under ``auto``, ``engine.options`` must be taken by every engine it may pick here (checked at start-up
by :func:`chatgym.trainer.engines.check_options`), so no option is dropped silently whichever it picks.
"""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path

AUTO_VLLM_ABOVE = 3_000_000_000  # parameters
AUTO_VLLM_MEMORY = 0.3  # vLLM's share of the GPU (gpu_memory_utilization) when auto picks it on CUDA


def has_cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def has_vllm() -> bool:
    return importlib.util.find_spec("vllm") is not None


def candidates(cuda: bool | None = None, vllm: bool | None = None) -> list[str]:
    """The engines ``auto`` may pick on this machine (CUDA / vLLM detected when None)."""
    cuda = has_cuda() if cuda is None else cuda
    vllm = has_vllm() if vllm is None else vllm
    if not vllm:
        return ["hf"]
    return ["hf", "vllm"] if cuda else ["vllm"]


def checkpoint_parameters(model_path: str | Path) -> int | None:
    """Parameters stored in ``model_path``'s ``*.safetensors`` files, from their headers (no tensor is
    read; a tied weight stored once counts once); None when the directory has none."""
    from safetensors import safe_open

    files = sorted(Path(model_path).glob("*.safetensors"))
    if not files:
        return None
    total = 0
    for file in files:
        with safe_open(str(file), "pt") as st:
            total += sum(math.prod(st.get_slice(name).get_shape()) for name in st.keys())  # noqa: SIM118 (not iterable)
    return total


def choose_backend(
    model_path: str | Path, cuda: bool | None = None, vllm: bool | None = None, *, fp8: bool = False
) -> tuple[str, str]:
    """``(backend, why)``: the engine ``auto`` runs for the model in ``model_path`` (module doc's rule)
    and the reason, one line for the start-up log. ``fp8``: the run asked for FP8 weights
    (``engine.options.quantization``). ``cuda`` / ``vllm`` override the detection (tests)."""
    cuda = has_cuda() if cuda is None else cuda
    vllm = has_vllm() if vllm is None else vllm
    if not cuda:
        return ("vllm", "no CUDA, vLLM installed") if vllm else ("hf", "no CUDA, vLLM not installed")
    if not vllm:
        return "hf", "CUDA, vLLM not installed"
    if fp8:
        return "vllm", "CUDA, FP8 weights: the hf engine's FP8 step is slower than its bf16 one (docs/gpu.md)"
    n = checkpoint_parameters(model_path)
    if n is None:
        return "hf", f"CUDA, no safetensors in {model_path} to size the model (hf up to {AUTO_VLLM_ABOVE:.0e} parameters)"
    side = "<=" if n <= AUTO_VLLM_ABOVE else ">"
    backend = "hf" if n <= AUTO_VLLM_ABOVE else "vllm"
    return backend, f"CUDA, {n:,} parameters {side} {AUTO_VLLM_ABOVE:.0e} (hf faster up to 1.5 B, vLLM at 7 B: docs/gpu.md)"


def auto_options(backend: str, cuda: bool | None = None) -> dict[str, float]:
    """Options ``auto`` adds for the engine it picked (``engine.options`` win): vLLM's GPU share."""
    cuda = has_cuda() if cuda is None else cuda
    return {"gpu_memory_utilization": AUTO_VLLM_MEMORY} if backend == "vllm" and cuda else {}
