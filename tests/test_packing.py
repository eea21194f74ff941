"""The CPU update's work savings: packed micro-batches (no padding), the skipped old-logprob pass, and
the compute dtype ``auto`` picks from the CPU's flags. Exact layouts are written out by hand; logprobs
and gradients are checked against the padded forward on a tiny random-init Llama."""

from __future__ import annotations

import copy
import dataclasses
import math

import pytest
import torch
from test_trainer import _group_batch, _sgd_models, _update_batch, traj
from train_helpers import torch_threads

from chatgym.trainer.config.run import AlgoConfig, ConfigError, load_config
from chatgym.trainer.learner.batch import collate, pack_chunks, pack_rows
from chatgym.trainer.learner.forward import (
    ForwardPlan,
    _packed_attention_mask,
    forward_logprobs,
    forward_logprobs_packed,
    per_token_pass,
    policy_logprobs,
    resolve_pack,
)
from chatgym.trainer.learner.policy import resolve_compute_dtype
from chatgym.trainer.learner.update import update
from chatgym.trainer.models.dtype import choose_compute_dtype, cpu_flags

CPU = torch.device("cpu")




def flat(model) -> torch.Tensor:
    return torch.cat([p.detach().flatten() for p in model.parameters()])


def group_batch_with_engine_logprobs(model):
    """``_group_batch()`` with engine logprobs 0.1 above the model's own, so the TIS weights are
    exp(-0.1) ~ 0.905 (a random model's logprobs are ~ -10.8, far below the helper's -0.5, which would
    make every weight ~ e^-10 and the gradient vanish)."""
    batch = _group_batch()
    with torch.no_grad():
        own, _ = forward_logprobs(model, batch, with_entropy=False)
    batch.engine_logprobs = torch.where(batch.loss_mask, own + 0.1, 0.0)
    return batch


# ------------------------------------------------------------------------------------------ layout


def test_pack_rows_layout_without_and_with_a_shared_prompt():
    # Row 0: 5 tokens, trained at 3-4; row 1: 3 tokens, trained at 2.
    batch = collate([traj([10, 11, 12, 13, 14], [0, 0, 0, 1, 1]), traj([20, 21, 22], [0, 0, 1])], pad_id=0)
    p = pack_rows(batch)
    assert p.input_ids.tolist() == [[10, 11, 12, 13, 14, 20, 21, 22]]
    assert p.position_ids.tolist() == [[0, 1, 2, 3, 4, 0, 1, 2]]
    assert p.segments.tolist() == [0, 0, 0, 0, 0, 1, 1, 1]
    # (0, 3) is predicted at packed 2, (0, 4) at 3, (1, 2) at 5 + 1 = 6.
    assert (p.rows.tolist(), p.cols.tolist()) == ([0, 0, 1], [3, 4, 2])
    assert p.logit_index.tolist() == [2, 3, 6]
    assert p.targets.tolist() == [13, 14, 22]
    mask = p.attention_mask()[0, 0].int()
    assert mask.tolist() == [
        [1, 0, 0, 0, 0, 0, 0, 0],
        [1, 1, 0, 0, 0, 0, 0, 0],
        [1, 1, 1, 0, 0, 0, 0, 0],
        [1, 1, 1, 1, 0, 0, 0, 0],
        [1, 1, 1, 1, 1, 0, 0, 0],
        [0, 0, 0, 0, 0, 1, 0, 0],
        [0, 0, 0, 0, 0, 1, 1, 0],
        [0, 0, 0, 0, 0, 1, 1, 1],
    ]

    # A group sharing the 2-token prompt [7, 8]: answers [1, 2] and [3]; the prompt is laid down once.
    group = collate([traj([7, 8, 1, 2], [0, 0, 1, 1]), traj([7, 8, 3], [0, 0, 1])], pad_id=0)
    g = pack_rows(group, prefix_len=2)
    assert g.input_ids.tolist() == [[7, 8, 1, 2, 3]]
    assert g.position_ids.tolist() == [[0, 1, 2, 3, 2]]  # the second answer restarts at position 2
    assert g.segments.tolist() == [-1, -1, 0, 0, 1]
    # (0, 2) <- prompt's last token (packed 1); (0, 3) <- packed 2; (1, 2) <- prompt's last (1).
    assert g.logit_index.tolist() == [1, 2, 1]
    assert g.attention_mask()[0, 0].int().tolist() == [
        [1, 0, 0, 0, 0],
        [1, 1, 0, 0, 0],
        [1, 1, 1, 0, 0],
        [1, 1, 1, 1, 0],
        [1, 1, 0, 0, 1],  # the second answer sees the prompt, not the first answer
    ]
    with pytest.raises(ValueError, match="do not share a 3-token untrained prompt"):
        pack_rows(group, prefix_len=3)  # position 2 is trained


