"""Decode throughput of the transformers engine's modes, of vLLM and of ``model.generate`` (TRL's path).

SmolLM2-135M (real weights with ``--real-weights``, else its shape with random weights), bf16,
prompts of 40-120 tokens, 128 new tokens each, sampling at temperature 1 (EOS ignored so every row
runs the full 128 tokens: the figure is decode speed, not the model's reply lengths):

* ``engine static``  — ``TransformersEngine(decode="static")``: per-slot KV cache + CUDA graphs, the
  step through :mod:`chatgym.trainer.engines.hf_fused` (the default);
* ``engine async``   — the same with ``async_scheduling`` (step ``k + 1`` queued before step ``k``'s
  ids are read back);
* ``engine layers``  — ``decode="static"`` through the model's own layers (``fused_step=False``);
* ``engine dynamic`` — ``TransformersEngine(decode="dynamic")``: padded ``DynamicCache`` batch;
* ``engine static all`` / ``static fp8 all`` — every speed option of the static path (``fused_step:
  compiled``, ``async_scheduling``, ``sampler: philox``), bf16 / FP8 weights (``static fp8+head all``:
  the LM head in FP8 too; ``... cutlass``: on vLLM's CUTLASS FP8 GEMM, ``CHATGYM_FP8_GEMM=cutlass``;
  ``... kv8``: the KV cache in e4m3, ``kv_cache_dtype: fp8``; ``static all kv8``: that alone, bf16 weights;
  each FP8/bf16 row divides by ``static all``, bf16 weights and cache);
* ``generate``       — ``model.generate`` with the dynamic cache (what TRL's GRPOTrainer calls).

Each path runs the same prompts ``--repeats`` times after one warm-up round (which pays graph capture
/ allocator growth; reported as ``first_s``). Prints tokens/s, ms per decode step and the ratio of each
to ``generate``. Also checks token-exactness of the static path: greedy ids of a few prompts equal the
dynamic path's, and their logprobs match a full forward pass of the same weights.

``--seeded`` gives every request its own ``seed`` (as the trainer does: one generator per row) instead
of the engine's shared generator.

FP8 (:mod:`chatgym.trainer.engines.hf_fp8`; needs compute capability >= 8.9): ``--fp8`` without
``--modes`` adds the mode ``static fp8`` (the fused static step on e4m3 weights with per-channel scales) and ``static fp8+head``
(the LM head in FP8 too) and prints their tokens/s over ``engine static``'s (bf16) per batch, plus the FP8 engine's greedy agreement with the bf16 one and
its logprobs against a bf16 forward pass. ``--vllm`` also runs the in-process vLLM engine at the same
shape (bf16, and ``quantization="fp8"`` with ``--fp8``), each in its own process (random weights:
vLLM's ``load_format="dummy"`` on the shape's config), through chatgym's engine (``vllm bf16``) and
through vLLM's own ``LLM.generate`` on that engine (``vllm bf16 LLM.gen``), and prints their ratio. ``--shape`` picks the model shape (random
weights unless ``--real-weights``, SmolLM2 only): ``smollm2`` (135M), ``qwen2.5-1.5b``, ``qwen2.5-7b``
(Qwen2 configs written here: no download).

``--decode-only`` adds decode tokens/s without the prefill: each round also runs the same requests cut to
64 new tokens, and ``rows x 64`` over the median of the rounds' time differences (128 tokens less 64) is
the tokens/s of decode steps 65-128 alone (prefill, admission and hand-back cancel), for the engine
modes and chatgym's vLLM engine alike; FP8/bf16 rows then give the decode ratio too (``decode x``).
``--interleave`` builds every engine mode first and runs each round through every mode in turn (in the
order given), so that a drift of the device's speed reaches the modes alike, and with ``--decode-only``
prints every round's decode seconds (on an H100 at the 7B shape and 256 rows the rounds spread 5-7%:
``benchmarks/results/fp8_value_pairs_h100_2026-12-07``); the engine modes only (not ``--vllm-variants``).

``--vllm-variants NAME=JSON ...`` runs vLLM alone (no ``hf`` mode, no ``model.generate``), one process
a variant with the JSON object's engine options (``quantization``, ``kv_cache_dtype``,
``async_scheduling``, any ``vllm.EngineArgs`` field), each labelled ``vllm NAME``; a variant whose name
starts with ``fp8`` is divided by the one named the same with ``bf16`` in its place (``FP8/bf16`` rows),
so options can be compared at equal settings otherwise.

    python benchmarks/hf_decode_gpu.py --real-weights --batch 64 256
    python benchmarks/hf_decode_gpu.py --shape qwen2.5-7b --fp8 --vllm --modes static --skip-generate
    python benchmarks/hf_decode_gpu.py --shape qwen2.5-7b --vllm-variants 'bf16={}' 'fp8={"quantization": "fp8"}' \
        'bf16_async={"async_scheduling": true}' 'fp8_async={"quantization": "fp8", "async_scheduling": true}'
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from unittest import mock

NEW_TOKENS = 128
SHORT_TOKENS = NEW_TOKENS // 2  # --decode-only: the same requests cut here; the difference is decode alone


def make_prompts(n: int, vocab: int, seed: int) -> list[list[int]]:
    import random

    rng = random.Random(seed)
    return [[rng.randrange(100, vocab) for _ in range(rng.randint(40, 120))] for _ in range(n)]


# Qwen2.5 shapes (hidden, MLP, layers, heads, KV heads, vocabulary as their config.json files say).
QWEN_SHAPES = {
    "qwen2.5-1.5b": dict(hidden_size=1536, intermediate_size=8960, num_hidden_layers=28, num_attention_heads=12,
                         num_key_value_heads=2, vocab_size=151936, tie_word_embeddings=True),
    "qwen2.5-7b": dict(hidden_size=3584, intermediate_size=18944, num_hidden_layers=28, num_attention_heads=28,
                       num_key_value_heads=4, vocab_size=152064, tie_word_embeddings=False),
}
SHAPES = ("smollm2", *QWEN_SHAPES)


def shape_config(shape: str):
    """The transformers config of ``shape`` (SmolLM2's packaged one, or a Qwen2 config built here)."""
    from transformers import AutoConfig, Qwen2Config

    from chatgym.trainer.models.packaged import load_model_path

    if shape == "smollm2":
        return AutoConfig.from_pretrained(load_model_path("smollm2"))
    return Qwen2Config(**QWEN_SHAPES[shape], max_position_embeddings=32768, rms_norm_eps=1e-6,
                       architectures=["Qwen2ForCausalLM"], torch_dtype="bfloat16")


def build_model(shape: str, real_weights: bool):
    import torch

    from chatgym.trainer.models.packaged import load_model
    from chatgym.trainer.models.random_init import random_model

    if real_weights:
        if shape != "smollm2":
            raise SystemExit("--real-weights: SmolLM2 only (the Qwen shapes are random weights)")
        return load_model("smollm2", dtype="bfloat16", device="cuda").eval()
    with torch.device("cuda"):  # initialised on the GPU: a 7B random init on the CPU takes minutes
        return random_model(shape_config(shape), dtype="bfloat16", device="cuda").eval()


ENGINE_MODES = {
    "static": {"decode": "static"},
    "static fp8": {"decode": "static", "quantization": "fp8"},
    "static fp8+head": {"decode": "static", "quantization": "fp8", "fp8_lm_head": True},
    "static compiled": {"decode": "static", "fused_step": "compiled"},
    "static fp8 compiled": {"decode": "static", "quantization": "fp8", "fused_step": "compiled"},
    # every speed option of the static path: compiled pieces, async scheduling, the philox sampler
    "static all": {"decode": "static", "fused_step": "compiled", "async_scheduling": True, "sampler": "philox"},
    "static fp8 all": {"decode": "static", "quantization": "fp8", "fused_step": "compiled", "async_scheduling": True,
                       "sampler": "philox"},
    "static fp8+head all": {"decode": "static", "quantization": "fp8", "fp8_lm_head": True, "fused_step": "compiled",
                            "async_scheduling": True, "sampler": "philox"},
    # with four decode steps a read-back of the sampled ids (engine.options.multi_step)
    "static all ms4": {"decode": "static", "fused_step": "compiled", "async_scheduling": True, "sampler": "philox",
                       "multi_step": 4},
    "static fp8 all ms4": {"decode": "static", "quantization": "fp8", "fused_step": "compiled",
                           "async_scheduling": True, "sampler": "philox", "multi_step": 4},
    "static fp8+head all ms4": {"decode": "static", "quantization": "fp8", "fp8_lm_head": True,
                                "fused_step": "compiled", "async_scheduling": True, "sampler": "philox",
                                "multi_step": 4},
    "async": {"decode": "static", "async_scheduling": True},
    "layers": {"decode": "static", "fused_step": False},
    "dynamic": {"decode": "dynamic"},
}


# The FP8 modes on vLLM's CUTLASS FP8 GEMM (CHATGYM_FP8_GEMM=cutlass: mode_env), and modes with the KV cache
# in e4m3 (engine.options.kv_cache_dtype: fp8): bf16 weights, FP8 weights.
ENGINE_MODES.update({f"{m} cutlass": ENGINE_MODES[m] for m in ("static fp8 all", "static fp8+head all")})
ENGINE_MODES.update({f"{m} kv8": {**ENGINE_MODES[m], "kv_cache_dtype": "fp8"}
                     for m in ("static fp8+head all", "static fp8+head all cutlass", "static all",
                               "static fp8+head all ms4")})


def mode_env(mode: str) -> dict[str, str]:
    """The environment a mode's engine runs in (the fused step reads CHATGYM_FP8_GEMM as it is built)."""
    return {"CHATGYM_FP8_GEMM": "cutlass"} if "cutlass" in mode.split() else {}


async def run_engine(engine, prompts, params) -> tuple[float, int]:
    t0, t1, tokens = await engine_span(engine, prompts, params)
    return t1 - t0, tokens


def run_generate(model, prompts, pad_id) -> tuple[float, int]:
    import torch

    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, p in enumerate(prompts):
        ids[i, width - len(p) :] = torch.tensor(p)
        mask[i, width - len(p) :] = 1
    ids, mask = ids.to(model.device), mask.to(model.device)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    out = model.generate(
        input_ids=ids,
        attention_mask=mask,
        max_new_tokens=NEW_TOKENS,
        min_new_tokens=NEW_TOKENS,
        do_sample=True,
        temperature=1.0,
        top_k=0,
        top_p=1.0,
        pad_token_id=pad_id,
    )
    torch.cuda.synchronize()
    return time.perf_counter() - t0, int((out.shape[1] - width) * out.shape[0])


def exactness(model, tokenizer) -> dict:
    """Greedy ids of static vs dynamic, and static logprobs vs a full forward pass (bf16)."""
    import torch

    from chatgym.trainer.engines import SamplingParams
    from chatgym.trainer.engines.hf import TransformersEngine

    prompts = make_prompts(8, model.config.vocab_size, 7)
    params = SamplingParams(max_tokens=32, temperature=0)
    res = {}
    for mode in ("static", "dynamic"):
        eng = TransformersEngine(model, tokenizer, decode=mode, eos_token_ids=[], max_model_len=512)
        res[mode] = asyncio.run(_gather(eng, prompts, params))
    same = sum(a.token_ids == b.token_ids for a, b in zip(res["static"], res["dynamic"], strict=True))
    worst = 0.0
    for p, c in zip(prompts, res["static"], strict=True):
        ids = torch.tensor([p + c.token_ids], device=model.device)
        with torch.no_grad():
            logits = model(ids).logits[0, len(p) - 1 : -1].float()
        ref = torch.log_softmax(logits, -1).gather(1, torch.tensor(c.token_ids, device=model.device)[:, None])[:, 0]
        worst = max(worst, float((ref - torch.tensor(c.logprobs, device=model.device)).abs().max()))
    return {"greedy_same_as_dynamic": f"{same}/{len(prompts)}", "max_abs_logprob_diff_vs_forward": worst}


def fp8_exactness(model, tokenizer) -> dict:
    """The FP8 engine's greedy ids against the bf16 static engine's, and its logprobs of its own greedy
    tokens against a bf16 forward pass (mean and max |difference|): the train/inference mismatch FP8 adds."""
    import torch

    from chatgym.trainer.engines import SamplingParams
    from chatgym.trainer.engines.hf import TransformersEngine

    prompts = make_prompts(8, model.config.vocab_size, 7)
    params = SamplingParams(max_tokens=32, temperature=0)
    res = {}
    for name, extra in (("bf16", {}), ("fp8", {"quantization": "fp8"})):
        eng = TransformersEngine(model, tokenizer, decode="static", eos_token_ids=[], max_model_len=512, **extra)
        res[name] = asyncio.run(_gather(eng, prompts, params))
    same = sum(a.token_ids == b.token_ids for a, b in zip(res["bf16"], res["fp8"], strict=True))
    diffs = []
    for p, c in zip(prompts, res["fp8"], strict=True):
        ids = torch.tensor([p + c.token_ids], device=model.device)
        with torch.no_grad():
            logits = model(ids).logits[0, len(p) - 1 : -1].float()
        ref = torch.log_softmax(logits, -1).gather(1, torch.tensor(c.token_ids, device=model.device)[:, None])[:, 0]
        diffs.append((ref - torch.tensor(c.logprobs, device=model.device)).abs())
    d = torch.cat(diffs)
    return {"fp8_greedy_same_as_bf16": f"{same}/{len(prompts)}", "fp8_logprob_vs_bf16_forward_mean": float(d.mean()),
            "fp8_logprob_vs_bf16_forward_max": float(d.max())}


class _NoText:
    """A tokenizer stand-in for vLLM on random weights: ids only (completion text empty)."""

    eos_token_id = None

    def decode(self, ids, **_):
        return ""


def raw_generate(eng, prompts: list[list[int]], params: list) -> tuple[float, int]:
    """(seconds, generated tokens) of vLLM's own ``LLM.generate`` on ``eng``'s engine (a
    :class:`~chatgym.trainer.engines.vllm_inproc.VLLMEngine`: the same ``vllm.LLM``, engine arguments
    and request parameters as its ``generate``), run on the engine's thread: vLLM offline, the
    reference the engine's own path is compared with."""
    t0, t1, tokens = raw_generate_span(eng, prompts, params)
    return t1 - t0, tokens


def raw_generate_span(eng, prompts: list[list[int]], params: list) -> tuple[float, float, int]:
    """:func:`raw_generate` as ``(start, end, tokens)`` on ``time.perf_counter``'s clock."""
    from chatgym.trainer.engines.vllm_params import to_vllm_params

    requests = [{"prompt_token_ids": p} for p in prompts]
    vparams = [to_vllm_params(p) for p in params]
    for v in vparams:  # a user's SamplingParams: vLLM deep-copies each at add_request (chatgym's engine skips it)
        v.skip_clone = False

    def run() -> tuple[float, float, int]:
        t0 = time.perf_counter()
        outs = eng.llm.generate(requests, vparams, use_tqdm=False)
        return t0, time.perf_counter(), sum(len(o.outputs[0].token_ids) for o in outs)

    return eng.call(run)


async def engine_span(engine, prompts, params) -> tuple[float, float, int]:
    """:func:`run_engine` as ``(start, end, tokens)`` on ``time.perf_counter``'s clock."""
    t0 = time.perf_counter()
    outs = await asyncio.gather(*(engine.generate(p, sp) for p, sp in zip(prompts, params, strict=True)))
    return t0, time.perf_counter(), sum(len(o.token_ids) for o in outs)


def step_timeline(eng) -> list[tuple[float, float]]:
    """Record ``(start, end)`` of every ``LLMEngine.step`` call on ``eng``'s engine, in the returned list:
    chatgym's engine thread and ``LLM.generate``'s loop both call it, so the same marks time both."""
    marks: list[tuple[float, float]] = []
    step = eng.engine.step

    def timed():
        t = time.perf_counter()
        try:
            return step()
        finally:
            marks.append((t, time.perf_counter()))

    eng.engine.step = timed
    return marks


def span_breakdown(t0: float, t1: float, marks: list[tuple[float, float]]) -> dict:
    """Where one round's wall clock went: ``steps`` (``LLMEngine.step`` calls), ``lead_ms`` (start to
    the first call: adding the requests), ``tail_ms`` (the last call's return to the end: handing the
    results back), ``between_ms`` (the time between calls: the loop around them, requests that join)
    and ``in_steps_ms`` (inside them: vLLM scheduling, the GPU, vLLM's output processing)."""
    if not marks:
        return {"steps": 0}
    inside = sum(b - a for a, b in marks)
    return {"steps": len(marks), "lead_ms": 1e3 * (marks[0][0] - t0), "tail_ms": 1e3 * (t1 - marks[-1][1]),
            "between_ms": 1e3 * (marks[-1][1] - marks[0][0] - inside), "in_steps_ms": 1e3 * inside}


def vllm_child(spec: dict) -> dict:
    """One vLLM engine (in its own process) for every batch size of ``spec["batches"]``: per batch
    size, tokens/s over ``spec["repeats"]`` rounds after a warm-up round, through chatgym's engine
    (``generate``, the path training takes) and through vLLM's own ``LLM.generate`` on the same engine
    (:func:`raw_generate`). The two alternate round by round (a drift of the GPU's clocks over the
    run then reaches both), and each round's step timeline (:func:`span_breakdown`, the median round's)
    says where the time between them went."""
    from chatgym.trainer.chat.tokenizer import get_tokenizer
    from chatgym.trainer.engines import SamplingParams
    from chatgym.trainer.engines.vllm_inproc import VLLMEngine
    from chatgym.trainer.models.packaged import load_model_path

    real = spec["real_weights"]
    extra = {} if spec["quantization"] is None else {"quantization": spec["quantization"]}
    extra.update(spec.get("options") or {})
    if real:
        path, tokenizer = load_model_path("smollm2"), get_tokenizer("smollm2")
    else:  # the shape's config only; vLLM draws the weights (load_format="dummy")
        path, tokenizer = tempfile.mkdtemp(prefix="vllm-shape-"), _NoText()
        shape_config(spec["shape"]).save_pretrained(path)
        extra.update(load_format="dummy", skip_tokenizer_init=True)
    # the variant's options last: they may replace these defaults too
    kwargs = {"dtype": "bfloat16", "max_model_len": 512, "gpu_memory_utilization": 0.5,
              "max_num_seqs": max(spec["batches"]), **extra}
    eng = VLLMEngine(str(path), tokenizer, **kwargs)
    marks = step_timeline(eng)
    vocab = shape_config(spec["shape"]).vocab_size
    out = {}
    for batch in spec["batches"]:
        prompts = make_prompts(batch, vocab, batch)
        params = [SamplingParams(max_tokens=NEW_TOKENS, temperature=1.0, seed=i) for i in range(batch)]
        short = [SamplingParams(max_tokens=SHORT_TOKENS, temperature=1.0, seed=i) for i in range(batch)]
        paths = {str(batch): (lambda p, s: asyncio.run(engine_span(eng, p, s)), params),
                 f"raw {batch}": (lambda p, s: raw_generate_span(eng, p, s), params)}
        if spec.get("decode_only"):
            paths[f"short {batch}"] = (lambda p, s: asyncio.run(engine_span(eng, p, s)), short)
        rounds: dict[str, list] = {key: [] for key in paths}
        for _ in range(1 + spec["repeats"]):  # round 0: warm-up
            for key, (run, sp) in paths.items():
                marks.clear()
                t0, t1, tokens = run(prompts, sp)
                rounds[key].append((t1 - t0, tokens, span_breakdown(t0, t1, marks)))
        for key, (first, *timed) in rounds.items():
            if key.startswith("short"):
                continue
            median = sorted(timed, key=lambda r: r[0])[len(timed) // 2]
            out[key] = {"dt": median[0], "tokens": median[1], "first": first[0], "timeline": median[2]}
        if spec.get("decode_only"):  # round by round, the full requests' time less the cut ones'
            diffs = [a[0] - b[0] for a, b in zip(rounds[str(batch)][1:], rounds[f"short {batch}"][1:], strict=True)]
            out[str(batch)]["decode_dt"] = statistics.median(diffs)
    asyncio.run(eng.close())
    return out


def run_vllm(shape: str, batches: list[int], repeats: int, real_weights: bool, quantization: str | None,
             options: dict | None = None, label: str | None = None, decode_only: bool = False) -> dict:
    """``{batch: (seconds, tokens, first round's seconds)}`` from one vLLM process through chatgym's
    engine, and ``{"raw <batch>": ...}`` through vLLM's ``LLM.generate`` on the same engine.
    ``options``: more engine options for that process; ``label`` names it in the printed lines
    (default: the quantization, or ``bf16``)."""
    label = label or quantization or "bf16"
    spec = {"shape": shape, "batches": list(batches), "repeats": repeats, "real_weights": real_weights,
            "quantization": quantization, "options": options or {}, "decode_only": decode_only}
    out = subprocess.run([sys.executable, __file__, "--vllm-child", json.dumps(spec)], capture_output=True,
                         text=True)
    if out.returncode != 0:
        print(out.stderr[-3000:], file=sys.stderr)
        raise SystemExit(f"vLLM {label} failed (rc {out.returncode})")
    r = json.loads(out.stdout.strip().splitlines()[-1])
    for b, v in r.items():
        print(f"{shape:12s} batch {b:>8s}  vllm {label} timeline "
              + "  ".join(f"{k} {x:.1f}" if isinstance(x, float) else f"{k} {x}" for k, x in v["timeline"].items()),
              flush=True)
    return {(b if b.startswith("raw") else int(b)): (v["dt"], v["tokens"], v["first"], v.get("decode_dt"))
            for b, v in r.items()}


async def _gather(engine, prompts, params):
    try:
        return await asyncio.gather(*(engine.generate(p, params) for p in prompts))
    finally:
        await engine.close()


class DefaultsHelp(argparse.ArgumentDefaultsHelpFormatter):
    """Each option's default in its help, but none for a default of None (its help says what it is)."""

    def _get_help_string(self, action):
        return action.help if action.default is None else super()._get_help_string(action)


def parse_args():
    # allow_abbrev=False: "--seed -1" read as --seeded with a stray "-1" (fresh-user walk).
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0], formatter_class=DefaultsHelp, allow_abbrev=False)
    ap.add_argument("--batch", type=int, nargs="+", default=[64, 256], help="rows decoded at once, each a run")
    ap.add_argument("--repeats", type=int, default=3, help="timed rounds a mode (median), after a warm-up round")
    ap.add_argument("--real-weights", action="store_true", help="SmolLM2's packaged weights (--shape smollm2 only)")
    ap.add_argument("--shape", nargs="+", default=["smollm2"], choices=SHAPES, help="model shapes (random weights)")
    ap.add_argument("--skip-generate", action="store_true", help="leave out model.generate (slow at 7B)")
    ap.add_argument("--seeded", action="store_true", help="a seed per request (the trainer's way)")
    modes = [m for m in ENGINE_MODES if "fp8" not in m and "kv8" not in m]  # FP8 of any kind: asked for by name
    ap.add_argument("--modes", nargs="+", choices=list(ENGINE_MODES), metavar="MODE",
                    help=f"the engine's modes, each quoted when it has spaces ('static all'): {', '.join(ENGINE_MODES)}; "
                    f"default: {', '.join(modes)} (with --fp8 also 'static fp8' and 'static fp8+head')")
    ap.add_argument("--fp8", action="store_true", help="vLLM fp8 with --vllm, FP8/bf16 ratios; without --modes "
                    "also 'static fp8' and 'static fp8+head'")
    ap.add_argument("--vllm", action="store_true", help="also the in-process vLLM engine (bf16; fp8 with --fp8)")
    ap.add_argument("--decode-only", action="store_true", help=f"also decode tokens/s, beside the whole runs': every "
                    f"round also runs the requests cut to {SHORT_TOKENS} new tokens (about twice the time), and "
                    f"rows x {NEW_TOKENS - SHORT_TOKENS} over the difference is the rate of decode steps "
                    f"{SHORT_TOKENS + 1}-{NEW_TOKENS} alone (no prefill); for the engine modes and chatgym's vLLM "
                    "engine, not model.generate or LLM.generate")
    ap.add_argument("--interleave", action="store_true", help="build every engine mode first, then run each "
                    "round through every mode in turn (the device's drift cancels in their ratios; all the modes' "
                    "engines held at once)")
    ap.add_argument("--vllm-variants", nargs="+", metavar="NAME=JSON", type=vllm_variant,
                    help="vLLM alone, a process a variant: NAME=a JSON object of engine options")
    ap.add_argument("--vllm-ratios", nargs="+", metavar="A/B", default=[],
                    help="more tokens/s ratios of two variants (besides each fp8* over its bf16* twin)")
    ap.add_argument("--vllm-child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    names = [name for name, _ in args.vllm_variants or ()]
    if len(set(names)) < len(names):
        ap.error(f"--vllm-variants: a name given twice in {names}")
    for ratio in args.vllm_ratios:
        if ratio.count("/") != 1 or not set(ratio.split("/")) <= set(names) or len(set(ratio.split("/"))) < 2:
            ap.error(f"--vllm-ratios: {ratio!r} is not A/B of two --vllm-variants names {names}")
    if args.vllm_variants:  # they run vLLM alone, a process a variant: the engine's options would do nothing
        ignored = [f"--{o.replace('_', '-')}" for o in ("modes", "fp8", "seeded", "skip_generate", "vllm")
                   if getattr(args, o) not in (None, False)]
        if ignored:
            ap.error(f"--vllm-variants runs vLLM alone, a process a variant; {', '.join(ignored)} would do nothing there")
    if min(args.batch) < 1 or args.repeats < 1:
        ap.error(f"--batch and --repeats must be >= 1, got {args.batch} and {args.repeats}")
    if args.modes is not None and len(set(args.modes)) < len(args.modes):
        ap.error(f"--modes: a mode given twice in {args.modes}")
    if args.interleave and args.vllm_variants:
        ap.error("--interleave runs the engine modes round by round; --vllm-variants runs vLLM alone, a process a variant")
    if args.real_weights and args.shape != ["smollm2"]:
        ap.error("--real-weights: only SmolLM2's weights are packaged (--shape smollm2)")
    if args.modes is None:  # modes given are run as given (--fp8 added three more to them: lease time)
        args.modes = modes + (["static", "static fp8", "static fp8+head"] if args.fp8 else [])
        args.modes = list(dict.fromkeys(args.modes))
    return args


def vllm_variant(text: str) -> tuple[str, dict]:
    """``NAME=JSON`` (``--vllm-variants``) as ``(NAME, options)``; argparse reports the error."""
    name, sep, raw = text.partition("=")
    if not sep or not name or not all(c.isalnum() or c in "_.+-" for c in name):
        raise argparse.ArgumentTypeError(f"{text!r}: NAME=JSON, NAME of letters, digits and _.+-")
    try:
        options = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(f"{name}: not JSON ({exc})") from None
    if not isinstance(options, dict):
        raise argparse.ArgumentTypeError(f"{name}: the options must be a JSON object, got {raw!r}")
    return name, options


def bench_vllm_variants(args, shape: str) -> list[str]:
    """``--vllm-variants``: each variant's vLLM process at every batch size; returns the printed rows."""
    per_batch: dict = {}
    for name, options in args.vllm_variants:
        add_vllm_results(per_batch, shape, args.batch, args.repeats, args.real_weights, None, options, name,
                         args.decode_only)
    rows = []
    for batch, results in per_batch.items():
        rows += report(shape, batch, results, [tuple(r.split("/")) for r in args.vllm_ratios])
    return rows


def make_engine(model, tokenizer, mode: str, rows: int):
    """``mode``'s engine (:data:`ENGINE_MODES`) for ``rows`` rows at once, built in the mode's environment
    (:func:`mode_env`), as every benchmark here builds it (no EOS: every row runs to its token limit)."""
    from chatgym.trainer.engines.hf import TransformersEngine

    with mock.patch.dict(os.environ, mode_env(mode)):
        return TransformersEngine(model, tokenizer, max_batch_size=rows, eos_token_ids=[], max_model_len=512,
                                  **ENGINE_MODES[mode])


def time_engine(model, tokenizer, mode: str, prompts, params, repeats: int, decode_only: bool = False) -> tuple:
    """``(median seconds, tokens, first round's seconds, decode seconds)`` of ``mode``'s engine; decode
    seconds (``decode_only``: each round also runs the requests cut to :data:`SHORT_TOKENS`) the median
    over rounds of the full requests' time less the cut ones', else None."""
    return time_engines_interleaved(model, tokenizer, [mode], prompts, params, repeats, decode_only,
                                    show_rounds=False)[f"engine {mode}"]


def time_engines_interleaved(model, tokenizer, modes: list[str], prompts, params, repeats: int,
                             decode_only: bool = False, show_rounds: bool = True) -> dict:
    """:func:`time_engine`'s tuple for every mode, ``"engine <mode>"`` -> tuple, with every mode's engine
    built (and warmed up) first and each round running every mode in turn (``--interleave``): a drift of
    the device's speed over the minutes a mode's rounds take then reaches every mode alike, so it cancels
    in their ratios where one mode's rounds after another's do not. Prints each mode's rounds' decode
    seconds (``decode_only`` and ``show_rounds``), the spread a ratio is read against."""
    import dataclasses

    short = [dataclasses.replace(p, max_tokens=SHORT_TOKENS) for p in params]
    engines, firsts, runs, diffs = {}, {}, {m: [] for m in modes}, {m: [] for m in modes}

    def timed(mode, requests):
        with mock.patch.dict(os.environ, mode_env(mode)):
            return asyncio.run(run_engine(engines[mode], prompts, requests))

    try:
        for m in modes:
            engines[m] = make_engine(model, tokenizer, m, len(prompts))
            firsts[m] = timed(m, params)[0]
            if decode_only:
                timed(m, short)  # its warm-up
        for _ in range(repeats):
            for m in modes:
                runs[m].append(timed(m, params))
                if decode_only:
                    diffs[m].append(runs[m][-1][0] - timed(m, short)[0])
    finally:  # the engines built so far, also when a later one fails to build; none referenced by the empty
        while engines:  # in the order built
            asyncio.run(engines.pop(next(iter(engines))).close())
        _empty_cache()
    for m in modes:
        if decode_only and show_rounds:
            print(f"decode rounds, {len(prompts)} rows, engine {m}: "
                  + " ".join(f"{1000 * d:.1f}" for d in diffs[m]) + " ms", flush=True)
    return {f"engine {m}": (statistics.median(t for t, _ in runs[m]), runs[m][-1][1], firsts[m],
                            statistics.median(diffs[m]) if decode_only else None) for m in modes}


def _empty_cache() -> None:
    import torch

    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def bench_shape(args, shape: str) -> list[str]:
    """Every mode at every batch size for one model shape; returns the printed rows."""
    import torch

    from chatgym.trainer.chat.tokenizer import get_tokenizer
    from chatgym.trainer.engines import SamplingParams

    tokenizer = get_tokenizer("smollm2")
    model = build_model(shape, args.real_weights)
    print(f"{shape}: {torch.cuda.get_device_name()} torch {torch.__version__}", flush=True)
    print("exactness:", exactness(model, tokenizer), flush=True)
    if args.fp8:
        print("fp8:", fp8_exactness(model, tokenizer), flush=True)
    per_batch = {}
    for batch in args.batch:
        prompts = make_prompts(batch, model.config.vocab_size, batch)
        params = [SamplingParams(max_tokens=NEW_TOKENS, temperature=1.0, seed=i if args.seeded else None)
                  for i in range(batch)]
        if args.interleave:
            results = time_engines_interleaved(model, tokenizer, args.modes, prompts, params, args.repeats,
                                               args.decode_only)
        else:
            results = {f"engine {m}": time_engine(model, tokenizer, m, prompts, params, args.repeats, args.decode_only)
                       for m in args.modes}
        if not args.skip_generate:
            first, _ = run_generate(model, prompts, 0)
            times = [run_generate(model, prompts, 0) for _ in range(args.repeats)]
            results["generate"] = (statistics.median(t for t, _ in times), times[0][1], first, None)
        per_batch[batch] = results
    if args.vllm:
        del model  # vLLM's own copy takes the GPU (one process per dtype, every batch size in it)
        torch.cuda.empty_cache()
        for q in (None, "fp8") if args.fp8 else (None,):
            add_vllm_results(per_batch, shape, args.batch, args.repeats, args.real_weights, q,
                             decode_only=args.decode_only)
    rows = []
    for batch, results in per_batch.items():
        rows += report(shape, batch, results)
    return rows


def add_vllm_results(per_batch: dict, shape: str, batches: list[int], repeats: int, real_weights: bool,
                     quantization: str | None, options: dict | None = None, label: str | None = None,
                     decode_only: bool = False) -> None:
    """One vLLM process's results (:func:`run_vllm`) into ``per_batch[batch]``: ``vllm <q>`` (chatgym's
    engine) and ``vllm <q> LLM.gen`` (vLLM's own ``LLM.generate`` on the same engine); ``q`` is
    ``label`` when given, else the quantization (``bf16`` for none)."""
    q = label or quantization or "bf16"
    for batch, r in run_vllm(shape, batches, repeats, real_weights, quantization, options, q, decode_only).items():
        if isinstance(batch, str):  # "raw <batch>"
            per_batch.setdefault(int(batch.split()[1]), {})[f"vllm {q} LLM.gen"] = r
        else:
            per_batch.setdefault(batch, {})[f"vllm {q}"] = r


def report(shape: str, batch: int, results: dict, ratios: list[tuple[str, str]] = ()) -> list[str]:
    """Print and return one batch size's rows: each result's tokens/s and ms a decode step against the
    first (``generate`` when present), chatgym's vLLM engine over ``LLM.generate`` per vLLM process,
    the FP8/bf16 pairs present, and ``ratios`` (variant names ``(a, b)``: ``vllm a`` over ``vllm b``)."""
    base_name = "generate" if "generate" in results else next(iter(results))
    base = results[base_name]
    rows = []
    for name, (dt, toks, first, decode_dt) in results.items():
        decode = "" if decode_dt is None else f"  decode {batch * (NEW_TOKENS - SHORT_TOKENS) / decode_dt:10,.0f} tok/s"
        rows.append(
            f"{shape:12s} batch {batch:4d}  {name:17s} {toks / dt:10,.0f} tok/s  {1000 * dt / NEW_TOKENS:7.2f} ms/step"
            f"  first {first:6.2f} s  x{(toks / dt) / (base[1] / base[0]):.2f} vs {base_name}{decode}"
        )
    pairs = (("engine static fp8", "engine static"), ("engine static fp8+head", "engine static"),
             ("engine static fp8 compiled", "engine static compiled"), ("engine static fp8 all", "engine static all"),
             ("engine static fp8+head all", "engine static all"), ("engine static fp8 all cutlass", "engine static all"),
             ("engine static fp8+head all cutlass", "engine static all"), ("engine static fp8+head all kv8", "engine static all"),
             ("engine static fp8+head all cutlass kv8", "engine static all"), ("engine static all kv8", "engine static all"),
             ("engine static fp8 all ms4", "engine static all ms4"), ("engine static fp8+head all ms4", "engine static all ms4"),
             ("engine static fp8+head all ms4 kv8", "engine static all ms4"), ("vllm fp8", "vllm bf16"))
    labels = [name[5:] for name in results if name.startswith("vllm ") and not name.endswith(" LLM.gen")]
    pairs += tuple((f"vllm {q}", f"vllm bf16{q[3:]}") for q in labels if q.startswith("fp8") and q != "fp8")
    for q in labels:  # chatgym's vLLM engine (auto's pick above 3 B) against vLLM's own loop
        ours, raw = f"vllm {q}", f"vllm {q} LLM.gen"
        if raw in results:
            (d1, t1, *_), (d2, t2, *_) = results[ours], results[raw]
            rows.append(f"{shape:12s} batch {batch:4d}  chatgym's vLLM engine / vLLM LLM.generate ({q}) x{(t1 / d1) / (t2 / d2):.3f}")
    for fp8, bf16 in pairs:
        if fp8 in results and bf16 in results:
            (d8, t8, _, dd8), (d16, t16, _, dd16) = results[fp8], results[bf16]
            decode = "" if dd8 is None or dd16 is None else f"  decode x{dd16 / dd8:.3f}"
            rows.append(f"{shape:12s} batch {batch:4d}  FP8/bf16 {fp8:22s} x{(t8 / d8) / (t16 / d16):.3f}{decode}")
    for a, b in ratios:
        if f"vllm {a}" in results and f"vllm {b}" in results:
            (da, ta, _, dda), (db, tb, _, ddb) = results[f"vllm {a}"], results[f"vllm {b}"]
            decode = "" if dda is None or ddb is None else f"  decode x{ddb / dda:.3f}"
            rows.append(f"{shape:12s} batch {batch:4d}  vllm {a} / vllm {b} x{(ta / da) / (tb / db):.3f}{decode}")
    for row in rows:
        print(row, flush=True)
    return rows


def main() -> None:
    import torch

    args = parse_args()
    if args.vllm_child:  # one vLLM run, in its own process: prints its JSON
        print(json.dumps(vllm_child(json.loads(args.vllm_child))))
        return
    if not torch.cuda.is_available():
        raise SystemExit("hf_decode_gpu.py needs CUDA")
    summary(args.shape, [bench_vllm_variants(args, shape) if args.vllm_variants else bench_shape(args, shape)
                         for shape in args.shape])


def summary(shapes: list[str], rows: list[list[str]]) -> None:
    """Every shape's rows again at the end, after a ``summary`` line, where several shapes ran (each
    shape's rows are printed as it finishes, :func:`report`; one shape's would only repeat them)."""
    if len(shapes) > 1:
        print("summary:\n" + "\n".join(row for shape_rows in rows for row in shape_rows), flush=True)


if __name__ == "__main__":
    main()
