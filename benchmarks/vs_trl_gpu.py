"""chatgym's trainer vs TRL's GRPOTrainer on one GPU: wall-clock s/step, generation, memory, accuracy.

Same model (``--shape``, below; default SmolLM2-135M-Instruct, real weights from the packaged GGUF),
task (Math-v0 train split,
the same 8 prompts per step in the same order: ``trainer.sampler.tasks_for_step``), shape (8 prompts
x 8 samples, <= 128 new tokens, temperature 1), lr 1e-5 constant, no KL, clip 0.2 / 0.28, token-mean
loss, group-normalised advantages, Math-v0's own scorer as the reward on both sides. Held-out accuracy:
the first 64 Math-v0 test tasks, greedy, scored by the same chatgym evaluator for both (TRL's weights
are copied into it), before training and every ``--eval-every`` steps; evaluation time is not counted
in the wall clock.

Runs (``--runs``, any subset, each ``NAME:SEED``):

* ``ours``        — ``chatgym.trainer.train.Trainer`` as ``chatgym train`` runs it (HF engine,
  ``decode: static`` = per-slot KV cache + CUDA graphs, fp32 master weights, bf16 autocast, gradient
  checkpointing; per step also the metrics line and the background curve redraw);
* ``ours_async``  — ``ours`` with ``engine.options.async_scheduling`` (decode step ``k + 1`` queued before step
  ``k``'s ids are read back);
* ``ours_dynamic`` — the same with the engine's dynamic-cache decode (``decode: dynamic``);
* ``ours_packed`` — ``ours`` with the update packed (``model.pack: true``; ``--pack`` sets it for ``ours``);
* ``ours_fp8``    — ``ours`` sampling from FP8 weights (``engine.options.quantization: fp8``: the fused
  static step on e4m3 weights, re-quantized at every sync; the learner stays fp32/bf16), with the
  rollout correction ``--correction`` (default ``token_tis``; ``--mask-band`` for the mask modes) —
  applied to every ``ours*`` run alike, so ``ours`` and ``ours_fp8`` differ in the engine's weights only;
* ``ours_vllm``   — ``ours`` generating with the in-process vLLM engine (``engine.backend: vllm``, bf16,
  ``engine.options.gpu_memory_utilization: 0.3``: the share of the card TRL's colocated vLLM gets);
  ``ours_vllm_fp8``: that engine on FP8 weights (vLLM's online FP8, re-quantized at every sync);
  ``ours_vllm_fp8kv``: FP8 weights and an FP8 KV cache (``engine.options.kv_cache_dtype: fp8``, vLLM's
  unit scales): issue 31's accuracy for the configuration that decodes fastest at 7B;
* ``ours_1off``   — ``ours`` with ``trainer.pipeline: one_step_off``: step k+1's rollout runs while step
  k's update does (each batch one weight version behind: ``steps[i]["staleness"]``); timed per step of
  the pipeline's driver, as ``chatgym train`` runs it (see :func:`run_ours` for its evaluations);
* ``ours_compile`` — ``ours`` with the learner's decoder layers compiled (``model.compile: true``:
  fewer, fused kernels for an update that looks bound by issuing ops at 135M; docs/gpu.md);
* ``ours_c`` — ``ours`` with the engine's element-wise pieces compiled (``engine.options.fused_step:
  compiled``: RoPE and the MLP's activation in one kernel each; ``ours_c_compile`` with the learner's
  layers compiled too; ``ours_all``: that with ``async_scheduling`` as well);
* ``ours_px`` — ``ours_all`` with ``engine.options.sampler: philox`` (one Triton kernel draws every row's
  token a step: ``trainer/engines/hf_draw.py``); ``ours_1off_px``: that with ``one_step_off``;
  ``ours_1off_px_gil``: that with Python's thread switch interval at 0.2 ms instead of 5 (the engine's
  worker, the learner's thread and the collector share one interpreter lock: does a thread that wants it
  wait on the one holding it?);
* ``ours_px_fp8`` — ``ours_px`` sampling from FP8 weights (as ``ours_fp8``; issue 31's accuracy at equal
  wall clock against ``ours_px``, with the mismatch figures of both);
* ``ours_px_gil`` — ``ours_px`` (no ``one_step_off``) with the 0.2 ms thread switch interval;
  ``ours_px_ms4`` / ``ours_1off_px_gil_ms4``: ``ours_px`` / ``ours_1off_px_gil`` with the engine's
  ``multi_step: 4`` (four decode steps a read-back of the sampled ids); a run ending ``_pc``
  (``ours_px_pc``, ``ours_1off_px_gil_pc``, ``ours_1off_px_gil_ms4_pc``): the same with
  ``engine.options.precapture: true`` (every graph the rollout can need captured as its requests join);
  ending ``_nc`` (``ours_px_pc_nc``, ``ours_1off_px_gil_pc_nc``, ``ours_1off_px_gil_ms4_pc_nc``): the same
  without gradient checkpointing (and without the shared prompt prefix: one padded forward). The
  update is host-bound alone, so checkpointing costs it nothing there, but beside the rollout its
  recomputed forward is GPU work the two share; ``ours_px_pc_nc_fp8``: ``ours_px_pc_nc`` sampling from FP8
  weights (issue 31's accuracy at equal wall clock against ``ours_px_pc_nc``, with the mismatch figures);
* ``ours_1off_compile`` — both: with an update that issues fewer ops, the next rollout's host work and
  the update's contend less for the host (``ours_1off`` alone gained nothing: both phases issue ops);
* ``trl_bf16``    — TRL with bf16 weights (its fastest configuration in the peers' figures);
* ``trl_fp32``    — TRL with fp32 weights, bf16 autocast and gradient checkpointing (its most accurate);
* ``trl_vllm_bf16`` / ``trl_vllm_fp32`` — the same two with TRL's colocated vLLM generating
  (``use_vllm=True, vllm_mode="colocate"``, 0.3 of the GPU): the configuration a GPU user runs.

Shapes (``--shape``; one shape per ``--out`` folder, the report refuses a mix):

* ``smollm2`` (default) — the real weights above, with held-out accuracy and the PNG;
* ``qwen2.5-1.5b`` / ``qwen2.5-7b`` — the Qwen2.5 architecture (``Qwen2ForCausalLM``) at the published
  widths, depth, heads and vocabulary (``hf_decode_gpu.QWEN_SHAPES``: 1536 / 3584 hidden, 28 layers,
  12 / 28 heads, 2 / 4 KV heads, 151,936 / 152,064 ids) with random weights (seed 0), saved once per
  invocation with SmolLM2's tokenizer into a temp dir that every run loads (ours' learner and engine,
  TRL's model and its vLLM: the same weights) and removed at the end. Math-v0's prompts come from that
  tokenizer; a sampled id past its 49,152 decodes to no text, and random weights almost never sample
  EOS, so every reply runs the full 128 tokens on both sides. No accuracy (``env.eval_tasks=0``, TRL
  without an evaluator): the table's accuracy columns stay empty and no PNG is drawn; s/step, generation
  s and tokens/s are the figures. At 7B fp32 weights + grads + AdamW states are 122 GB: ours trains bf16
  weights there (``model.dtype=bfloat16``) and the ``trl_*_fp32`` runs are refused.

The report prints, besides the table (s/step, generation s, update s, generated tokens per second of
generation and per second of step, peak GiB, accuracy), each ours* configuration's speed against the
faster of ``trl_vllm_bf16`` / ``trl_vllm_fp32`` (their mean s/step over ours' mean s/step, seeds
averaged): the issue's targets are >= 2x at ``smollm2`` and >= 1.5x at ``qwen2.5-1.5b``, with ``ours``,
``ours_vllm`` or ``ours_1off`` (whichever is faster, as long as its accuracy holds at ``smollm2``).

Each run runs in a process of its own (``--in-process``: all in this one, as before 2026-12-05), so
none is timed on the GPU memory, CUDA graphs or engine threads an earlier run left behind; a run that
fails (out of memory, say) leaves the others running, and the script exits non-zero naming it after
the report. ``--run-timeout S`` ends a run (its whole process group, vLLM's engine core included)
after S seconds, so one hung run cannot hold a lease. A run's JSON from an earlier invocation into
the same ``--out`` is removed when the run starts again, so a run that fails is not reported from it.

Wall clock per step is measured around the whole step (``Trainer.step`` + logging; TRL: callback from
``on_step_begin`` to ``on_step_end``), with ``torch.cuda.synchronize()``. Each run writes
``<out>/<name>_<seed>.json``; ``--report DIR`` prints the table of all JSONs in DIR and draws
``accuracy_vs_wallclock.png`` (runs no model).

Slow updates (some steps took 0.6-2.7 s against a usual 0.3 s): every step of ours also records under
``steps[i]["probe"]`` what the update was given and what happened around it: tokens in the batch,
the padded batch shape, each micro-batch forward (its shape; packed: the pack lengths), the CUDA
allocator's ``num_device_alloc`` / ``num_device_free`` / ``num_alloc_retries`` deltas over the update
and over the step, Python garbage collections (generation, seconds, whether inside the update), and
whether the background curve redraw was running when the update started / ended; ``--report``
prints the slowest updates with those fields. Toggles to test the suspects: ``--no-gc-freeze``
(ours' steps run as ``chatgym train`` runs them, with set-up's objects frozen out of the
collector, ``train.gc_freeze``; this turns that off),
``--expandable-segments`` (``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True``: new shapes grow a
segment instead of allocating new blocks), ``--no-plot`` (no curve redraw during the run),
``--learner-cudnn`` (the learner's update with SDPA's cuDNN backend allowed; the engine keeps it
off). Measured on the CPU box (Python 3.11, a tiny trainer after one step,
444k objects tracked by the collector): a full (generation 2) collection takes 0.40 s, and ~0 s
after ``gc.freeze()``. The slow updates' cause was elsewhere: the probe's per-phase CUDA events
(``phases``: forward, loss + backward, optimizer; host and GPU seconds) showed the GPU itself taking
7-8x longer in the forward and the backward of those steps, which were the steps whose padded length
was new — cuDNN attention's per-shape plans (``chatgym.trainer.models.cuda.without_cudnn_attention``).

The next GPU lease, the two targets, two seeds each (one command per seed to stay within 10 minutes a
command — not measured; the report reads every JSON of the folder; ``--steps 10`` at the Qwen shape:
s/step is a median over steps 2..10, and there is no accuracy curve to follow):

    python benchmarks/vs_trl_gpu.py --shape smollm2 --out /tmp/vs_trl_smollm2 --runs ours:0 ours_vllm:0 ours_1off:0 trl_vllm_bf16:0 trl_vllm_fp32:0
    python benchmarks/vs_trl_gpu.py --shape smollm2 --out /tmp/vs_trl_smollm2 --runs ours:1 ours_vllm:1 ours_1off:1 trl_vllm_bf16:1 trl_vllm_fp32:1
    python benchmarks/vs_trl_gpu.py --report /tmp/vs_trl_smollm2
    python benchmarks/vs_trl_gpu.py --shape qwen2.5-1.5b --steps 10 --out /tmp/vs_trl_qwen1.5b --runs ours:0 ours_vllm:0 ours_1off:0 trl_vllm_bf16:0 trl_vllm_fp32:0
    python benchmarks/vs_trl_gpu.py --shape qwen2.5-1.5b --steps 10 --out /tmp/vs_trl_qwen1.5b --runs ours:1 ours_vllm:1 ours_1off:1 trl_vllm_bf16:1 trl_vllm_fp32:1
    python benchmarks/vs_trl_gpu.py --report /tmp/vs_trl_qwen1.5b
    python benchmarks/vs_trl_gpu.py --shape qwen2.5-7b --steps 10 --out /tmp/vs_trl_qwen7b --runs ours:0 ours_vllm:0 ours_1off:0 trl_vllm_bf16:0   # no target: s/step and tokens/s

Earlier ones:

    python benchmarks/vs_trl_gpu.py --runs ours:0 ours:1 trl_bf16:0 --out /tmp/vs_trl
    python benchmarks/vs_trl_gpu.py --runs ours:0 ours_packed:0 --no-gc-freeze --out /tmp/vs_trl_packed
    python benchmarks/vs_trl_gpu.py --report /tmp/vs_trl
    python benchmarks/vs_trl_gpu.py --runs ours:0 ours:1 ours_fp8:0 ours_fp8:1 --out /tmp/vs_trl_fp8

Every ``ours*`` step also records the train/inference mismatch (``rollout/mismatch/*``: mean and max
|engine − learner| logprob, k3 KL(engine ‖ learner), the correction's clip fraction) and
``timing/sync_s``; the report prints their means per run, and the spread of held-out accuracy over the
seeds of each configuration (with two seeds: the noise a difference between configurations is judged
against).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from hf_decode_gpu import QWEN_SHAPES, SHAPES, shape_config  # the Qwen2.5 shape table, one copy

PROMPTS, GROUP, NEW_TOKENS, LR = 8, 8, 128, 1e-5
DEVICE = "cuda"  # a CPU smoke run of the script sets "cpu"
EVAL_TASKS = 64
# --shape: the model every run loads (set by main). smollm2: the packaged real weights, held-out
# accuracy; a Qwen2.5 shape: the directory save_random_model wrote, no accuracy.
MODEL = {"shape": "smollm2", "path": "smollm2"}
# ours' overrides per shape. At 7B, fp32 weights + grads + AdamW states alone are 16 B x 7.6 B = 122 GB
# of the H200's 141: both sides train bf16 weights there (ours model.dtype; TRL's *_bf16 runs only).
SHAPE_OVERRIDES = {"smollm2": [], "qwen2.5-1.5b": [], "qwen2.5-7b": ["model.dtype=bfloat16"]}
FP32_REFUSED = {"qwen2.5-7b"}
# The ours* runs: the engine ("static" / "async" / "dynamic": the hf engine's decode, "vllm": the
# in-process vLLM engine with TRL's 0.3 of the GPU), the pipeline, model.pack, the engine's quantization.
OUR_RUNS: dict[str, dict[str, str]] = {
    "ours": {"engine": "static"},
    "ours_async": {"engine": "async"},
    "ours_dynamic": {"engine": "dynamic"},
    "ours_packed": {"engine": "static", "pack": "true"},
    "ours_fp8": {"engine": "static", "quantization": "fp8"},
    "ours_vllm": {"engine": "vllm"},
    "ours_vllm_fp8": {"engine": "vllm", "quantization": "fp8"},
    "ours_vllm_fp8kv": {"engine": "vllm_kv8", "quantization": "fp8"},
    "ours_1off": {"engine": "static", "pipeline": "one_step_off"},
    "ours_compile": {"engine": "static", "compile": "true"},
    "ours_1off_compile": {"engine": "static", "pipeline": "one_step_off", "compile": "true"},
    "ours_c": {"engine": "static_c"},
    "ours_c_compile": {"engine": "static_c", "compile": "true"},
    "ours_all": {"engine": "async_c", "compile": "true"},
    "ours_px": {"engine": "async_c_px", "compile": "true"},
    "ours_1off_px": {"engine": "async_c_px", "pipeline": "one_step_off", "compile": "true"},
    "ours_1off_px_gil": {"engine": "async_c_px", "pipeline": "one_step_off", "compile": "true", "switch_ms": "0.2"},
    "ours_px_fp8": {"engine": "async_c_px", "compile": "true", "quantization": "fp8"},
    "ours_px_gil": {"engine": "async_c_px", "compile": "true", "switch_ms": "0.2"},
    "ours_px_ms4": {"engine": "async_c_px_ms4", "compile": "true"},
    "ours_1off_px_gil_ms4": {"engine": "async_c_px_ms4", "pipeline": "one_step_off", "compile": "true", "switch_ms": "0.2"},
    "ours_px_pc": {"engine": "async_c_px_pc", "compile": "true"},
    "ours_1off_px_gil_pc": {"engine": "async_c_px_pc", "pipeline": "one_step_off", "compile": "true", "switch_ms": "0.2"},
    "ours_1off_px_gil_ms4_pc": {"engine": "async_c_px_ms4_pc", "pipeline": "one_step_off", "compile": "true",
                                "switch_ms": "0.2"},
    "ours_px_pc_nc": {"engine": "async_c_px_pc", "compile": "true", "checkpointing": "false"},
    "ours_px_pc_nc_fp8": {"engine": "async_c_px_pc", "compile": "true", "checkpointing": "false", "quantization": "fp8"},
    "ours_1off_px_gil_pc_nc": {"engine": "async_c_px_pc", "pipeline": "one_step_off", "compile": "true",
                               "switch_ms": "0.2", "checkpointing": "false"},
    "ours_1off_px_gil_ms4_pc_nc": {"engine": "async_c_px_ms4_pc", "pipeline": "one_step_off", "compile": "true",
                                   "switch_ms": "0.2", "checkpointing": "false"},
}
# The trl* runs: (fp32 master weights, TRL's colocated vLLM generating).
TRL_RUNS = {
    "trl_bf16": (False, False),
    "trl_fp32": (True, False),
    "trl_vllm_bf16": (False, True),
    "trl_vllm_fp32": (True, True),
}
DEFAULT_RUNS = [f"{name}:{seed}" for name in ("ours_px_pc_nc", "trl_vllm_bf16", "trl_vllm_fp32") for seed in (0, 1)]
VLLM_SHARE = 0.3  # of the GPU's memory, for TRL's colocated vLLM and ours_vllm alike
# ours' update settings (--pack, --pack-max-tokens, --checkpointing); the runs named ours_packed set pack.
UPDATE = {"pack": "auto", "pack_max_tokens": None, "checkpointing": None}
# ours' rollout correction (--correction, --mask-band), the same for every ours* run.
CORRECTION = {"rollout_correction": "token_tis", "rollout_mask_band": (0.5, 2.0)}


class UsageError(SystemExit):
    """A command-line value refused: :func:`main` hands it to the parser (status 2, ``vs_trl_gpu.py:
    error: ...``, as argparse's own refusals); elsewhere it ends the process as the SystemExit it is
    (one line, status 1: the report after the runs, when none of them ended)."""


def engine_overrides(engine: str, quantization: str | None = None) -> list[str]:
    """The ``engine.*`` overrides of an ours* run's ``engine`` (see :data:`OUR_RUNS`)."""
    precapture = engine.endswith("_pc")  # any hf engine below, with engine.options.precapture
    engine = engine.removesuffix("_pc")
    if engine in ("vllm", "vllm_kv8"):  # vllm_kv8: the KV cache in FP8 too
        options = [f"gpu_memory_utilization: {VLLM_SHARE}"] + (["kv_cache_dtype: fp8"] if engine == "vllm_kv8" else [])
        options += [f"quantization: {quantization}"] if quantization else []
        return ["engine.backend=vllm", "engine.dtype=bfloat16", f"engine.options={{{', '.join(options)}}}"]
    out = [
        "engine.backend=hf",
        f"engine.dtype={'bfloat16' if DEVICE == 'cuda' else 'float32'}",
        # "async": the static decode with async_scheduling (the next step queued before the read-back);
        # "static_c": its element-wise pieces compiled (fused_step: compiled); "async_c": both.
        {"async": "engine.options={decode: static, async_scheduling: true}",
         "static_c": "engine.options={decode: static, fused_step: compiled}",
         "async_c": "engine.options={decode: static, fused_step: compiled, async_scheduling: true}",
         "async_c_px": "engine.options={decode: static, fused_step: compiled, async_scheduling: true, sampler: philox}",
         "async_c_px_ms4": "engine.options={decode: static, fused_step: compiled, async_scheduling: true, "
                           "sampler: philox, multi_step: 4}",
         }.get(
            engine, f"engine.options={{decode: {engine}}}"),
    ]
    if quantization:  # after engine.options=..., which replaces the whole mapping
        out.append(f"engine.options.quantization={quantization}")
    if precapture:
        out.append("engine.options.precapture=true")
    return out


def our_config(
    seed: int,
    steps: int,
    out: Path,
    engine: str,
    pack: str | None = None,
    quantization: str | None = None,
    pipeline: str = "sync",
    compile: str = "false",
    checkpointing: str | None = None,
):
    """ours' run config at the shape of :data:`MODEL`; ``engine``: see :data:`OUR_RUNS`. ``checkpointing``
    ``"false"`` (the runs ending ``_nc``): no gradient checkpointing and no shared prompt prefix, one
    padded forward an update (else ``--checkpointing``'s choice, on by default on CUDA)."""
    from chatgym.trainer.config.run import load_config

    extra = [f"model.pack={pack or UPDATE['pack']}", f"algo.rollout_correction={CORRECTION['rollout_correction']}",
             "algo.rollout_mask_band=[{},{}]".format(*CORRECTION["rollout_mask_band"])]
    no_checkpointing = checkpointing == "false"
    if no_checkpointing:
        extra.append("train.share_prompt_prefix=false")
    on = False if no_checkpointing else UPDATE["checkpointing"] if UPDATE["checkpointing"] is not None else DEVICE == "cuda"
    if UPDATE["pack_max_tokens"]:
        extra.append(f"model.pack_max_tokens={UPDATE['pack_max_tokens']}")
    return load_config(
        None,
        [
            f"model.path={MODEL['path']}",
            *SHAPE_OVERRIDES[MODEL["shape"]],
            f"model.gradient_checkpointing={str(on).lower()}",
            f"model.compile={compile}",
            *extra,
            *engine_overrides(engine, quantization),
            f"trainer.pipeline={pipeline}",
            "env.id=Math-v0",
            f"env.eval_tasks={EVAL_TASKS if has_accuracy() else 0}",
            f"rollout.max_tokens={NEW_TOKENS}",
            f"rollout.max_response_tokens={NEW_TOKENS}",
            "rollout.max_model_len=512",
            f"train.max_steps={steps}",
            f"train.prompts_per_step={PROMPTS}",
            f"train.group_size={GROUP}",
            "train.micro_batch_size=64",
            f"train.seed={seed}",
            f"train.output_dir={out}",
            "train.progress=false",
            "train.tensorboard=false",
            "algo.policy_loss=clip_higher",
            "algo.policy_loss_kwargs={eps_low: 0.2, eps_high: 0.28}",
            f"optim.lr={LR}",
        ],
    )


def has_accuracy() -> bool:
    """Held-out accuracy is measured at the real-weights shape only (random weights score nothing)."""
    return MODEL["shape"] == "smollm2"


def shape_model_config(shape: str, tokenizer: Any) -> Any:
    """The transformers config of a Qwen2.5 shape (``hf_decode_gpu.shape_config``: the published
    widths, depth, heads and vocabulary) with ``tokenizer``'s bos / eos / pad ids, so generation ends
    on the token the chat template ends turns with.

    Raises:
        KeyError: ``shape`` is not a Qwen2.5 shape of ``hf_decode_gpu.QWEN_SHAPES``.
    """
    if shape not in QWEN_SHAPES:
        raise KeyError(f"--shape {shape!r}: no random-weights model (choose one of {sorted(QWEN_SHAPES)})")
    config = shape_config(shape)
    config.bos_token_id, config.eos_token_id = tokenizer.bos_token_id, tokenizer.eos_token_id
    config.pad_token_id = tokenizer.pad_token_id
    return config


def save_random_model(shape: str, folder: Path, device: str = "cuda", **overrides: Any) -> Path:
    """``shape``'s model with random weights (seed 0, bf16) and the packaged SmolLM2 tokenizer, saved
    in ``folder``: the one checkpoint all runs of the shape load (ours' learner and engine, TRL's model
    and its vLLM), so every run starts from the same weights. SmolLM2's tokenizer has 49,152 ids, the
    Qwen vocabulary 151,936 / 152,064: the embedding and LM head keep Qwen's size (their cost is part
    of the shape), and a sampled id past the tokenizer decodes to no text (``tokenizers`` skips it).
    ``overrides``: config fields to change (``random_model``'s; tests shrink the model with them).

    Returns:
        ``folder`` (``config.json``, ``model.safetensors``, the tokenizer files).
    """
    import torch
    from transformers import AutoTokenizer

    from chatgym.trainer.models.packaged import load_model_path
    from chatgym.trainer.models.random_init import random_model

    tokenizer = AutoTokenizer.from_pretrained(load_model_path("smollm2"))
    config = shape_model_config(shape, tokenizer)
    with torch.device(device):  # initialised where it runs: a 7B random init on the CPU takes minutes
        model = random_model(config, dtype="bfloat16", device=device, **overrides)
    model.save_pretrained(folder, safe_serialization=True)
    tokenizer.save_pretrained(folder)
    return Path(folder)


ALLOC_KEYS = ("num_device_alloc", "num_device_free", "num_alloc_retries")


def _alloc_stats() -> dict[str, int]:
    import torch

    if not torch.cuda.is_available():
        return {}
    stats = torch.cuda.memory_stats()
    return {k: int(stats.get(k, 0)) for k in ALLOC_KEYS} | {
        "reserved_bytes": int(stats.get("reserved_bytes.all.current", 0))
    }


def _delta(after: dict[str, int], before: dict[str, int]) -> dict[str, int]:
    return {k: after[k] - before[k] for k in after}


class UpdateProbe:
    """Records, per training step of ours, what the update was given and what ran around it (see the
    module docstring): wraps the ``update`` the Learner calls and the per-micro-batch forward it runs,
    and listens to Python's garbage collector (``gc.callbacks``). Instrumentation of this benchmark
    only; the wrappers call the originals unchanged."""

    def __init__(self, trainer: Any):
        import chatgym.trainer.learner.learner as role
        import chatgym.trainer.learner.update as update_module
        from chatgym.trainer.learner.batch import pack_chunks

        self.trainer = trainer
        self.record: dict[str, Any] = {}
        self.in_update = False
        self._gc_t = 0.0
        self._patched = [
            (role, "update", role.update),
            (update_module, "policy_logprobs", update_module.policy_logprobs),
            (update_module, "_step", update_module._step),
        ]
        plain_update, plain_forward, plain_step = role.update, update_module.policy_logprobs, update_module._step
        self._marks: list[tuple[str, float, Any]] = []  # (label, host time, CUDA event) inside the update

        def mark(label: str) -> None:
            import torch

            event = None
            if torch.cuda.is_available():
                event = torch.cuda.Event(enable_timing=True)
                event.record()
            self._marks.append((label, time.perf_counter(), event))

        def update(state, batch, algo, plan, **kw):
            import torch

            rec = self.record
            rec["tokens"] = int(batch.attention_mask.sum())
            rec["trained_tokens"] = int(batch.loss_mask.sum())
            rec["batch_shape"] = list(batch.input_ids.shape)
            rec["pack"], rec["share_prefix"] = plan.pack, plan.share_prefix
            rec["forwards"] = []
            rec["plot_running_at_update_start"] = self.plot_running()
            before = _alloc_stats()
            self.in_update = True
            self._marks = []
            t = time.perf_counter()
            mark("start")
            try:
                return plain_update(state, batch, algo, plan, **kw)
            finally:
                mark("end")
                if torch.cuda.is_available():
                    torch.cuda.synchronize()
                self.in_update = False
                rec["update_synced_s"] = time.perf_counter() - t
                rec["phases"] = self.phases()
                rec["update_alloc"] = _delta(_alloc_stats(), before)
                rec["plot_running_at_update_end"] = self.plot_running()

        def policy_logprobs(model, mb, prefix_len, **kw):
            entry: dict[str, Any] = {"shape": list(mb.input_ids.shape), "prefix_len": prefix_len}
            if kw.get("pack"):  # the packed forward reads the lengths on the host anyway
                lengths = mb.lengths.tolist()
                entry["packs"] = [
                    prefix_len + sum(lengths[i] - prefix_len for i in run)
                    for run in pack_chunks(lengths, prefix_len, kw.get("pack_max_tokens", 512))
                ]
            self.record.setdefault("forwards", []).append(entry)
            mark("forward")
            try:
                return plain_forward(model, mb, prefix_len, **kw)
            finally:
                mark("loss+backward")

        def step(*args, **kw):
            mark("optimizer")
            try:
                return plain_step(*args, **kw)
            finally:
                mark("after optimizer")

        role.update = update
        update_module.policy_logprobs = policy_logprobs
        update_module._step = step
        gc.callbacks.append(self._on_gc)

    def phases(self) -> list[dict[str, Any]]:
        """The update cut at the marks (synchronised first): per phase its host seconds (the time the
        Python thread spent issuing it) and GPU seconds (between its CUDA events). A phase whose host
        time far exceeds its GPU time was held up on the host (GIL, CPU), not by the device."""
        out = []
        for (label, t0, e0), (_, t1, e1) in zip(self._marks, self._marks[1:], strict=False):
            gpu = e0.elapsed_time(e1) / 1e3 if e0 is not None else None
            out.append({"phase": label, "host_s": round(t1 - t0, 5), "gpu_s": None if gpu is None else round(gpu, 5)})
        return out

    def plot_running(self) -> bool:
        drawer = getattr(self.trainer.metrics, "_drawer", None)
        return bool(drawer is not None and drawer.is_alive())

    def _on_gc(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._gc_t = time.perf_counter()
            return
        seconds = time.perf_counter() - self._gc_t
        if info["generation"] == 0 and seconds < 1e-3:  # hundreds per step: counted, not listed
            self.record["gc0_quick"] = self.record.get("gc0_quick", 0) + 1
            self.record["gc0_quick_s"] = self.record.get("gc0_quick_s", 0.0) + seconds
            return
        self.record.setdefault("gc", []).append(
            {
                "generation": info["generation"],
                "collected": info["collected"],
                "s": round(seconds, 5),
                "in_update": self.in_update,
            }
        )

    def start_step(self) -> None:
        self.record = {"gc": [], "plot_running_at_step_start": self.plot_running()}
        self._step_alloc = _alloc_stats()

    def end_step(self) -> dict[str, Any]:
        self.record["step_alloc"] = _delta(_alloc_stats(), self._step_alloc)
        slots = getattr(getattr(self.trainer, "engine", None), "_slots", None)  # the hf engine's static decode
        if slots is not None:
            self.record["graphs_captured"] = slots.graphs_captured  # so far: a new bucket mid-run shows here
        self.record["gc_s"] = sum(e["s"] for e in self.record["gc"]) + self.record.get("gc0_quick_s", 0.0)
        return self.record

    def close(self) -> None:
        for module, name, original in self._patched:
            setattr(module, name, original)
        if self._on_gc in gc.callbacks:
            gc.callbacks.remove(self._on_gc)


class OneStepOff:
    """ours_1off's steps: the trainer's ``one_step_off`` driver (``Pipeline.run``) advanced one step
    per call, as ``chatgym train`` runs it: step k+1's rollout runs while step k's update does (the
    update in a worker thread), and step k's weights reach the engine before step k+2's rollout."""

    def __init__(self, trainer: Any, steps: int):
        self.trainer = trainer
        self.results = trainer.pipeline.run(0, steps)

    def __call__(self, step: int) -> dict[str, float]:
        """Step ``step``'s log row (``Trainer.step_metrics``); steps come in order."""
        return self.trainer.step_metrics(self.trainer.loop.run_until_complete(anext(self.results)))

    def finish(self) -> None:
        """After the last step: the driver sends the last update's weights to the engine and ends."""

        async def rest() -> list:
            return [r async for r in self.results]

        self.trainer.loop.run_until_complete(rest())

    def close(self) -> None:
        self.trainer.loop.run_until_complete(self.results.aclose())


def run_ours(
    seed: int,
    steps: int,
    eval_every: int,
    engine: str,
    pack: str | None = None,
    options: dict | None = None,
    quantization: str | None = None,
    pipeline: str = "sync",
    compile: str = "false",
    switch_ms: str | None = None,
    checkpointing: str | None = None,
) -> dict:
    """One ours* run (``engine``, ``pack``, ``quantization``, ``pipeline``, ``compile``, ``switch_ms``,
    ``checkpointing``: see :data:`OUR_RUNS` and :func:`our_config`):
    ``steps`` timed steps, held-out accuracy before, every ``eval_every`` steps and after (None at a
    random-weights shape). With ``one_step_off`` the next rollout keeps running during an evaluation
    (as in ``chatgym train``), whose seconds are taken out of the wall clock: the step after one is
    marked ``after_eval`` and left out of the medians. Its evaluations during training see the weights
    one update behind, as ``chatgym train``'s do; the last one follows the final weight sync."""
    import torch

    from chatgym.trainer.train import Trainer, frozen_gc

    options = options or {}
    cuda = torch.cuda.is_available()
    switch = sys.getswitchinterval()
    if switch_ms is not None:
        sys.setswitchinterval(float(switch_ms) / 1000)
    out = Path(tempfile.mkdtemp(prefix="vs-trl-ours-"))
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    trainer = Trainer(our_config(seed, steps, out, engine, pack, quantization, pipeline, compile, checkpointing))
    if options.get("learner_cudnn"):  # cuDNN attention allowed in the update (its per-shape plans)
        import contextlib

        import chatgym.trainer.learner.learner as role

        role.without_cudnn_attention = lambda device: contextlib.nullcontext()
    if options.get("torch_graph_capture"):  # the engine's captures as before: torch.cuda.graph's own set-up
        import chatgym.trainer.engines.hf_static as static

        def torch_graph_capture(graph, pool, stream, fn):
            with torch.cuda.graph(graph, pool=pool, stream=stream, capture_error_mode="thread_local"):
                return fn()

        static.capture = torch_graph_capture
    setup_s = time.perf_counter() - t0
    probe = UpdateProbe(trainer)
    overlapped = OneStepOff(trainer, steps) if pipeline == "one_step_off" else None
    run_step = overlapped or trainer.step

    def accuracy() -> float | None:
        return trainer.evaluate().get("eval/accuracy")  # {} with env.eval_tasks=0

    try:
        curve = [(0.0, accuracy())]
        with frozen_gc(not options.get("no_gc_freeze")):  # as Trainer.train runs its steps
            wall, rows = 0.0, []
            for step in range(steps):
                probe.start_step()
                t = time.perf_counter()
                metrics = run_step(step)
                t_log = time.perf_counter()
                trainer.metrics.log(step + 1, metrics)
                if not options.get("no_plot"):
                    trainer.metrics.plot_later()
                log_s = time.perf_counter() - t_log
                if cuda:
                    torch.cuda.synchronize()
                dt = time.perf_counter() - t
                wall += dt
                record = probe.end_step()
                record["log_s"] = log_s
                record["sync_s"] = metrics.get("timing/sync_s", 0.0)
                rows.append(
                    {
                        "wall_s": dt,
                        "gen_s": metrics["timing/rollout_s"],
                        "update_s": metrics["timing/update_s"],
                        "gen_tokens": metrics["throughput/gen_tokens_per_s"] * metrics["timing/rollout_s"],
                        # a rollout of one batch decodes as many steps as its longest reply
                        "decode_steps": metrics.get("response/length_max", 0),
                        "reward": metrics["reward/mean"],
                        "mismatch": {k.rsplit("/", 1)[1]: v for k, v in metrics.items() if k.startswith("rollout/mismatch/")},
                        "sync_s": metrics.get("timing/sync_s", 0.0),
                        # weight versions the batch lags the learner (one_step_off: 1 from step 2 on)
                        "staleness": metrics.get("staleness/max", 0.0),
                        "probe": record,
                    }
                )
                if overlapped is not None and step > 0 and step % eval_every == 0:
                    rows[-1]["after_eval"] = True
                brief = {k: v for k, v in rows[-1].items() if k != "probe"}
                forwards = record.get("forwards", [])
                print(
                    f"ours {engine} {pipeline} seed {seed} step {step + 1}: {brief} | tokens {record.get('tokens')} "
                    f"shape {record.get('batch_shape')} forwards {len(forwards)} alloc {record.get('update_alloc')} "
                    f"gc {record['gc_s']:.3f} s plot {record.get('plot_running_at_update_start')}",
                    flush=True,
                )
                if (step + 1) % eval_every == 0 or step + 1 == steps:
                    if overlapped is not None and step + 1 == steps:
                        overlapped.finish()
                    curve.append((wall, accuracy()))
        trainer.metrics.wait_plotted()
    finally:
        if overlapped is not None:
            overlapped.close()
        probe.close()
        trainer.close()
        sys.setswitchinterval(switch)
        shutil.rmtree(out, ignore_errors=True)  # its metrics, traces and checkpoint (~1.6 GB at 135M)
    peak = torch.cuda.max_memory_allocated() / 2**30 if cuda else float("nan")
    return {"setup_s": setup_s, "steps": rows, "curve": curve, "peak_gib": peak, "options": options}


def run_trl(seed: int, steps: int, eval_every: int, fp32: bool, evaluator, vllm: bool = False) -> dict:
    """One TRL GRPOTrainer run of the model of :data:`MODEL`; ``vllm``: generation by TRL's colocated
    vLLM (``use_vllm=True, vllm_mode="colocate"``, ``vllm_gpu_memory_utilization=0.3``, TRL's defaults
    otherwise, including its importance-sampling correction), timed around
    ``vllm_generation.generate``. ``evaluator``: the model's held-out accuracy (None: not measured)."""
    import gymnasium as gym
    import torch
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    import chatgym  # noqa: F401  (registers the env ids)
    from chatgym.trainer.chat.tokenizer import get_tokenizer
    from chatgym.trainer.models.packaged import load_model
    from chatgym.trainer.sampler import tasks_for_step

    _fingerprint_fallback()
    env = gym.make("Math-v0", split="train")
    num_tasks = len(env.unwrapped.tasks)
    rows = []
    for step in range(steps):
        for task in tasks_for_step(step, PROMPTS, num_tasks, seed):
            obs, _ = env.reset(options={"task_index": task})
            rows.append({"prompt": [{"role": m["role"], "content": m["content"]} for m in obs], "task": task})

    def math_reward(prompts, completions, task, **_):
        scores = []
        for completion, index in zip(completions, task, strict=True):
            env.reset(options={"task_index": index})
            scores.append(float(env.step(completion[0]["content"])[1]))
        return scores

    torch.cuda.reset_peak_memory_stats()
    tokenizer = get_tokenizer(MODEL["path"])
    # Loaded from its directory: its name_or_path is what TRL's colocated vLLM loads.
    model = load_model(MODEL["path"], dtype="float32" if fp32 else "bfloat16", device=DEVICE)
    gen: list[tuple[float, int, int]] = []

    def timed(generate, count):
        """``generate`` timed into ``gen``: (seconds, *``count(out, args, kwargs)``), the count being
        (new tokens, the longest reply's tokens)."""

        def call(*args, **kwargs):
            torch.cuda.synchronize()
            t = time.perf_counter()
            out = generate(*args, **kwargs)
            torch.cuda.synchronize()
            gen.append((time.perf_counter() - t, *count(out, args, kwargs)))
            return out

        return call

    def new_tokens(out, args, kwargs):  # model.generate: the ids after the (padded) prompt
        prompt_len = (kwargs.get("input_ids") if "input_ids" in kwargs else args[0]).shape[1]
        per_row = (out[:, prompt_len:] != tokenizer.pad_token_id).sum(dim=1)
        return int(per_row.sum()), int(per_row.max())

    model.generate = timed(model.generate, new_tokens)
    def accuracy(model) -> float | None:
        return None if evaluator is None else evaluator(model)

    curve = [(0.0, accuracy(model))]
    wall = [0.0]
    steps_out: list[dict] = []

    class Timer(TrainerCallback):
        def on_step_begin(self, args, state, control, **kwargs):
            torch.cuda.synchronize()
            self.t = time.perf_counter()
            self.gen_before = len(gen)

        def on_step_end(self, args, state, control, model=None, **kwargs):
            torch.cuda.synchronize()
            dt = time.perf_counter() - self.t
            wall[0] += dt
            g = gen[self.gen_before :]
            steps_out.append(
                {
                    "wall_s": dt,
                    "gen_s": sum(x for x, _, _ in g),
                    "gen_tokens": sum(n for _, n, _ in g),
                    "decode_steps": sum(longest for _, _, longest in g),
                }
            )
            steps_out[-1]["update_s"] = dt - steps_out[-1]["gen_s"]
            print(
                f"trl {'vllm ' if vllm else ''}{'fp32' if fp32 else 'bf16'} seed {seed} step {state.global_step}: {steps_out[-1]}",
                flush=True,
            )
            if state.global_step % eval_every == 0 or state.global_step == steps:
                curve.append((wall[0], accuracy(model)))

    args = GRPOConfig(
        output_dir=tempfile.mkdtemp(prefix="vs-trl-trl-"),
        learning_rate=LR,
        lr_scheduler_type="constant",
        warmup_steps=0,
        max_grad_norm=1.0,
        per_device_train_batch_size=PROMPTS * GROUP,
        num_generations=GROUP,
        max_completion_length=NEW_TOKENS,
        temperature=1.0,
        top_p=1.0,
        beta=0.0,
        epsilon=0.2,
        epsilon_high=0.28,
        loss_type="dapo",  # token-mean over the batch, as ours
        scale_rewards="group",
        shuffle_dataset=False,
        max_steps=steps,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        seed=seed,
        bf16=DEVICE == "cuda",
        use_cpu=DEVICE == "cpu",
        gradient_checkpointing=fp32,
        **({"use_vllm": True, "vllm_mode": "colocate", "vllm_gpu_memory_utilization": VLLM_SHARE} if vllm else {}),
    )
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=[math_reward],
        args=args,
        train_dataset=Dataset.from_list(rows),
        processing_class=tokenizer,
        callbacks=[Timer()],
    )
    if vllm:  # generation goes through TRL's vLLM wrapper (its completion ids second), not model.generate
        vg = trainer.vllm_generation
        vg.generate = timed(vg.generate, lambda out, *_: (sum(len(ids) for ids in out[1]), max(map(len, out[1]), default=0)))
    trainer.train()
    return {"steps": steps_out, "curve": curve, "peak_gib": torch.cuda.max_memory_allocated() / 2**30}


def _fingerprint_fallback() -> None:
    """datasets hashes every new Dataset with dill; with some pyarrow/dill pairs that pickling fails
    (``Can't pickle <class 'MonthDayNano'>``, seen on the CPU box). A fingerprint only names cache
    files, so fall back to a random one, as datasets itself does for unhashable transforms."""
    import uuid

    import datasets.arrow_dataset as arrow_dataset

    plain = arrow_dataset.generate_fingerprint

    def fingerprint(dataset):
        try:
            return plain(dataset)
        except Exception:
            return uuid.uuid4().hex

    arrow_dataset.generate_fingerprint = fingerprint


def make_evaluator():
    """Held-out accuracy of any SmolLM2-shaped model through one chatgym Trainer's evaluator."""
    from chatgym.trainer.train import Trainer

    trainer = Trainer(our_config(0, 1, Path(tempfile.mkdtemp(prefix="vs-trl-eval-")), "static"))

    def evaluate(model) -> float:
        trainer.engine.update_weights(model.state_dict())
        return trainer.evaluate()["eval/accuracy"]

    return evaluate


def summarize(name: str, result: dict) -> dict:
    """One run's figures: medians over its steps after the first (and, one_step_off, not the steps
    right after an evaluation) of s/step, generation s, update s, generated tokens per second of
    generation (``gen_tok_s``) and of the step (``step_tok_s``), milliseconds of generation per
    decode step (``ms_per_decode_step``: generation s over the step's longest reply, the decode
    steps a batch takes; None in JSONs without ``decode_steps``); peak memory; held-out accuracy (None
    where not measured); the run's ``shape`` (``smollm2`` for JSONs written before ``--shape``)."""
    later = [r for r in result["steps"][1:] if not r.get("after_eval")] or result["steps"]
    med = {k: statistics.median(r[k] for r in later) for k in ("wall_s", "gen_s", "update_s")}
    rates = [r["gen_tokens"] / r["gen_s"] for r in later if r["gen_s"] > 0]
    tps = statistics.median(rates) if rates else float("nan")  # no step timed its generation
    per_step = [1e3 * r["gen_s"] / r["decode_steps"] for r in later if r.get("decode_steps") and r["gen_s"] > 0]
    curve = result["curve"]
    mismatch = {
        key: statistics.mean(r["mismatch"][key] for r in result["steps"] if key in r.get("mismatch", {}))
        for key in ("mean_abs", "max_abs", "k3_kl", "clip_frac")
        if any(key in r.get("mismatch", {}) for r in result["steps"])
    }
    return {
        "run": name,
        "shape": result.get("shape", "smollm2"),
        "mismatch": mismatch,
        "sync_s": statistics.median(r.get("sync_s", 0.0) for r in later),
        "s_per_step": med["wall_s"],
        "gen_s": med["gen_s"],
        "update_s": med["update_s"],
        "gen_tok_s": tps,
        "step_tok_s": statistics.median(r["gen_tokens"] / r["wall_s"] for r in later),
        # generation s / the step's longest reply: each policy's reply lengths taken out (None: not recorded)
        "ms_per_decode_step": statistics.median(per_step) if per_step else None,
        "peak_gib": result["peak_gib"],
        "acc_before": curve[0][1],
        "acc_after": curve[-1][1],
        "wall_total_s": curve[-1][0],
        "curve": curve,
    }


def accuracy_at(curve: list, wall: float) -> float | None:
    return [acc for t, acc in curve if t <= wall + 1e-9][-1]


def fmt_acc(value: float | None, width: int) -> str:
    return " " * width if value is None else f"{value:{width}.4f}"


def slow_updates(results: dict[str, dict], top: int = 3) -> None:
    """Print each run's slowest updates next to its median, with what the probe saw (ours only);
    ``results``: run name -> its JSON."""
    for name, result in results.items():
        steps = result["steps"]
        if not steps or "probe" not in steps[0]:
            continue
        median = statistics.median(r["update_s"] for r in steps)
        print(f"\n{name}: median update {median:.3f} s; slowest:")
        order = sorted(range(len(steps)), key=lambda i: -steps[i]["update_s"])[:top]
        for i in order:
            p = steps[i]["probe"]
            gc_in = [e for e in p.get("gc", []) if e["in_update"]]
            print(
                f"  step {i + 1}: update {steps[i]['update_s']:.3f} s (synced {p.get('update_synced_s', 0):.3f}), "
                f"tokens {p.get('tokens')}, shape {p.get('batch_shape')}, forwards {len(p.get('forwards', []))}, "
                f"alloc {p.get('update_alloc')}, gc in update {sum(e['s'] for e in gc_in):.3f} s "
                f"(gens {[e['generation'] for e in gc_in]}), plot running {p.get('plot_running_at_update_start')}"
                f"/{p.get('plot_running_at_update_end')}"
            )
            phases = ", ".join(
                f"{e['phase']} host {e['host_s']:.3f} gpu {e['gpu_s'] if e['gpu_s'] is None else format(e['gpu_s'], '.3f')}"
                for e in p.get("phases", [])
            )
            if phases:
                print(f"    phases (s): {phases}")


def mismatch_table(rows: list[dict], groups: dict[str, list[dict]], equal: float) -> None:
    """Per run: the mean rollout/mismatch/* over its steps and its median sync time; per configuration:
    the held-out accuracy's spread over its seeds (the noise a difference between them is judged by)."""
    if not any(r["mismatch"] for r in rows):
        return
    print(f"\n{'run':16s} {'mean |d|':>9s} {'max |d|':>8s} {'k3 KL':>9s} {'clip frac':>9s} {'sync s':>7s}")
    for r in rows:
        m = r["mismatch"]
        print(
            f"{r['run']:16s} {m.get('mean_abs', float('nan')):9.5f} {m.get('max_abs', float('nan')):8.4f} "
            f"{m.get('k3_kl', float('nan')):9.6f} {m.get('clip_frac', float('nan')):9.5f} {r['sync_s']:7.3f}"
        )
    if all(r["acc_after"] is None for r in rows):
        return
    print(f"\nheld-out accuracy over seeds (after training; @ {equal:.0f} s of training):")
    for name, rs in groups.items():
        after = [r["acc_after"] for r in rs]
        at = [accuracy_at(r["curve"], equal) for r in rs]
        print(f"{name:16s} after {min(after):.4f} .. {max(after):.4f}   @ equal wall clock {min(at):.4f} .. {max(at):.4f}")


def speedups(groups: dict[str, list[dict]]) -> tuple[str, dict[str, float]] | None:
    """The targets' ratio: the faster TRL+vLLM configuration (``trl_vllm_bf16`` / ``trl_vllm_fp32``,
    the lower mean s/step over its seeds) and, per ours* configuration, that s/step over its own mean
    s/step (> 1: ours is faster; the targets are >= 2 at smollm2, >= 1.5 at qwen2.5-1.5b). None: no
    TRL+vLLM run, or no ours* run, in ``groups`` (configuration -> its runs' :func:`summarize` rows)."""

    def mean_step(name: str) -> float:
        return statistics.mean(r["s_per_step"] for r in groups[name])

    theirs = [name for name in groups if name.startswith("trl_vllm")]
    if not theirs:
        return None
    anchor = min(theirs, key=mean_step)
    ours = {name: mean_step(anchor) / mean_step(name) for name in groups if name.startswith("ours")}
    return (anchor, ours) if ours else None


def decode_steps(rows: list[dict]) -> None:
    """Generation per decode step, each run's median of (generation s / the step's longest reply):
    a step generates until its longest reply ends, so s/step and tokens/s both depend on the reply
    lengths each policy learned; this figure does not (prefill and the last rows' tail included)."""
    timed = [r for r in rows if r.get("ms_per_decode_step") is not None]
    if timed:
        print("\ngeneration ms per decode step (generation s / the step's longest reply, median):")
        for r in timed:
            print(f"{r['run']:<18} {r['ms_per_decode_step']:7.3f}")


def run_table(rows: list[dict], equal: float) -> None:
    print(
        f"{'run':18s} {'s/step':>7s} {'gen s':>6s} {'upd s':>6s} {'gen tok/s':>9s} {'step tok/s':>10s} "
        f"{'peak GiB':>8s} {'acc before':>10s} {'acc after':>9s} {'acc @' + format(equal, '.0f') + ' s':>10s}"
    )
    for r in rows:
        line = (
            f"{r['run']:18s} {r['s_per_step']:7.3f} {r['gen_s']:6.3f} {r['update_s']:6.3f} "
            f"{r['gen_tok_s']:9,.0f} {r['step_tok_s']:10,.0f} {r['peak_gib']:8.2f} {fmt_acc(r['acc_before'], 10)} "
            f"{fmt_acc(r['acc_after'], 9)} {fmt_acc(accuracy_at(r['curve'], equal), 10)}"
        )
        print(line.rstrip())


def seed_means(groups: dict[str, list[dict]], equal: float) -> None:
    print("\nmeans over seeds:")
    for name, rs in groups.items():

        def mean(key: str, rs: list[dict] = rs) -> float:
            return statistics.mean(r[key] for r in rs)

        acc = ""
        if rs[0]["acc_after"] is not None:
            acc = (
                f"  acc {mean('acc_before'):.4f} -> {mean('acc_after'):.4f}  "
                f"acc @ {equal:.0f} s {statistics.mean(accuracy_at(r['curve'], equal) for r in rs):.4f}"
            )
        print(
            f"{name:18s} seeds {len(rs)}  s/step {mean('s_per_step'):.3f}  gen tok/s {mean('gen_tok_s'):,.0f}  "
            f"step tok/s {mean('step_tok_s'):,.0f}{acc}"
        )


def pairwise(groups: dict[str, list[dict]]) -> None:
    for mine in [g for g in groups if g.startswith("ours")]:
        for name, rs in groups.items():
            if name.startswith("trl"):
                ours = statistics.mean(r["s_per_step"] for r in groups[mine])
                theirs = statistics.mean(r["s_per_step"] for r in rs)
                g_ours = statistics.mean(r["gen_tok_s"] for r in groups[mine])
                g_theirs = statistics.mean(r["gen_tok_s"] for r in rs)
                print(
                    f"{mine} vs {name}: {theirs / ours:.2f}x faster per step, {g_ours / g_theirs:.2f}x generation tok/s"
                )
    ratio = speedups(groups)
    if ratio is not None:
        anchor, by_run = ratio
        anchor_s = statistics.mean(r["s_per_step"] for r in groups[anchor])
        print(f"\nagainst the faster TRL+vLLM run, {anchor} ({anchor_s:.3f} s/step), its s/step / ours:")
        for name, x in by_run.items():
            print(f"{name:18s} {x:.2f}x")


def plot(rows: list[dict], folder: Path, shape: str) -> None:
    if all(r["acc_after"] is None for r in rows):
        print(f"no held-out accuracy at shape {shape} (random weights): no accuracy_vs_wallclock.png")
        return
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for r in rows:
        xs, ys = zip(*r["curve"], strict=True)
        ax.plot(xs, ys, marker="o", label=r["run"])
    ax.set_xlabel("wall-clock training time (s, evaluation excluded)")
    ax.set_ylabel("held-out accuracy (64 Math-v0 test tasks, greedy)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(folder / "accuracy_vs_wallclock.png", dpi=100)
    print(f"plot: {folder / 'accuracy_vs_wallclock.png'}")


def report(folder: Path) -> None:
    """Print the table of every run's JSON in ``folder`` (one shape), the means over seeds, the
    ratios to TRL (each TRL run; the faster TRL+vLLM one: :func:`speedups`), the mismatch table and
    the slowest updates, and draw ``accuracy_vs_wallclock.png`` (where accuracy was measured).

    JSON files that are not runs of this script (or runs with no steps) are skipped, each with a line.

    Raises:
        UsageError: no run in ``folder``, or runs of more than one shape there.
    """
    results: dict[str, dict] = {}
    for p, result in run_jsons(folder, say=print).items():
        if not result.get("steps") or not result.get("curve"):
            print(f"skipped {p.name}: not a run of this script, or a run with no steps")
            continue
        results[p.stem] = result
    rows = [summarize(name, result) for name, result in results.items()]
    if not rows:
        raise UsageError(f"no results in {folder}")
    shapes = sorted({r["shape"] for r in rows})
    if len(shapes) > 1:
        raise UsageError(f"--report {folder}: runs of several shapes ({', '.join(shapes)}); one folder per shape")
    equal = min(r["wall_total_s"] for r in rows)
    print(f"chatgym vs TRL, shape {shapes[0]} ({folder})")
    run_table(rows, equal)
    groups: dict[str, list[dict]] = {}
    for r in rows:
        groups.setdefault(r["run"].rsplit("_", 1)[0], []).append(r)
    seed_means(groups, equal)
    decode_steps(rows)
    pairwise(groups)
    mismatch_table(rows, groups, equal)
    slow_updates(results)
    plot(rows, folder, shapes[0])


def parse_run(spec: str) -> tuple[str, int]:
    """One ``--runs`` entry, ``NAME:SEED`` -> (name, seed).

    Raises:
        UsageError: not ``NAME:SEED`` with a whole-number seed in [0, 2**32 - 1], or a name of neither
            :data:`OUR_RUNS` nor :data:`TRL_RUNS` (one line naming the entry).
    """
    name, sep, seed = spec.partition(":")
    if not sep or not (seed.isascii() and seed.isdigit()):  # "²" is a digit to str.isdigit, not to int
        raise UsageError(f"--runs: {spec!r} is not NAME:SEED (e.g. ours:0)")
    if name not in OUR_RUNS and name not in TRL_RUNS:
        raise UsageError(f"--runs: unknown run {name!r} in {spec!r}; choose from {', '.join([*OUR_RUNS, *TRL_RUNS])}")
    if int(seed) > 2**32 - 1:  # train.seed's range: refused there only once the run's config loads
        raise UsageError(f"--runs: the seed of {spec!r} must be in [0, 4294967295] (2**32 - 1)")
    return name, int(seed)


def check_runs(runs: list[tuple[str, int]], shape: str) -> None:
    """Refuse, before any run, fp32 TRL at a shape in :data:`FP32_REFUSED` (:class:`UsageError`)."""
    fp32 = sorted({name for name, _ in runs if name in TRL_RUNS and TRL_RUNS[name][0]})
    if fp32 and shape in FP32_REFUSED:
        does = "does" if len(fp32) == 1 else "do"
        raise UsageError(f"--shape {shape}: {', '.join(fp32)} {does} not fit (fp32 weights + AdamW: 122 GB); run the *_bf16 ones")


def check_installed(runs: list[tuple[str, int]]) -> None:
    """Refuse, before any run, a missing TRL or vLLM (the TRL runs come last, after minutes of ours)."""
    import importlib.util

    if any(name in TRL_RUNS for name, _ in runs) and importlib.util.find_spec("trl") is None:
        raise SystemExit("vs_trl_gpu.py: the trl_* runs need TRL: pip install trl==1.16.0 datasets")
    vllm = sorted({name for name, _ in runs if OUR_RUNS.get(name, {}).get("engine", "").startswith("vllm")
                   or (name in TRL_RUNS and TRL_RUNS[name][1])})
    if vllm and importlib.util.find_spec("vllm") is None:
        raise SystemExit(f"vs_trl_gpu.py: {', '.join(vllm)} need vLLM on CUDA: pip install vllm")


def run_jsons(folder: Path, say: Any = None) -> dict[Path, dict]:
    """The JSON objects of ``folder/*.json`` by path, in name order; each file that holds none is
    skipped, with a line to ``say`` when given."""
    found = {}
    for p in sorted(folder.glob("*.json")):
        try:
            result = json.loads(p.read_text())
        except json.JSONDecodeError as exc:
            why = f"not JSON ({exc})"
        else:
            if isinstance(result, dict):
                found[p] = result
                continue
            why = "not a run of this script, or a run with no steps"
        if say is not None:
            say(f"skipped {p.name}: {why}")
    return found


def check_out(out: Path, shape: str) -> None:
    """Refuse an ``--out`` folder holding runs of another shape (the report takes one shape a folder;
    :class:`UsageError`)."""
    other = sorted({result.get("shape", "smollm2") for result in run_jsons(out).values()} - {shape})
    if other:
        raise UsageError(f"--out {out}: holds runs of shape {', '.join(other)}, not {shape}; one folder per shape")


def run_one(name: str, seed: int, args: argparse.Namespace, options: dict, evaluator: Any) -> dict:
    if name in OUR_RUNS:
        return run_ours(seed, args.steps, args.eval_every, options=options, **OUR_RUNS[name])
    fp32, vllm = TRL_RUNS[name]
    return run_trl(seed, args.steps, args.eval_every, fp32, evaluator, vllm)


def run_all(runs: list[tuple[str, int]], args: argparse.Namespace, options: dict, out: Path) -> None:
    """Every run in order in this process, each written to ``out/<name>_<seed>.json`` as it ends
    (a child of :func:`run_isolated` is given one)."""
    evaluator = None
    for name, seed in runs:
        if name in TRL_RUNS and evaluator is None and has_accuracy():
            evaluator = make_evaluator()
        result = run_one(name, seed, args, options, evaluator)
        result["shape"] = MODEL["shape"]
        (out / f"{name}_{seed}.json").write_text(json.dumps(result))
        print(
            json.dumps({k: v for k, v in summarize(f"{name}_{seed}", result).items() if k != "curve"}),
            flush=True,
        )


def child_command(argv: list[str], *, only: str | None = None, model_dir: str | None = None,
                  save_model: str | None = None) -> list[str]:
    """This script's command line for one child process: ``argv`` (the parent's, checked already) plus
    ``--child-run NAME:SEED`` (run that one), ``--child-model-dir`` (load the shape's saved random
    weights) or ``--child-save-model DIR`` (save them and exit)."""
    extra = []
    for flag, value in (("--child-run", only), ("--child-model-dir", model_dir), ("--child-save-model", save_model)):
        if value is not None:
            extra += [flag, value]
    return [sys.executable, str(Path(__file__).resolve()), *argv, *extra]


def run_isolated(commands: list[tuple[str, list[str]]], timeout: float | None = None) -> list[str]:
    """Run each ``(spec, command)`` in its own process, in order, whatever the others did. Why: a run
    leaves GPU memory, CUDA graphs, allocator caches and engine threads behind in its process (TRL's
    colocated vLLM frees nothing), so runs sharing one process are timed on what the earlier ones left:
    on an H200, ``ours:1`` after ``ours_vllm:0`` peaked at 48.92 GiB instead of 7.24, and the fifth run
    of a process ran out of memory.

    Each child leads a process group of its own, ended whole (SIGTERM, then SIGKILL after 10 s) when
    it outlives ``timeout`` seconds or this process is interrupted: vLLM's engine-core processes
    would otherwise hold the GPU for the next run.

    Returns:
        ``"NAME:SEED (rc N)"`` for each command that exited non-zero, ``"NAME:SEED (timed out after
        N s)"`` for each ended at ``timeout`` (its output went to ours).

    Raises:
        KeyboardInterrupt: this process was interrupted (the running child's group ended first).
    """
    import signal
    import subprocess

    def signal_group(child: subprocess.Popen, sig: int) -> None:
        try:
            os.killpg(child.pid, sig)
        except ProcessLookupError:  # the group is gone
            pass

    def end_group(child: subprocess.Popen) -> None:
        signal_group(child, signal.SIGTERM)
        try:
            child.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
        signal_group(child, signal.SIGKILL)  # the leader, or what it left behind
        child.wait()

    failed = []
    for spec, command in commands:
        child = subprocess.Popen(command, start_new_session=True)
        try:
            rc = child.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            end_group(child)
            failed.append(f"{spec} (timed out after {timeout:g} s)")
            continue
        except BaseException:
            end_group(child)
            raise
        signal_group(child, signal.SIGKILL)  # a grandchild the run left (an engine core) must not outlive it
        if rc != 0:
            failed.append(f"{spec} (rc {rc})")
    return failed


def build_parser() -> argparse.ArgumentParser:
    """The command's flags (the children's among them, hidden)."""
    from chatgym.trainer.algos.correction import ROLLOUT_CORRECTIONS

    # prog: the name in "vs_trl_gpu.py: error: ..." whatever ran the script (runpy, a test).
    ap = argparse.ArgumentParser(prog="vs_trl_gpu.py", description=__doc__.splitlines()[0],
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    # The defaults: ours' fastest synchronous run (2.09x in the 2026-12-06 evening H100 lease) against
    # TRL as GPU users run it (colocated vLLM), both master-weight choices: the anchor is the faster.
    ap.add_argument("--runs", nargs="*", default=DEFAULT_RUNS,
                    help=f"NAME:SEED ... (names: {', '.join([*OUR_RUNS, *TRL_RUNS])}; the module docstring says "
                    "what each runs)")
    ap.add_argument("--shape", choices=SHAPES, default="smollm2", help="the model (module docstring)")
    ap.add_argument("--steps", type=int, default=30, help="timed training steps a run")
    ap.add_argument("--eval-every", type=int, default=10, help="steps between held-out evaluations (SmolLM2 shape)")
    ap.add_argument("--out", default="vs_trl_results", help="folder of the runs' JSONs and the plot")
    ap.add_argument("--report", default=None, help="print the table of the JSONs in this folder and exit")
    ap.add_argument("--pack", choices=("auto", "true", "false"), default="auto", help="ours' model.pack")
    ap.add_argument("--pack-max-tokens", type=int, default=None, help="ours' model.pack_max_tokens")
    ap.add_argument(
        "--checkpointing",
        choices=("on", "off"),
        default=None,
        help="ours' gradient checkpointing, the runs ending _nc aside (always off); None: on on CUDA",
    )
    ap.add_argument("--no-gc-freeze", action="store_true", help="ours without train.gc_freeze")
    ap.add_argument(
        "--expandable-segments", action="store_true", help="PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True"
    )
    ap.add_argument("--no-plot", action="store_true", help="no learning-curve redraw during ours' steps")
    ap.add_argument("--learner-cudnn", action="store_true", help="ours' update with cuDNN attention allowed")
    ap.add_argument("--torch-graph-capture", action="store_true",
                    help="the hf engine's graphs captured with torch.cuda.graph (which first synchronizes and empties "
                    "the allocators' caches), as before hf_static.capture")
    ap.add_argument("--correction", choices=ROLLOUT_CORRECTIONS, default="token_tis",
                    help="ours' algo.rollout_correction (every ours* run)")
    ap.add_argument("--mask-band", type=float, nargs=2, default=(0.5, 2.0), metavar=("LO", "HI"),
                    help="ours' algo.rollout_mask_band, 0 < LO <= 1 <= HI")
    ap.add_argument("--in-process", action="store_true", help="every run in this one process, not a process a run")
    ap.add_argument("--run-timeout", type=float, default=None, metavar="S",
                    help="seconds a run may take, > 0 (its process group is ended); None: no limit")
    # A child's flags (child_command): the one run it does, the Qwen shape's saved weights. Named
    # --child-* so that no abbreviation of a user's flag (--o for --out) can reach them.
    ap.add_argument("--child-run", dest="only", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--child-model-dir", dest="model_dir", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--child-save-model", dest="save_model", default=None, help=argparse.SUPPRESS)
    return ap


def checked_args(ap: argparse.ArgumentParser, argv: list[str]) -> tuple[argparse.Namespace, list[tuple[str, int]]]:
    """``argv`` parsed, and its runs (none with ``--report``), every value checked before anything loads
    or runs; a bad one is the parser's error (status 2, ``vs_trl_gpu.py: error: ...``)."""
    args = ap.parse_args(argv)
    lo, hi = args.mask_band
    try:
        # algo.rollout_mask_band's own rule, checked here: the config would refuse it only in each child.
        if not 0 < lo <= 1 <= hi:
            raise UsageError(f"--mask-band must be LO HI with 0 < LO <= 1 <= HI, got {lo:g} {hi:g}")
        if args.run_timeout is not None and not args.run_timeout > 0:  # "not >": NaN too
            raise UsageError(f"--run-timeout must be > 0 seconds, got {args.run_timeout:g}")
        if args.pack_max_tokens is not None and args.pack_max_tokens < 1:  # model.pack_max_tokens' rule
            raise UsageError(f"--pack-max-tokens must be >= 1, got {args.pack_max_tokens}")
        if args.report:
            return args, []
        for flag, value in (("--steps", args.steps), ("--eval-every", args.eval_every)):
            if value < 1:  # 0 steps has no median; an evaluation every 0 steps divides by zero mid-run
                raise UsageError(f"{flag} must be >= 1, got {value}")
        runs = [parse_run(spec) for spec in args.runs]
        if not runs:
            raise UsageError("--runs: give at least one NAME:SEED (e.g. ours:0)")
        twice = sorted({f"{name}:{seed}" for name, seed in runs if runs.count((name, seed)) > 1})
        if twice:  # both would write <name>_<seed>.json, the second over the first
            raise UsageError(f"--runs: {', '.join(twice)} given more than once")
        check_runs(runs, args.shape)
        check_out(Path(args.out), args.shape)
    except UsageError as exc:
        ap.error(str(exc))
    return args, runs


def main(argv: list[str] | None = None) -> None:
    ap = build_parser()
    argv = sys.argv[1:] if argv is None else list(argv)
    args, runs = checked_args(ap, argv)
    CORRECTION.update(rollout_correction=args.correction, rollout_mask_band=tuple(args.mask_band))
    if args.report:
        try:
            report(Path(args.report))
        except UsageError as exc:
            ap.error(str(exc))
        return
    if args.expandable_segments:  # read when CUDA is first initialised: before importing torch
        os.environ["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"
    UPDATE.update(
        pack=args.pack,
        pack_max_tokens=args.pack_max_tokens,
        checkpointing=None if args.checkpointing is None else args.checkpointing == "on",
    )
    options = {
        "no_gc_freeze": args.no_gc_freeze,
        "no_plot": args.no_plot,
        "learner_cudnn": args.learner_cudnn,
        "torch_graph_capture": args.torch_graph_capture,
        "expandable_segments": args.expandable_segments,
        **UPDATE,
    }
    import torch

    # Before TRL and vLLM: on a machine without a GPU, installing them is not what the user needs.
    if not torch.cuda.is_available():
        raise SystemExit("vs_trl_gpu.py: needs CUDA (torch.cuda.is_available() is False)")
    check_installed(runs)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    MODEL["shape"] = args.shape
    if args.save_model is not None:  # a child: the shape's random weights, then exit
        save_random_model(args.shape, Path(args.save_model), device=DEVICE)
        return
    if args.model_dir is not None:
        MODEL["path"] = args.model_dir
    if args.only is not None:  # a child: one run in this process
        run_all([parse_run(args.only)], args, options, out)
        return
    workdir = None
    if args.shape in QWEN_SHAPES:  # saved once: every run below loads the same random weights
        workdir = Path(tempfile.mkdtemp(prefix=f"vs-trl-{args.shape}-"))
    try:
        if args.in_process:
            if workdir is not None:
                MODEL["path"] = str(save_random_model(args.shape, workdir, device=DEVICE))
                torch.cuda.empty_cache()
            run_all(runs, args, options, out)
            failed = []
        else:  # a process a run, nothing of this one on the GPU (the model is saved by a child too)
            if workdir is not None and run_isolated([("--save-model", child_command(argv, save_model=str(workdir)))]):
                raise SystemExit(f"vs_trl_gpu.py: could not save the {args.shape} random weights (output above)")
            model_dir = None if workdir is None else str(workdir)
            for name, seed in runs:  # a run that fails now must not be reported from an earlier file
                earlier = out / f"{name}_{seed}.json"
                if earlier.exists():
                    earlier.unlink()
                    print(f"vs_trl_gpu.py: removed {earlier} (an earlier invocation's {name}:{seed}; run again now)")
            commands = [(spec, child_command(argv, only=spec, model_dir=model_dir)) for spec in args.runs]
            failed = run_isolated(commands, timeout=args.run_timeout)
    finally:
        if workdir is not None:
            shutil.rmtree(workdir, ignore_errors=True)
    try:
        report(out)  # the runs that ended (it refuses when none did)
    finally:
        if failed:
            print(f"vs_trl_gpu.py: runs that failed (their output is above): {', '.join(failed)}", file=sys.stderr)
    if failed:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