def test_pack_chunks_bound_the_packed_length():
    # Own tokens after a 2-token prompt: 3, 4, 2, 6 -> runs within 2 + 7 = 9 tokens: [0, 1], [2], [3];
    # a row longer than the cap is alone.
    assert pack_chunks([5, 6, 4, 8], prefix_len=2, max_tokens=9) == [[0, 1], [2], [3]]
    assert pack_chunks([5, 6, 4, 8], prefix_len=0, max_tokens=100) == [[0, 1, 2, 3]]
    assert pack_chunks([50, 3], prefix_len=0, max_tokens=10) == [[0], [1]]


# -------------------------------------------------------------------------------- packed == padded


@pytest.mark.parametrize("max_tokens", [1024, 12])
def test_packed_logprobs_equal_padded(tiny_model, max_tokens):
    # fp32: packed and padded run the same products in another order, so they agree to rounding
    # (measured max |diff| ~1e-6); 1e-5 is the stated tolerance. max_tokens 12 splits the batch.
    batch = _group_batch()
    mask = batch.loss_mask
    with torch.no_grad():
        padded, padded_ent = forward_logprobs(tiny_model, batch, with_entropy=True)
        packed, packed_ent = forward_logprobs_packed(
            tiny_model, batch, with_entropy=True, max_tokens=max_tokens
        )
        group = batch.select([0, 1, 2])  # shares a 4-token prompt
        shared, _ = forward_logprobs_packed(tiny_model, group, 4, with_entropy=False, max_tokens=max_tokens)
    torch.testing.assert_close(packed[mask], padded[mask], rtol=0, atol=1e-5)
    torch.testing.assert_close(packed_ent[mask], padded_ent[mask], rtol=0, atol=1e-4)
    assert not bool(packed[~mask].any())  # nothing is computed where nothing is trained
    g_mask = group.loss_mask
    torch.testing.assert_close(
        shared[g_mask], padded[[0, 1, 2], : group.input_ids.shape[1]][g_mask], rtol=0, atol=1e-5
    )


def test_packed_logprobs_with_eager_attention(tiny_model):
    # Eager attention takes an additive float mask instead of SDPA's bool one.
    eager = copy.deepcopy(tiny_model)
    eager.config._attn_implementation = "eager"
    batch = _update_batch()
    with torch.no_grad():
        padded, _ = forward_logprobs(tiny_model, batch, with_entropy=False)
        packed, _ = forward_logprobs_packed(eager, batch, with_entropy=False)
    torch.testing.assert_close(packed[batch.loss_mask], padded[batch.loss_mask], rtol=0, atol=1e-5)


@pytest.mark.parametrize(
    ("share", "mode"), [(False, "token-mean"), (True, "token-mean"), (True, "seq-mean-token-sum")]
)
def test_packed_update_gives_the_same_loss_and_gradient(tiny_model, share, mode):
    # One plain-SGD step (lr 0.1, no clipping): equal weights afterwards <=> equal gradients.
    algo = AlgoConfig(loss_agg=mode, tis_cap=2.0, entropy_coef=0.01)
    results, losses = [], []
    for pack in (False, True):
        model = copy.deepcopy(tiny_model)
        metrics = update(
            _sgd_models(model, 0.1),
            group_batch_with_engine_logprobs(tiny_model),
            algo,
            ForwardPlan(micro_batch_size=3, device=CPU, share_prefix=share, pack=pack),
            max_grad_norm=None,
            generator=torch.Generator().manual_seed(0),
        )
        results.append(flat(model))
        losses.append(metrics["actor/pg_loss"])
    assert (results[0] - flat(tiny_model)).abs().max() > 1e-4  # the step moved the weights
    torch.testing.assert_close(results[1], results[0], rtol=0, atol=1e-6)
    assert losses[1] == pytest.approx(losses[0], abs=1e-6)


# ------------------------------------------------------------------------- skipped old-logprob pass


