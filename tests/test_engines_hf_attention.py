"""The decode step's Triton attention (trainer/engines/hf_attention.py), run on the CPU in Triton's
interpreter: it writes each row's key and value at its position and gives ``scaled_dot_product_attention``
over the row's columns up to that position (the default path's call, written independently here); the
fused step with it gives the logits of full forward passes of the model, rows leaving included; which
attention a step takes, and the override's refusals. ``-m gpu``: the compiled kernel in bf16 against
SDPA, and an engine whose ids do not depend on the choice."""

from __future__ import annotations

import asyncio

import pytest
import torch
import torch.nn.functional as F
from test_engines_hf_fused import ATOL, decode_sequence, full_forward_logits, tiny
from transformers import LlamaConfig, Qwen2Config, Qwen3Config
from triton_helpers import run_interpreted

from chatgym.trainer.engines import hf_attention, hf_options
from chatgym.trainer.engines.hf_static import StaticSlots

INTERPRETED_TESTS = 17  # the tests whose names hold "interpreted" (1 + 3 parametrized + 3 of the FP8 KV cache
# + 4 parametrized + 1 from the raw q/k/v + 2 parametrized on FP8 weights + 3 parametrized launches)


def test_the_kernel_tests_pass_in_tritons_interpreter():
    run_interpreted(__file__, INTERPRETED_TESTS)