@pytest.fixture
def one_thread():
    # Bitwise comparisons of two runs need kernels that reduce in one order. With two threads on a
    # loaded machine this test failed 3 of 8 runs (a helper's session) and this file 2 of 7 beside
    # two busy processes; with one thread the file passed 5 of 5 that way.
    with torch_threads(1):
        yield


@pytest.mark.parametrize("pack", [False, True])
def test_skipping_the_old_logprob_pass_changes_nothing(tiny_model, pack, one_thread):
    # One optimizer step per batch: the behaviour policy is the current one, so old = logp.detach()
    # gives ratio exactly 1 and the TIS weights exp(old - engine) of the same numbers. A separate
    # no-grad pass over the same micro-batches computes bitwise the same logprobs (same kernels, same
    # shapes, one thread), so the loss and the gradient are identical, not merely close.
    algo = AlgoConfig(tis_cap=2.0)
    results, metrics = [], []
    for precompute in (False, True):
        model = copy.deepcopy(tiny_model)
        batch = group_batch_with_engine_logprobs(tiny_model)
        if precompute:
            batch.old_logprobs = per_token_pass(
                lambda mb, p, m=model: policy_logprobs(m, mb, p, with_entropy=False, pack=pack)[0],
                batch,
                3,
                CPU,
                share_prefix=True,
            )
        metrics.append(
            update(
                _sgd_models(model, 0.1),
                batch,
                algo,
                ForwardPlan(micro_batch_size=3, device=CPU, share_prefix=True, pack=pack),
                max_grad_norm=None,
                generator=torch.Generator().manual_seed(0),
            )
        )
        results.append(flat(model))
    assert torch.equal(results[0], results[1])
    for key in ("actor/pg_loss", "actor/tis_weight", "actor/ratio_max", "actor/grad_norm"):
        assert metrics[0][key] == metrics[1][key], key
    assert metrics[1]["actor/ratio_max"] == 1.0
    # TIS weights: exp(old - engine) = exp(-0.1) up to the packed/padded rounding (~1e-6).
    assert metrics[1]["actor/tis_weight"] == pytest.approx(math.exp(-0.1), abs=1e-5)


# ------------------------------------------------------------------------------------ compute dtype

AVX2_CPUINFO = (
    "processor\t: 0\nflags\t\t: fpu sse2 avx avx2 fma\n\nprocessor\t: 1\nflags\t\t: fpu sse2 avx avx2 fma\n"
)


@pytest.mark.parametrize(
    ("device", "flags", "expected"),
    [
        ("cpu", {"avx2", "avx512f", "avx512_bf16"}, "bfloat16"),  # AVX-512 BF16 (e.g. Zen 4, Cooper Lake)
        ("cpu", {"avx2", "avx512f", "amx_tile", "amx_bf16"}, "bfloat16"),  # AMX (Sapphire Rapids)
        ("cpu", {"avx2", "fma"}, "float32"),  # AVX2 only: bf16 would be emulated
        ("cpu", {"avx2", "avx512f", "avx512bw"}, "float32"),  # AVX-512 without its BF16 extension
        ("cpu", set(), "float32"),
        ("cuda", set(), "bfloat16"),
    ],
)
def test_compute_dtype_choice_follows_the_flags(device, flags, expected):
    dtype, reason = choose_compute_dtype(device, frozenset(flags))
    assert dtype == expected
    assert ("CUDA" in reason) == (device == "cuda")
    if dtype == "bfloat16" and device == "cpu":
        assert "native bf16" in reason
    # resolve_compute_dtype: "auto" over fp32 weights is that choice; a set value or non-fp32 weights win.
    assert resolve_compute_dtype("auto", "float32", torch.device(device), frozenset(flags))[0] == expected
    assert resolve_compute_dtype("float32", "float32", torch.device(device), frozenset(flags))[0] == "float32"
    assert resolve_compute_dtype("auto", "bfloat16", torch.device(device), frozenset(flags))[0] == "bfloat16"


@pytest.mark.parametrize(
    ("flags", "ratio", "expected"),
    [
        ({"avx512_bf16"}, 0.71, "bfloat16"),  # the AMD EPYC of benchmarks/results/main_job_cpu_epyc_bf16/
        ({"avx512_bf16", "amx_tile"}, 1.69, "float32"),  # this project's Intel Xeon VM (AMX not usable)
        ({"avx512_bf16"}, 1.0, "float32"),  # not faster: fp32 keeps the exact numerics
        ({"avx2"}, 0.5, "float32"),  # no native flag: never measured, emulated bf16
        ({"amx_bf16"}, None, "bfloat16"),  # not measured: the flags alone
    ],
)
def test_a_native_bf16_cpu_whose_bf16_matmul_measured_slower_computes_in_fp32(flags, ratio, expected):
    # Regression: on the Intel Xeon VM this project runs on (avx512_bf16 and amx_tile listed) the main
    # job's update ran in bf16 autocast at 29.86 s against fp32's 19.45 s (benchmarks/train_step_cpu.py).
    dtype, reason = choose_compute_dtype("cpu", frozenset(flags), ratio)
    assert dtype == expected
    if ratio is not None and ratio >= 1 and flags & {"avx512_bf16", "amx_bf16"}:
        assert reason == (
            "CPU with native bf16 flags (avx512_bf16), but a bf16 matmul measured "
            f"{ratio:.2f}x the fp32 one's time here"
        )


def test_this_machines_auto_choice_agrees_with_its_measured_matmuls():
    from chatgym.trainer.models.dtype import NATIVE_BF16_FLAGS, cpu_bf16_time_ratio

    flags = cpu_flags()
    native = any(f in flags for f in NATIVE_BF16_FLAGS)
    dtype, _ = resolve_compute_dtype("auto", "float32", CPU)
    ratio = cpu_bf16_time_ratio() if native else None
    assert dtype == ("bfloat16" if native and ratio < 1.0 else "float32")
    assert cpu_bf16_time_ratio() == ratio or not native  # measured once a process: every choice agrees


def test_cpu_threads_honours_omp_num_threads(monkeypatch):
    import os

    from chatgym.trainer.learner.policy import cpu_threads

    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    assert cpu_threads() == 3
    monkeypatch.delenv("OMP_NUM_THREADS")
    assert cpu_threads() == len(os.sched_getaffinity(0))


def test_cpu_flags_reads_the_flags_lines():
    assert cpu_flags(AVX2_CPUINFO) == frozenset({"fpu", "sse2", "avx", "avx2", "fma"})
    # Arm kernels call the line "Features".
    assert cpu_flags("Features\t: fp asimd bf16\n") == frozenset({"fp", "asimd", "bf16"})
    assert cpu_flags("") == frozenset()


def test_trainer_logs_the_compute_choice_once_and_keeps_auto_in_the_config(capsys, tmp_path):
    from chatgym.trainer.config.run import save_config
    from chatgym.trainer.learner.learner import Learner

    cfg = load_config(None, ["engine.backend=hf", "engine.dtype=float32"])
    trainer = Learner.__new__(Learner)  # only the compute set-up, no models
    trainer.cfg, trainer.device = cfg, CPU
    trainer._set_up_compute()
    err = capsys.readouterr().err
    expected, reason = resolve_compute_dtype("auto", "float32", CPU)  # this machine's flags and matmuls
    mixed = " autocast" if expected == "bfloat16" else ""
    assert err == (
        f"chatgym: training compute {expected}{mixed} over float32 weights on cpu ({reason}), "
        f"{torch.get_num_threads()} torch threads, packed micro-batches (<= 512 tokens)\n"
    )
    assert trainer.compute_dtype == expected and trainer.pack
    # The machine's choice is not written back: the saved config still says auto.
    save_config(cfg, tmp_path / "config.yaml")
    assert "compute_dtype: auto" in (tmp_path / "config.yaml").read_text()
    # An explicit value is used as is (bf16 autocast on any CPU when asked for).
    trainer.cfg = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, compute_dtype="bfloat16"))
    trainer._set_up_compute()
    assert "training compute bfloat16 autocast over float32 weights on cpu (model.compute_dtype)" in (
        capsys.readouterr().err
    )
    assert isinstance(trainer._autocast(), torch.autocast)
    # The packed layout needs no KV cache, so a group's prompt is still shared under gradient
    # checkpointing on CPU (the padded CUDA layout turns sharing off there).
    trainer.cfg = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, gradient_checkpointing=True))
    assert trainer.share_prefix
    trainer.pack = False
    assert not trainer.share_prefix


# ------------------------------------------------------------------------------- the model.pack knob