def reference(qk, v, k_cache, v_cache, positions, heads, scale):
    """The default step's attention: write the new key/value at each row's position, then SDPA over the
    columns up to it (masked), each key/value head's query heads as its queries."""
    n, kv_heads, d = v.shape
    rows = torch.arange(n)
    k_cache[rows, :, positions] = qk[:, heads:]
    v_cache[rows, :, positions] = v
    width = int(positions.max()) + 1
    mask = torch.zeros((n, 1, 1, width), dtype=qk.dtype, device=qk.device)
    mask.masked_fill_((torch.arange(width, device=qk.device) > positions[:, None])[:, None, None, :], float("-inf"))
    out = F.scaled_dot_product_attention(qk[:, :heads].reshape(n, kv_heads, heads // kv_heads, d),
                                         k_cache[:n, :, :width], v_cache[:n, :, :width], attn_mask=mask, scale=scale)
    return out.reshape(n, heads, d)


def compare(heads, kv_heads, d, positions, dtype=torch.float32, device="cpu", atol=2e-6):
    g = torch.Generator(device=device).manual_seed(heads * 100 + d)
    n, max_len = len(positions), max(positions) + 9
    qk = torch.randn(n, heads + kv_heads, d, generator=g, device=device).to(dtype)
    v = torch.randn(n, kv_heads, d, generator=g, device=device).to(dtype)
    k_cache = torch.randn(n + 2, kv_heads, max_len, d, generator=g, device=device).to(dtype)
    v_cache = torch.randn(n + 2, kv_heads, max_len, d, generator=g, device=device).to(dtype)
    pos = torch.tensor(positions, device=device)
    k_ref, v_ref = k_cache.clone(), v_cache.clone()
    want = reference(qk, v, k_ref, v_ref, pos, heads, d**-0.5)
    got = hf_attention.decode(qk[:, :heads], qk[:, heads:], v, k_cache, v_cache, pos, d**-0.5)
    assert got.shape == (n, heads, d) and got.dtype == dtype
    torch.testing.assert_close(got.float(), want.float(), atol=atol, rtol=0)
    assert torch.equal(k_cache, k_ref) and torch.equal(v_cache, v_ref)  # the new column, nothing else


def test_interpreted_kernel_gives_sdpa_over_each_rows_columns_and_writes_the_cache(interpreted):
    # Positions at 0 (only the new column), around a block's end and past two blocks.
    edges = [0, 1, hf_attention.BLOCK - 1, hf_attention.BLOCK, hf_attention.BLOCK + 1, 2 * hf_attention.BLOCK + 7]
    compare(9, 3, 64, edges)  # SmolLM2's heads: groups of 3, padded to 16 query rows
    compare(28, 4, 128, [5, 70])  # Qwen2.5-7B's: groups of 7
    compare(4, 4, 16, [3, 40])  # no grouping


def compare_from_qkv(heads, kv_heads, d, positions, scaled, bias, fp8_cache=False):
    """:func:`hf_attention.decode_qkv` against its pieces run apart (float32): the unit GEMM's scales
    (``hf_fp8.dequantize_out``), the bias, RoPE (``hf_elementwise.rope``), then :func:`reference`."""
    from chatgym.trainer.engines import hf_elementwise, hf_fp8

    g = torch.Generator().manual_seed(heads + d)
    n, max_len, width = len(positions), max(positions) + 9, (heads + 2 * kv_heads) * d
    qkv = torch.randn(n, width, generator=g)
    a = torch.rand(n, 1, generator=g) + 0.5 if scaled else None
    s = torch.rand(1, width, generator=g) + 0.5 if scaled else None
    b = torch.randn(width, generator=g) if bias else None
    angle = torch.rand(n, 1, d // 2, generator=g) * 6
    cos = torch.cat((angle.cos(), angle.cos()), dim=-1)
    sin = torch.cat((-angle.sin(), angle.sin()), dim=-1)  # the signed sin' of hf_fused
    k_cache = torch.randn(n + 1, kv_heads, max_len, d, generator=g)
    v_cache = torch.randn(n + 1, kv_heads, max_len, d, generator=g)
    if fp8_cache:
        k_cache, v_cache = k_cache.to(torch.float8_e4m3fn), v_cache.to(torch.float8_e4m3fn)
    pos = torch.tensor(positions)
    x = hf_fp8.dequantize_out(qkv, a, s) if scaled else qkv
    x = x + b if bias else x
    split = (heads + kv_heads) * d
    qk = hf_elementwise.rope(x[:, :split].view(n, heads + kv_heads, d), cos, sin)
    v = x[:, split:].view(n, kv_heads, d)
    if fp8_cache:  # against decode() of the pieces' q/k/v on the same e4m3 cache: the same e4m3 casts (the
        # interpreter's truncate where a GPU rounds, so the SDPA reference of float32 casts would not match)
        k_ref, v_ref = k_cache.clone(), v_cache.clone()
        want = hf_attention.decode(qk[:, :heads], qk[:, heads:], v, k_ref, v_ref, pos, d**-0.5)
    else:
        k_ref, v_ref = k_cache.clone(), v_cache.clone()
        want = reference(qk, v, k_ref, v_ref, pos, heads, d**-0.5)
    got = hf_attention.decode_qkv(qkv, heads, k_cache, v_cache, pos, d**-0.5, cos, sin, a, s, b)
    torch.testing.assert_close(got, want, atol=2e-5, rtol=0)
    torch.testing.assert_close(k_cache.float(), k_ref.float(), atol=2e-5, rtol=0)
    torch.testing.assert_close(v_cache.float(), v_ref.float(), atol=2e-5, rtol=0)


@pytest.mark.parametrize(("scaled", "bias"), [(False, False), (True, False), (False, True), (True, True)])
def test_interpreted_kernel_from_the_raw_qkv_gives_its_pieces_run_apart(interpreted, scaled, bias):
    compare_from_qkv(9, 3, 64, [0, 1, hf_attention.BLOCK, 2 * hf_attention.BLOCK + 7], scaled, bias)
    compare_from_qkv(28, 4, 128, [5, 70], scaled, bias)


def test_interpreted_kernel_from_the_raw_qkv_on_an_fp8_cache(interpreted):
    compare_from_qkv(28, 4, 128, [5, 70], True, True, fp8_cache=True)


def test_decode_qkv_refuses_half_the_scales_and_a_wrong_width():
    k_cache = torch.zeros(2, 2, 8, 16)
    qkv, pos, cos = torch.zeros(2, 6 * 16), torch.zeros(2, dtype=torch.long), torch.ones(2, 16)
    with pytest.raises(ValueError, match=r"^decode_qkv: the unit GEMM's scales come together \(a and s\)$"):
        hf_attention.decode_qkv(qkv, 2, k_cache, k_cache, pos, 0.25, cos, cos, a=torch.ones(2, 1))
    with pytest.raises(ValueError, match=r"^decode_qkv: qkv must be \(n, 96\), got \(2, 80\)$"):
        hf_attention.decode_qkv(torch.zeros(2, 80), 2, k_cache, k_cache, pos, 0.25, cos, cos)


def test_an_e4m3_value_cache_of_odd_strides_is_refused():
    # bf16 queries read an e4m3 value cache in 16-bit pairs: a column stride of 17 bytes would split pairs
    # across columns, so it is refused before any launch (here a CPU, where no kernel could run).
    # An odd start (walk: the message then named only even strides) is refused too, and names its offset.
    cache = torch.zeros(2, 2, 8, 17, dtype=torch.float8_e4m3fn)[..., :16]
    q, k = torch.zeros(2, 4, 16, dtype=torch.bfloat16), torch.zeros(2, 2, 16, dtype=torch.bfloat16)
    pos = torch.zeros(2, dtype=torch.long)
    with pytest.raises(ValueError, match=r"^decode attention: an e4m3 value cache is read in 16-bit pairs: its start "
                       r"and its slot, head and column strides must be even \(bytes\), got start offset 0 and "
                       r"strides \(272, 136, 17\)$"):
        hf_attention.decode(q, k, k, cache, cache, pos, 0.25)
    shifted = torch.zeros(2 * 2 * 8 * 16 + 1, dtype=torch.float8_e4m3fn)[1:].view(2, 2, 8, 16)
    with pytest.raises(ValueError, match=r"got start offset 1 and strides \(256, 128, 16\)$"):
        hf_attention.decode(q, k, k, shifted, shifted, pos, 0.25)


def test_caches_of_two_dtypes_are_refused():
    # Regression (second walk): an e4m3 key cache beside a bf16 value cache was read as e4m3 pairs, its
    # values wrong by up to 91 against the reference, with no error.
    k_cache = torch.zeros(2, 2, 8, 16, dtype=torch.float8_e4m3fn)
    q, k = torch.zeros(2, 4, 16, dtype=torch.bfloat16), torch.zeros(2, 2, 16, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match=r"^decode attention: the caches must share a dtype, got "
                       r"torch.float8_e4m3fn and torch.bfloat16$"):
        hf_attention.decode(q, k, k, k_cache, k_cache.to(torch.bfloat16), torch.zeros(2, dtype=torch.long), 0.25)


@pytest.fixture
def launch_override(monkeypatch):
    """Set CHATGYM_DECODE_ATTENTION_CONFIG for a test (read once a process: the cache is cleared around it)."""
    def set_config(value):
        monkeypatch.setenv("CHATGYM_DECODE_ATTENTION_CONFIG", value)
        hf_attention._launch_configs.cache_clear()
    yield set_config
    monkeypatch.delenv("CHATGYM_DECODE_ATTENTION_CONFIG", raising=False)
    hf_attention._launch_configs.cache_clear()


@pytest.mark.parametrize("config", ["16,4,2", "128,8,1", "model=32,2,1;fp8=16,1,3"])
def test_interpreted_kernel_gives_the_same_attention_with_other_launches(interpreted, launch_override, config):
    launch_override(config)
    compare(28, 4, 128, [5, 70, 200])  # positions inside, at and past blocks of 16, 32 and 128
    compare_from_qkv(9, 3, 64, [0, 33, 130], True, True, fp8_cache=True)


def test_the_launch_config_reads_the_override_and_refuses_bad_values(launch_override):
    launch_override("")
    assert (hf_attention.launch_config(False), hf_attention.launch_config(True)) == (hf_attention.LAUNCH["model"],
                                                                                      hf_attention.LAUNCH["fp8"])
    launch_override("32,2,2")
    assert (hf_attention.launch_config(False), hf_attention.launch_config(True)) == ((32, 2, 2), (32, 2, 2))
    launch_override("model=128,8,1;fp8=16,4,2")
    assert (hf_attention.launch_config(False), hf_attention.launch_config(True)) == ((128, 8, 1), (16, 4, 2))
    launch_override("model = 32,4,3; fp8=16,4,2")  # second walk: spaces around keys were refused
    assert (hf_attention.launch_config(False), hf_attention.launch_config(True)) == ((32, 4, 3), (16, 4, 2))
    launch_override("fp8=16,4,2")  # the other keeps its default
    assert (hf_attention.launch_config(False), hf_attention.launch_config(True)) == (hf_attention.LAUNCH["model"],
                                                                                      (16, 4, 2))
    # Fresh-user walk: a key named twice was taken silently (the last won), and BLOCK had no upper bound.
    for bad, message in (("32,4", "'32,4' is not BLOCK,WARPS,STAGES"), ("30,4,2", "'30,4,2': BLOCK a power of two"),
                         ("64,3,2", "WARPS 1, 2, 4 or 8"), ("64,4,0", "STAGES 1 to 3"), ("64,4,4", "STAGES 1 to 3"),
                         ("bf16=64,4,2", "must be 'BLOCK,WARPS,STAGES' or"), ("64,4,2;fp8=64,4,2", "must be"),
                         ("model=32,4,3;model=64,4,2", "a cache named twice"), ("256,4,2", "from 16 to 128"),
                         ("1048576,8,3", "from 16 to 128")):
        launch_override(bad)
        with pytest.raises(ValueError, match=r"^CHATGYM_DECODE_ATTENTION_CONFIG"):
            hf_attention.launch_config(False)
        with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
            hf_attention.launch_config(False)


def test_config_load_refuses_a_malformed_launch_override_before_any_model_loads(launch_override):
    """Read at the first decode step's launch, inside the engine's worker: without this check a bad value
    would fail every episode of a run (as CHATGYM_FP8_GEMM once did: tests/test_engines_hf_draw.py)."""
    from chatgym.trainer.config.loader import ConfigError
    from chatgym.trainer.engines import check_engine_options

    launch_override("64,4")
    with pytest.raises(ConfigError, match=r"^CHATGYM_DECODE_ATTENTION_CONFIG: '64,4' is not BLOCK,WARPS,STAGES"):
        check_engine_options("hf", {"decode": "static"}, "engine.options")
    check_engine_options("hf", {"decode": "static", "fused_step": False}, "engine.options")  # no fused step
    launch_override("64,4,2")
    check_engine_options("hf", {"decode": "static"}, "engine.options")


def e4m3_values(shape, g):
    """float32 values e4m3 holds exactly, none subnormal (Triton's interpreter flushes those to 0 where a
    GPU keeps them), signs and sizes of randn's."""
    x = torch.randn(shape, generator=g)
    x = torch.sign(x) * x.abs().clamp_min(2**-6)
    return x.to(torch.float8_e4m3fn).float()


def compare_fp8_cache(heads, kv_heads, d, positions, dtype=torch.float32, device="cpu"):
    """The kernel on an e4m3 cache: the new key/value saturated at +-448 and stored in e4m3 (exactly, as
    these values are e4m3's), attention over the stored columns: SDPA in float32 over the cache widened to
    float32, with the saturated new column written first. float32 queries: float32 products, to 2e-6;
    bf16 queries (e4m3's values are bf16's too): the kernel's fp16 products and bf16 output, to 1e-2."""
    g = torch.Generator().manual_seed(heads * 10 + d)
    n, max_len = len(positions), max(positions) + 9
    qk = torch.randn(n, heads + kv_heads, d, generator=g).to(dtype).float()
    k_new, v = e4m3_values((n, kv_heads, d), g), e4m3_values((n, kv_heads, d), g)
    k_new[0, 0, :3] = torch.tensor([1000.0, -600.0, 448.0])  # beyond e4m3's range: saturated
    v[-1, -1, -2:] = torch.tensor([-1e4, 500.0])
    qk[:, heads:] = k_new
    k_cache = e4m3_values((n + 2, kv_heads, max_len, d), g).to(torch.float8_e4m3fn)
    v_cache = e4m3_values((n + 2, kv_heads, max_len, d), g).to(torch.float8_e4m3fn)
    pos = torch.tensor(positions)
    k_ref, v_ref = k_cache.float(), v_cache.float()
    saturated = qk.clone()
    saturated[:, heads:] = saturated[:, heads:].clamp(-448, 448)
    want = reference(saturated, v.clamp(-448, 448), k_ref, v_ref, pos, heads, d**-0.5)
    qk, v, pos = qk.to(dtype).to(device), v.to(dtype).to(device), pos.to(device)
    k_cache, v_cache = k_cache.to(device), v_cache.to(device)
    got = hf_attention.decode(qk[:, :heads], qk[:, heads:], v, k_cache, v_cache, pos, d**-0.5)
    assert got.dtype == dtype
    tolerance = 2e-6 if dtype == torch.float32 else 1e-2  # float32 sums; values up to 448 in the mix
    torch.testing.assert_close(got.float().cpu(), want, atol=tolerance, rtol=tolerance)
    k_cache, v_cache = k_cache.cpu(), v_cache.cpu()
    assert torch.equal(k_cache.float(), k_ref) and torch.equal(v_cache.float(), v_ref)
    assert k_cache[0, 0, positions[0], :3].float().tolist() == [448.0, -448.0, 448.0]
    assert v_cache[n - 1, kv_heads - 1, positions[-1], -2:].float().tolist() == [-448.0, 448.0]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_interpreted_kernel_on_an_fp8_cache_stores_saturated_e4m3_and_attends_to_it(interpreted, dtype):
    compare_fp8_cache(9, 3, 64, [0, 1, hf_attention.BLOCK, 2 * hf_attention.BLOCK + 7], dtype)
    compare_fp8_cache(28, 4, 128, [5, 70], dtype)


def test_interpreted_fused_step_on_an_fp8_cache_writes_e4m3_of_the_full_cache_and_moves_rows(interpreted,
                                                                                            monkeypatch):
    """The engine's FP8 KV cache through the fused step, rows leaving included: after the prefill the
    cache holds exactly e4m3 of what the model-dtype cache holds (saturated at 448); every decode
    step's logits stay near the full-precision step's (e4m3's 2^-4 rounding of keys and values), and a
    row moved to another slot carries its bytes (a wrong move would read another row's columns)."""
    model = tiny(Qwen2Config)
    monkeypatch.setattr(hf_attention, "default_attention", lambda *a, **k: "triton")  # the CPU's is sdpa
    prompts = [[1, 5, 9, 200, 3], [7, 8], list(range(11, 81))]
    full = StaticSlots(model, max_rows=4, max_len=96, use_graphs=False)
    fp8 = StaticSlots(model, max_rows=4, max_len=96, use_graphs=False, kv_cache_dtype="fp8")
    assert fp8.kv.dtype == torch.float8_e4m3fn and fp8.fused.attention == full.fused.attention == "triton"
    with torch.inference_mode():
        full.admit(prompts, 0)
        fp8.admit(prompts, 0)
    assert torch.equal(fp8.kv.view(torch.uint8), full.kv.clamp(-448, 448).to(torch.float8_e4m3fn).view(torch.uint8))
    before = fp8.kv[:, :, 2, :, :70].clone()
    with torch.inference_mode():
        fp8.select([0, 2])  # row 2 moves to slot 1
    assert torch.equal(fp8.kv[:, :, 1, :, :70].view(torch.uint8), before.view(torch.uint8))
    seen_full = decode_sequence(StaticSlots(model, 4, 96, use_graphs=False), prompts, steps=6)
    seen_fp8 = decode_sequence(StaticSlots(model, 4, 96, use_graphs=False, kv_cache_dtype="fp8"), prompts, steps=6)
    for i in seen_full:
        for (ids_a, a), (ids_b, b) in zip(seen_full[i], seen_fp8[i], strict=True):
            assert ids_a == ids_b or ids_a[:-1] == ids_b[:-1]  # a near-tie may pick another last id
            if ids_a == ids_b:
                assert (a - b).abs().max().item() < 0.1 * a.abs().max().item()


@pytest.mark.parametrize("gemm", ["rowwise", "unit"])
def test_interpreted_fp8_fused_step_with_the_kernel_computes_the_dequantized_model(interpreted, gemm):
    """FP8 weights, Qwen2 (a q/k/v bias), the kernel taking the raw q/k/v product: with ``"unit"`` it
    applies the GEMM's scales, then the bias and RoPE; with ``"rowwise"`` the bias and RoPE. The logits
    are the fake-quantized model's full forward passes' (tests/test_engines_hf_fp8.py)."""
    from test_engines_hf_fp8 import fake_quant_reference

    model = tiny(Qwen2Config, tie_word_embeddings=False)
    slots = StaticSlots(model, 4, 96, use_graphs=False, fp8=True, fp8_gemm=gemm)
    slots.fused.attention = "triton"
    reference = fake_quant_reference(model)
    for rows in decode_sequence(slots, [[1, 5, 9, 200, 3], [7, 8], list(range(11, 81))], steps=5).values():
        for ids, logits in rows:
            assert (logits - full_forward_logits(reference, ids)).abs().max().item() < 1e-4


def test_an_fp8_cache_is_refused_without_the_kernel_and_off_the_compiled_step_on_cuda(monkeypatch):
    monkeypatch.delenv("CHATGYM_DECODE_ATTENTION", raising=False)
    with pytest.raises(ValueError, match=r"^kv_cache_dtype 'fp8' is read by the fused step's Triton attention "
                                         r"kernel, which this step does not run \(attention 'sdpa'\)$"):
        StaticSlots(tiny(LlamaConfig), 2, 32, use_graphs=False, kv_cache_dtype="fp8")
    with pytest.raises(ValueError, match=r"\(fused=False\)$"):
        StaticSlots(tiny(LlamaConfig), 2, 32, use_graphs=False, fused=False, kv_cache_dtype="fp8")
    needs = ("kv_cache_dtype 'fp8' is read by the fused step's Triton attention kernel: it needs decode 'static' "
             "and fused_step 'compiled'")
    for kwargs in ({"fused_step": True, "cuda": True}, {"fused_step": False, "cuda": True}):
        with pytest.raises(ValueError, match=f"^{needs}$"):
            hf_options.check_options("static", kv_cache_dtype="fp8", **kwargs)
    with pytest.raises(ValueError, match=f"^{needs}$"):
        hf_options.check_options("dynamic", kv_cache_dtype="fp8", fused_step="compiled", cuda=True)
    # Fresh-user walk: without CUDA it said to set what was set already; now it says what to do there.
    with pytest.raises(ValueError, match=r"^kv_cache_dtype 'fp8' is read by a Triton kernel on a CUDA GPU, and this "
                                         r"engine has none: leave it out \(or 'auto'\)$"):
        hf_options.check_options("static", kv_cache_dtype="fp8", fused_step="compiled", cuda=False)
    with pytest.raises(ValueError, match=r"^kv_cache_dtype must be one of \('auto', 'fp8'\), got 'fp8_e5m2'$"):
        hf_options.check_options("static", kv_cache_dtype="fp8_e5m2")
    assert hf_options.check_options("static", kv_cache_dtype="fp8", fused_step="compiled", cuda=True) == "compiled"
    with pytest.raises(ValueError, match=r"^kv_cache_dtype 'fp8' is refused: the device is 'cpu'; FP8 needs"):
        hf_options.check_kv_cache("fp8", "cpu")
    assert hf_options.check_kv_cache("auto", "cpu") == "auto"


def test_config_load_refuses_an_fp8_kv_cache_on_this_cpu_naming_the_field(monkeypatch):
    from chatgym.trainer.config.loader import ConfigError
    from chatgym.trainer.config.run import load_config
    from chatgym.trainer.engines import check_engine_options
    from chatgym.trainer.models import cuda

    with pytest.raises(ConfigError, match=r"^engine.options: kv_cache_dtype 'fp8' is read by a Triton kernel on a "
                                          r"CUDA GPU, and this engine has none: leave it out \(or 'auto'\)$"):
        check_engine_options("hf", {"decode": "static", "fused_step": "compiled", "kv_cache_dtype": "fp8"},
                             "engine.options")
    # Fresh-user walk: on a GPU without FP8 (compute capability < 8.9) the hardware refusal came only as
    # the engine was built, after the learner loaded; load_config says it first, as for FP8 weights.
    fp8_kv = ["engine.backend=hf", "engine.options={kv_cache_dtype: fp8, decode: static, fused_step: compiled}"]
    with pytest.raises(ConfigError, match=r"^engine.options.kv_cache_dtype: 'fp8' is refused: no CUDA GPU here; "
                                          r"FP8 needs one of compute capability >= 8.9 \(Ada, Hopper\)$"):
        load_config(None, fp8_kv)
    monkeypatch.setattr(cuda, "fp8_unsupported", lambda device=None: "NVIDIA A100 has compute capability 8.0; FP8 "
                        "needs >= 8.9 (Ada, Hopper)")
    with pytest.raises(ConfigError, match=r"^engine.options.kv_cache_dtype: 'fp8' is refused: NVIDIA A100 has "):
        load_config(None, fp8_kv)
    monkeypatch.setattr(cuda, "fp8_unsupported", lambda device=None: None)  # an H100: nothing refused here
    assert load_config(None, fp8_kv).engine.options["kv_cache_dtype"] == "fp8"


def test_config_load_refuses_a_kv_cache_dtype_vllm_does_not_take_naming_its_values():
    # Fresh-user walk: 'FP8', 1 and true reached vLLM's pydantic error after the learner had loaded.
    import typing

    from vllm.config.cache import CacheDType

    from chatgym.trainer.config.loader import ConfigError
    from chatgym.trainer.engines import check_engine_options

    values = list(typing.get_args(CacheDType))
    assert "fp8" in values and "fp8_e5m2" in values
    for bad in ("FP8", 1, True):
        with pytest.raises(ConfigError) as err:
            check_engine_options("vllm", {"kv_cache_dtype": bad}, "engine.options")
        assert str(err.value) == f"engine.options: kv_cache_dtype must be one of vLLM's {values}, got {bad!r}"
    for good in ("fp8", "fp8_e5m2", "auto"):
        check_engine_options("vllm", {"kv_cache_dtype": good}, "engine.options")


@pytest.mark.parametrize("config_class", [LlamaConfig, Qwen2Config, Qwen3Config], ids=["llama", "qwen2", "qwen3"])
def test_interpreted_fused_step_with_the_kernel_gives_full_forward_logits(interpreted, config_class):
    model = tiny(config_class)
    slots = StaticSlots(model, max_rows=4, max_len=96, use_graphs=False)
    assert slots.fused.attention == "sdpa"  # the CPU's default
    slots.fused.attention = "triton"
    prompts = [[1, 5, 9, 200, 3], [7, 8], list(range(11, 81))]  # the last crosses a block of columns
    seen = decode_sequence(slots, prompts, steps=6)
    assert [len(v) for v in seen.values()] == [6, 3, 6]
    for rows in seen.values():
        for ids, logits in rows:
            assert (logits - full_forward_logits(model, ids)).abs().max().item() < ATOL


def test_the_default_is_the_kernel_only_with_compiled_pieces_on_cuda_for_its_head_sizes(monkeypatch):
    monkeypatch.delenv("CHATGYM_DECODE_ATTENTION", raising=False)
    choose = hf_attention.default_attention
    assert [choose(True, True, 64), choose(True, True, 128), choose(True, True, None)] == ["triton"] * 3
    assert [choose(False, True, 64), choose(True, False, 64), choose(True, True, 80)] == ["sdpa"] * 3
    assert [hf_attention.supports(d) for d in (8, 16, 64, 80, 96, 128, 256)] == [False, True, True, False, False,
                                                                                  True, True]
    monkeypatch.setenv("CHATGYM_DECODE_ATTENTION", "")  # empty: unset
    assert [choose(True, True, 64), choose(False, True, 64)] == ["triton", "sdpa"]
    monkeypatch.setenv("CHATGYM_DECODE_ATTENTION", "sdpa")
    assert choose(True, True, 64) == "sdpa"
    monkeypatch.setenv("CHATGYM_DECODE_ATTENTION", "triton")
    assert choose(False, True, 64) == "triton"
    with pytest.raises(ValueError, match="needs a CUDA GPU"):
        choose(True, False, 64)
    with pytest.raises(ValueError, match="head size 80"):
        choose(True, True, 80)
    monkeypatch.setenv("CHATGYM_DECODE_ATTENTION", "flash")
    # Regression (fresh-user walk): the eager fused step reads it too, so it was refused only as the
    # worker built the step, failing every episode of a run that then exited 0.
    for fused_step in ("compiled", True):
        with pytest.raises(ValueError, match=r"must be one of \('sdpa', 'triton'\), got 'flash'"):
            hf_options.check_options("static", fused_step=fused_step, cuda=True)
    hf_options.check_options("static", fused_step=False, cuda=True)  # no fused step: not read


def test_a_head_size_the_kernel_cannot_take_is_refused_when_asked_for():
    from chatgym.trainer.engines.hf_fused import FusedDecoder

    model = tiny(LlamaConfig, head_dim=24)
    assert FusedDecoder(model).attention == "sdpa"
    with pytest.raises(ValueError, match="head size 24 is not a power of two"):
        FusedDecoder(model, attention="triton")
    with pytest.raises(ValueError, match="attention must be one of"):
        FusedDecoder(model, attention="flash")


@pytest.mark.gpu
def test_the_kernel_on_cuda_gives_sdpa_in_bf16():
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    # bf16: SDPA and the kernel round p and sum in other orders; outputs are averages of values ~1.
    compare(9, 3, 64, [0, 1, 63, 64, 65, 200] * 11, dtype=torch.bfloat16, device="cuda", atol=2e-2)
    compare(28, 4, 128, [5, 70, 255, 300], dtype=torch.bfloat16, device="cuda", atol=2e-2)
    compare(9, 3, 64, [0, 64, 130], device="cuda")  # float32: full precision, no TF32


@pytest.mark.gpu
def test_the_kernel_on_cuda_on_an_fp8_cache():
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    for dtype in (torch.float32, torch.bfloat16):
        compare_fp8_cache(9, 3, 64, [0, 1, 63, 64, 65, 200] * 11, dtype, device="cuda")
        compare_fp8_cache(28, 4, 128, [5, 70, 255, 300] * 40, dtype, device="cuda")


@pytest.mark.gpu
def test_an_engine_decodes_the_same_greedy_ids_with_either_attention(monkeypatch):
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    from chatgym.trainer.chat.tokenizer import get_tokenizer
    from chatgym.trainer.engines import SamplingParams
    from chatgym.trainer.engines.hf import TransformersEngine

    model = tiny(LlamaConfig, device="cuda")
    prompts = [[1, 5, 9, 200, 3], [7, 8], list(range(11, 90))]
    params = SamplingParams(max_tokens=40, temperature=0)

    async def ids(attention):
        monkeypatch.setenv("CHATGYM_DECODE_ATTENTION", attention)
        engine = TransformersEngine(model, get_tokenizer("smollm2"), decode="static", max_model_len=256,
                                    fused_step="compiled")
        try:
            out = [o.token_ids for o in await asyncio.gather(*(engine.generate(p, params) for p in prompts))]
            assert engine._slots.fused.attention == attention
            return out
        finally:
            await engine.close()

    assert asyncio.run(ids("triton")) == asyncio.run(ids("sdpa"))


def test_vllm_cpus_fp8_kv_cache_is_refused_at_config_load_without_avx512_or_amx(monkeypatch):
    """Regression (fresh-user walk): on an AVX2-only CPU ``engine.backend=vllm`` with ``kv_cache_dtype: fp8``
    loaded the model, then failed in an 87-line traceback ("FP8 KV cache on CPU requires x86 with AVX-512
    or AMX"); load_config refuses it in one line, and takes it where the CPU lists avx512f or amx_tile."""
    from chatgym.trainer.config.run import ConfigError, load_config
    from chatgym.trainer.models import cuda, dtype

    avx2 = "processor\t: 0\nflags\t\t: fpu sse2 avx avx2 fma\n"
    assert cuda.vllm_cpu_fp8_cache_refusal(avx2) == ("vLLM's CPU backend keeps an FP8 KV cache only on x86 with "
                                                      "AVX-512 or AMX, and this CPU has neither")
    assert cuda.vllm_cpu_fp8_cache_refusal(avx2.replace("avx2", "avx2 avx512f")) is None
    assert cuda.vllm_cpu_fp8_cache_refusal(avx2.replace("avx2", "avx2 amx_tile")) is None
    monkeypatch.setattr(dtype, "cpu_flags", lambda cpuinfo=None: frozenset({"avx2"}))
    with pytest.raises(ConfigError, match=r"^engine.options.kv_cache_dtype: 'fp8' is refused: vLLM's CPU backend "):
        load_config(None, ["engine.backend=vllm", "engine.options={kv_cache_dtype: fp8}"])
    load_config(None, ["engine.backend=vllm", "engine.options={kv_cache_dtype: auto}"])
    monkeypatch.setattr(dtype, "cpu_flags", lambda cpuinfo=None: frozenset({"avx2", "avx512f"}))
    load_config(None, ["engine.backend=vllm", "engine.options={kv_cache_dtype: fp8}"])