@pytest.mark.parametrize(
    ("pack", "max_tokens", "device", "expected"),
    [
        ("auto", None, "cpu", (True, 512)),  # packed on CPU, PACK_MAX_TOKENS
        ("auto", None, "cuda", (False, 2048)),  # padded on CUDA (until measured), PACK_MAX_TOKENS_CUDA
        (True, None, "cuda", (True, 2048)),
        (False, None, "cpu", (False, 512)),
        (True, 4096, "cpu", (True, 4096)),  # a set size wins on either device
        ("auto", 300, "cuda", (False, 300)),
    ],
)
def test_resolve_pack_per_device(pack, max_tokens, device, expected):
    assert resolve_pack(pack, max_tokens, torch.device(device)) == expected


@pytest.mark.parametrize(
    ("override", "pack", "log"),
    [
        ([], True, "packed micro-batches (<= 512 tokens)"),  # auto on CPU
        (["model.pack=auto"], True, "packed micro-batches (<= 512 tokens)"),
        (["model.pack=true", "model.pack_max_tokens=64"], True, "packed micro-batches (<= 64 tokens)"),
        (["model.pack=false"], False, "padded micro-batches"),
    ],
)
def test_model_pack_setting_chooses_the_learners_layout(capsys, override, pack, log):
    from chatgym.trainer.learner.learner import Learner

    cfg = load_config(None, ["engine.backend=hf", "engine.dtype=float32", *override])
    learner = Learner.__new__(Learner)  # only the compute set-up, no models
    learner.cfg, learner.device = cfg, CPU
    learner._set_up_compute()
    assert learner.pack is pack
    assert capsys.readouterr().err.endswith(f", {log}\n")
    # Padded under gradient checkpointing drops the shared prompt (it needs the KV cache); packed keeps it.
    learner.cfg = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, gradient_checkpointing=True))
    assert learner.share_prefix is pack


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("model.pack=sometimes", r"^model\.pack: must be one of \['auto', True, False\], got 'sometimes'"),
        ("model.pack=1", r"^model\.pack must be auto, true or false, got 1$"),  # 1 == True, still refused
        ("model.pack_max_tokens=0", r"^model\.pack_max_tokens must be > 0, got 0$"),
        ("model.pack_max_tokens=big", r"^model\.pack_max_tokens: .*'big'"),
    ],
)
def test_bad_pack_settings_fail_at_config_load(override, message):
    with pytest.raises(ConfigError, match=message):
        load_config(None, [override])


def test_pack_max_tokens_reaches_the_update(tiny_model):
    # _group_batch's row lengths are 9, 6, 8, 9, 12, 6 (prompts 4/4/4/6/6/3 + answers 5/2/4/3/6/3).
    # One micro-batch of all 6 rows, no sharing, longest first: 12, 9, 9, 8, 6, 6. Packs of <= 12
    # tokens: [12], [9] (9+9 > 12), [9], [8] (8+6 > 12), [6, 6] -> 5 forwards of 12, 9, 9, 8, 12
    # tokens; <= 1024: one forward of all 50.
    batch = group_batch_with_engine_logprobs(tiny_model)
    assert batch.lengths.tolist() == [9, 6, 8, 9, 12, 6]
    calls = []
    for max_tokens in (12, 1024):
        model = copy.deepcopy(tiny_model)
        hook = model.model.register_forward_hook(
            lambda m, a, kw, out: calls.append(kw["input_ids"].shape[1]), with_kwargs=True
        )
        update(
            _sgd_models(model, 0.1),
            batch,
            AlgoConfig(tis_cap=2.0),
            ForwardPlan(micro_batch_size=6, device=CPU, pack=True, pack_max_tokens=max_tokens),
            max_grad_norm=None,
            generator=torch.Generator().manual_seed(0),
        )
        hook.remove()
    assert calls == [12, 9, 9, 8, 12, 50]


def test_packed_update_under_gradient_checkpointing_matches_padded(tiny_model):
    # Gradient checkpointing recomputes each layer's forward in the backward pass with the same inputs
    # (the 4D mask and position ids included), so the gradient is the padded one up to rounding.
    # share_prefix stays on with packing (no KV cache needed), as the Learner sets it.
    algo = AlgoConfig(tis_cap=2.0, entropy_coef=0.01)
    results = []
    for pack, checkpointing in ((False, False), (True, True)):
        model = copy.deepcopy(tiny_model)
        if checkpointing:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
            assert model.model.gradient_checkpointing
        update(
            _sgd_models(model, 0.1),
            group_batch_with_engine_logprobs(tiny_model),
            algo,
            ForwardPlan(micro_batch_size=3, device=CPU, share_prefix=pack, pack=pack),
            max_grad_norm=None,
            generator=torch.Generator().manual_seed(0),
        )
        results.append(flat(model))
    assert (results[0] - flat(tiny_model)).abs().max() > 1e-4
    torch.testing.assert_close(results[1], results[0], rtol=0, atol=1e-6)


def test_eager_packed_mask_is_finite_in_bf16(tiny_model):
    # Regression: the eager mask was float32 with float32's min, which is -inf once cast to bf16
    # (3.40e38 is above bf16's largest finite 3.39e38); it is now built in the model's dtype.
    assert torch.tensor(torch.finfo(torch.float32).min).to(torch.bfloat16).isinf()
    eager = copy.deepcopy(tiny_model).to(torch.bfloat16)
    eager.config._attn_implementation = "eager"
    allowed = pack_rows(_update_batch()).attention_mask()
    mask = _packed_attention_mask(eager, allowed)
    assert mask.dtype == torch.bfloat16 and bool(mask.isfinite().all())
    assert mask[allowed].eq(0).all() and mask[~allowed].eq(torch.finfo(torch.bfloat16).min).all()
    assert _packed_attention_mask(tiny_model, allowed) is allowed  # SDPA takes the bool mask as is


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_packed_logprobs_equal_padded_on_cuda(tiny_model):
    cuda = torch.device("cuda")
    model = copy.deepcopy(tiny_model).to(cuda)
    batch = _group_batch().to(cuda)
    mask = batch.loss_mask
    group = batch.select([0, 1, 2])  # shares a 4-token prompt
    g_mask = group.loss_mask
    width = group.input_ids.shape[1]
    with torch.no_grad():
        padded, _ = forward_logprobs(model, batch, with_entropy=False)
        packed, _ = forward_logprobs_packed(model, batch, with_entropy=False, max_tokens=2048)
        shared, _ = forward_logprobs_packed(model, group, 4, with_entropy=False)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            padded16, _ = forward_logprobs(model, batch, with_entropy=False)
            packed16, _ = forward_logprobs_packed(model, batch, with_entropy=False, max_tokens=2048)
            shared16, _ = forward_logprobs_packed(model, group, 4, with_entropy=False)
    # fp32 (TF32 off, torch's default for matmuls): the same products in another order.
    torch.testing.assert_close(packed[mask], padded[mask], rtol=0, atol=1e-4)
    torch.testing.assert_close(shared[g_mask], padded[:3, :width][g_mask], rtol=0, atol=1e-4)
    # bf16 autocast: both layouts round differently; the packed one must be no further from the fp32
    # logprobs than twice the padded one's own bf16 error, + 0.02 (bf16 logits of size ~1 are rounded
    # by ~0.004 each, so two layouts' errors may differ by about that much several times over).
    err_padded = float((padded16 - padded)[mask].abs().max())
    err_packed = float((packed16 - padded)[mask].abs().max())
    err_shared = float((shared16 - padded[:3, :width])[g_mask].abs().max())
    assert err_padded < 0.1, err_padded  # bf16 keeps ~3 significant digits of logprobs ~ -10.8
    assert err_packed <= 2 * err_padded + 0.02, (err_packed, err_padded)
    assert err_shared <= 2 * err_padded + 0.02, (err_shared, err_padded)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_packed_update_on_cuda_with_checkpointing_matches_padded(tiny_model):
    # fp32 on CUDA, plain SGD: packed + shared prompt + gradient checkpointing vs padded, same step.
    cuda = torch.device("cuda")
    algo = AlgoConfig(tis_cap=2.0)
    results = []
    for pack in (False, True):
        model = copy.deepcopy(tiny_model).to(cuda)
        if pack:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        update(
            _sgd_models(model, 0.1),
            group_batch_with_engine_logprobs(tiny_model),
            algo,
            ForwardPlan(micro_batch_size=3, device=cuda, share_prefix=pack, pack=pack, pack_max_tokens=2048),
            max_grad_norm=None,
            generator=torch.Generator().manual_seed(0),
        )
        results.append(flat(model).cpu())
    assert (results[0] - flat(tiny_model)).abs().max() > 1e-4
    torch.testing.assert_close(results[1], results[0], rtol=0, atol=1e-5)
