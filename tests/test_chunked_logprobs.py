"""``model.logprob_chunk_tokens``: the learner's logprob head from the final hidden states, a chunk of
positions at a time under activation checkpointing. Checked by hand on a 3-word vocabulary, against
``token_logprobs`` on random tensors, against the plain forward in every layout (padded, shared
prompt, packed; LoRA; FSDP2) and in a Learner step, by the bytes autograd saves, and by its
refusals."""

from __future__ import annotations

import copy
import dataclasses
import json
import math
import types

import pytest
import torch
from test_trainer import _group_batch, traj
from train_helpers import TINY_LLAMA, fsdp2_one_rank

from chatgym.trainer.config.run import ConfigError, load_config
from chatgym.trainer.learner.forward import (
    forward_logprobs,
    forward_logprobs_packed,
    forward_logprobs_shared,
)
from chatgym.trainer.learner.lm_head import chunked_head_refusal
from chatgym.trainer.learner.logprobs import chunked_token_logprobs, head_token_logprobs, token_logprobs

V_SMOL = 49152  # SmolLM2's vocabulary (the tiny model's lm head is (49152, 64))
# The tiny model's logprobs and entropies are ~10.8 (ln 49152) in size, where one float32 ulp is
# 9.5e-7 by itself: model-level values are compared to 1e-6 plus one ulp of the value (2^-23).
ULP = 2**-23


def grads(model) -> dict[str, torch.Tensor]:
    return {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}


# --------------------------------------------------------------------------------- the pure function


def test_chunked_logprobs_by_hand():
    # V = 3, H = 2; weight rows e0, e1, 0, so hidden [1, 0] gives logits [1, 0, 0] and [0, 1] gives
    # [0, 1, 0]. logsumexp of either = ln(e + 2) = 1.5514447.
    #   row 0, target 0: 1 - ln(e + 2) = -0.5514447;  row 1, target 2: 0 - ln(e + 2) = -1.5514447.
    #   entropy of softmax([1, 0, 0]) = ln(e + 2) - e / (e + 2) = 0.9753278 (both rows).
    #   d logprob(row 0) / d logits = onehot(0) - softmax = [2/(e+2), -1/(e+2), -1/(e+2)], so
    #   d / d hidden[0] = weight^T @ that = [2/(e+2), -1/(e+2)] = [0.4238831, -0.2119416].
    hidden = torch.tensor([[1.0, 0.0], [0.0, 1.0]], requires_grad=True)
    weight = torch.tensor([[1.0, 0.0], [0.0, 1.0], [0.0, 0.0]])
    targets = torch.tensor([0, 2])
    lse = math.log(math.e + 2)
    for chunk in (1, 2, 5):
        hidden.grad = None
        lp, ent = chunked_token_logprobs(hidden, weight, None, targets, chunk_tokens=chunk, with_entropy=True)
        assert lp.dtype == torch.float32 and lp.tolist() == pytest.approx([1 - lse, -lse], abs=1e-6)
        assert ent.tolist() == pytest.approx([lse - math.e / (math.e + 2)] * 2, abs=1e-6)
        lp[0].backward()
        assert hidden.grad[0].tolist() == pytest.approx([2 / (math.e + 2), -1 / (math.e + 2)], abs=1e-6)
        assert hidden.grad[1].tolist() == [0.0, 0.0]
    # A bias [0, 0, ln 2]: row 1's logits [0, 1, ln 2], target 2: ln 2 - ln(1 + e + 2) = -1.2142362.
    bias = torch.tensor([0.0, 0.0, math.log(2)])
    lp, _ = chunked_token_logprobs(hidden, weight, bias, targets, chunk_tokens=1)
    assert lp[1].item() == pytest.approx(math.log(2) - math.log(math.e + 3), abs=1e-6)


@pytest.mark.parametrize("chunk", [1, 3, 6, 7, 100])  # 24 positions: divides (1, 3, 6) and not (7, 100)
@pytest.mark.parametrize("with_bias", [False, True])
@pytest.mark.parametrize("entropy_grad", [True, False])
def test_head_token_logprobs_equal_token_logprobs(chunk, with_bias, entropy_grad):
    # (B=3, K=9) hidden states of the last 9 of T=12 positions, V=11: the same values and gradients
    # as token_logprobs on the logits F.linear(hidden, weight, bias).
    gen = torch.Generator().manual_seed(0)
    hidden = torch.randn(3, 9, 5, generator=gen).requires_grad_()
    weight = torch.randn(11, 5, generator=gen).requires_grad_()
    bias = torch.randn(11, generator=gen).requires_grad_() if with_bias else None
    ids = torch.randint(0, 11, (3, 12), generator=gen)
    leaves = [t for t in (hidden, weight, bias) if t is not None]

    def run(fn):
        for t in leaves:
            t.grad = None
        lp, ent = fn()
        loss = (lp * torch.linspace(-1, 1, 12)).sum() + (0.3 * ent.sum() if entropy_grad else 0)
        loss.backward()
        return lp, ent, [t.grad.clone() for t in leaves]

    kw = {"with_entropy": True, "entropy_grad": entropy_grad}
    plain = run(lambda: token_logprobs(torch.nn.functional.linear(hidden, weight, bias), ids, **kw))
    chunked = run(lambda: head_token_logprobs(hidden, ids, weight, bias, chunk_tokens=chunk, **kw))
    assert chunked[0].shape == (3, 12) and not bool(chunked[0][:, :4].any())  # t < T - K + 1 = 4
    torch.testing.assert_close(chunked[0], plain[0], rtol=0, atol=1e-6)
    torch.testing.assert_close(chunked[1], plain[1], rtol=0, atol=1e-6)
    assert chunked[1].requires_grad is entropy_grad
    for got, want in zip(chunked[2], plain[2], strict=True):
        torch.testing.assert_close(got, want, rtol=0, atol=1e-5)


def test_chunked_head_runs_under_the_callers_autocast_forward_and_recomputed(monkeypatch):
    # Under bf16 autocast every chunk's product runs in bf16, in the forward and in the backward's
    # recomputation (checkpoint re-enters the forward's autocast state), as the plain head's does: the
    # chunked logprobs are the plain head's bf16 ones up to GEMM rounding, far from the fp32 ones.
    import chatgym.trainer.learner.logprobs as logprobs_module

    states = []
    head_chunk = logprobs_module._head_chunk

    def recorded(*args):
        states.append((torch.is_autocast_enabled("cpu"), torch.get_autocast_dtype("cpu")))
        return head_chunk(*args)

    monkeypatch.setattr(logprobs_module, "_head_chunk", recorded)
    gen = torch.Generator().manual_seed(1)
    hidden = torch.randn(2, 6, 32, generator=gen).requires_grad_()
    weight = torch.randn(50, 32, generator=gen).requires_grad_()
    ids = torch.randint(0, 50, (2, 6), generator=gen)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        chunked, _ = head_token_logprobs(hidden, ids, weight, None, chunk_tokens=4)  # 10 positions
        plain_bf16, _ = token_logprobs(torch.nn.functional.linear(hidden, weight), ids)
    chunked.sum().backward()
    assert states == [(True, torch.bfloat16)] * 6  # 3 chunks forward, 3 recomputed
    fp32, _ = token_logprobs(torch.nn.functional.linear(hidden, weight), ids)
    to_bf16 = (chunked - plain_bf16).abs().mean()
    to_fp32 = (chunked - fp32).abs().mean()
    assert to_fp32 > 1e-3 and to_bf16 < 0.1 * to_fp32


def test_an_entropy_taken_as_a_metric_is_not_recomputed(monkeypatch):
    # 6 positions in chunks of 2: the forward computes 3 chunk entropies. The backward recomputes
    # each chunk up to its last saved tensor (checkpoint's early stop): a graph-free entropy comes
    # after it and is skipped; a differentiable one is recomputed (3 more calls).
    import chatgym.trainer.learner.logprobs as logprobs_module

    calls = []
    entropy = logprobs_module.entropy_from_logits
    monkeypatch.setattr(logprobs_module, "entropy_from_logits", lambda z: calls.append(1) or entropy(z))
    gen = torch.Generator().manual_seed(2)
    hidden = torch.randn(6, 3, generator=gen).requires_grad_()
    weight = torch.randn(5, 3, generator=gen).requires_grad_()
    targets = torch.randint(0, 5, (6,), generator=gen)
    for entropy_grad, recomputed in ((False, 0), (True, 3)):
        calls.clear()
        lp, ent = chunked_token_logprobs(
            hidden, weight, None, targets, chunk_tokens=2, with_entropy=True, entropy_grad=entropy_grad
        )
        assert len(calls) == 3
        (lp.sum() + (ent.sum() if entropy_grad else 0)).backward()
        assert len(calls) == 3 + recomputed


def test_chunk_tokens_below_one_is_refused():
    with pytest.raises(ValueError, match=r"^chunk_tokens must be >= 1, got 0$"):
        chunked_token_logprobs(
            torch.zeros(2, 3), torch.zeros(4, 3), None, torch.zeros(2, dtype=torch.long), chunk_tokens=0
        )


# ---------------------------------------------------------------------------------------- memory


def saved_storages(fn):
    """Run ``fn`` under saved_tensors_hooks; returns (its result, {storage pointer: (bytes, shapes)}) of
    every tensor autograd saved for the backward (views of one storage counted once)."""
    saved: dict[int, tuple[int, list[tuple[int, ...]]]] = {}

    def pack(t):
        storage = t.untyped_storage()
        nbytes, shapes = saved.get(storage.data_ptr(), (storage.nbytes(), []))
        saved[storage.data_ptr()] = (nbytes, [*shapes, tuple(t.shape)])
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = fn()
    return out, saved


@pytest.mark.parametrize("with_entropy", [False, True])
def test_chunked_head_saves_only_its_inputs(with_entropy):
    # N = 64 positions, H = 16, V = 1000. The plain head keeps the (N, V) float32 logits (and the
    # log-softmax's output) for the backward: >= N*V*4 = 256,000 bytes. The chunked head runs each
    # chunk under checkpoint, which saves the chunk's inputs only: views of hidden, the weight, views
    # of targets -- exactly the storages hidden (N*H*4 = 4,096 bytes), weight (V*H*4 = 64,000, the
    # model's own parameter) and targets (N*8 = 512), 68,608 bytes in all; no tensor of V columns.
    n, h, v = 64, 16, 1000
    gen = torch.Generator().manual_seed(0)
    hidden = torch.randn(n, h, generator=gen).requires_grad_()
    weight = torch.randn(v, h, generator=gen).requires_grad_()
    targets = torch.randint(0, v, (n,), generator=gen)

    def plain():
        logits = torch.nn.functional.linear(hidden, weight)
        lp, _ = token_logprobs(
            logits[None], torch.cat([targets[:1], targets])[None], with_entropy=with_entropy
        )
        return lp

    _, plain_saved = saved_storages(plain)
    weight_ptr = weight.untyped_storage().data_ptr()  # the matmul saves it transposed, (H, V)
    v_columns = sum(
        b for ptr, (b, shapes) in plain_saved.items() if ptr != weight_ptr and any(s[-1] == v for s in shapes)
    )
    assert v_columns >= n * v * 4

    kw = {"chunk_tokens": 10, "with_entropy": with_entropy, "entropy_grad": True}
    (lp, ent), chunked_saved = saved_storages(
        lambda: chunked_token_logprobs(hidden, weight, None, targets, **kw)
    )
    assert not any(s[-1] == v for _, shapes in chunked_saved.values() for s in shapes)
    assert set(chunked_saved) == {t.untyped_storage().data_ptr() for t in (hidden, weight, targets)}
    assert sum(b for b, _ in chunked_saved.values()) == n * h * 4 + v * h * 4 + n * 8 == 68608
    # 7 chunks (6 of 10, one of 4), each saving its 3 inputs.
    assert sum(len(shapes) for _, shapes in chunked_saved.values()) == 7 * 3
    (lp.sum() + (ent.sum() if with_entropy else 0)).backward()  # the backward recomputes and works
    assert hidden.grad is not None and weight.grad is not None


def test_model_forward_keeps_no_logits_when_chunked(tiny_model):
    # The padded forward of _group_batch: 6 rows, K = 10 kept positions (first trained position 3),
    # 6 * 9 = 54 scored positions. Plain: the (6, 10, 49152) float32 logits are saved (>= 54 * V * 4
    # bytes = 10.6 MB). Chunked: no saved tensor has V columns but views of the (V, 64) lm-head weight
    # itself (a matmul saves it transposed, (64, V)): no new memory.
    batch = _group_batch()
    weight = tiny_model.lm_head.weight.untyped_storage().data_ptr()

    def v_column_bytes(saved):
        return sum(
            b for ptr, (b, shapes) in saved.items() if ptr != weight and any(s[-1] == V_SMOL for s in shapes)
        )

    kw = {"with_entropy": True, "entropy_grad": True}
    _, plain = saved_storages(lambda: forward_logprobs(tiny_model, batch, **kw))
    _, chunked = saved_storages(lambda: forward_logprobs(tiny_model, batch, **kw, chunk_tokens=16))
    assert v_column_bytes(plain) >= 54 * V_SMOL * 4
    assert v_column_bytes(chunked) == 0
    # The body saves the same tensors either way (the chunked path adds a (54, 64) copy of the
    # hidden states and the targets), so the chunked forward saves at least the logits less.
    total = lambda saved: sum(b for b, _ in saved.values())  # noqa: E731
    assert total(plain) - total(chunked) >= 54 * V_SMOL * 4


# ----------------------------------------------------------------------------- each layout == plain


def layout_call(layout, model, batch, chunk):
    kw = {"with_entropy": True, "entropy_grad": True, "chunk_tokens": chunk}
    if layout == "padded":
        return forward_logprobs(model, batch, **kw)
    if layout == "shared":  # rows ordered as the shared-prompt plan orders them
        return forward_logprobs_shared(model, batch, 6, **kw)
    return forward_logprobs_packed(model, batch, 4, max_tokens=10, **kw)


def layout_batch(layout):
    batch = _group_batch()
    if layout == "shared":
        return batch.select([4, 3, 0, 2, 1, 5])
    if layout == "packed":  # one group sharing its 4-token prompt, in packs of <= 10 tokens: 2 packs
        return batch.select([0, 1, 2])
    return batch


def loss_of(lp, ent, mask):
    # A token-mean policy-gradient-like loss with an entropy bonus (as the update builds it).
    adv = torch.linspace(-1, 1, mask.shape[0])[:, None]
    return -(lp * adv)[mask].mean() - 0.01 * ent[mask].mean()


# Scored positions per forward: padded 6 rows x 9 = [54]; shared 6 rows x a span of 6 = [36];
# packed, the group's 4-token prompt + answers of 5, 2, 4 tokens in packs of <= 10 tokens: [5, 6].
SCORED = {"padded": [54], "shared": [36], "packed": [5, 6]}


def split(n, chunk):
    return [chunk] * (n // chunk) + ([n % chunk] if n % chunk else [])


# Chunks that divide (1; 4 of 36; 5 of the first pack; 54) and do not divide the position counts.
@pytest.mark.parametrize("layout", ["padded", "shared", "packed"])
@pytest.mark.parametrize("chunk", [1, 4, 5, 7, 54, 4096])
def test_layout_logprobs_and_gradients_equal_the_plain_path(tiny_model, layout, chunk, monkeypatch):
    import chatgym.trainer.learner.logprobs as logprobs_module

    head_chunk = logprobs_module._head_chunk
    calls = []  # rows of every chunk the head computes, forward and recomputed in the backward

    def recorded(hidden, *args):
        calls.append(hidden.shape[0])
        return head_chunk(hidden, *args)

    monkeypatch.setattr(logprobs_module, "_head_chunk", recorded)
    batch = layout_batch(layout)
    mask = batch.loss_mask
    results = []
    for c in (None, chunk):
        model = copy.deepcopy(tiny_model)
        lp, ent = layout_call(layout, model, batch, c)
        forward_calls = list(calls)
        loss_of(lp, ent, mask).backward()
        results.append((lp.detach(), ent.detach(), grads(model)))
    # Each forward chunk holds <= chunk positions and the backward recomputes each chunk once.
    assert forward_calls == [rows for n in SCORED[layout] for rows in split(n, chunk)]
    assert sorted(calls[len(forward_calls) :]) == sorted(forward_calls)
    (lp0, ent0, g0), (lp1, ent1, g1) = results
    # fp32: the same products in another GEMM blocking. Measured on a 2-core EPYC (1 and 2 threads):
    # logprobs and entropies at most 9.5e-7 apart (one ulp), gradients at most 1.0e-6.
    torch.testing.assert_close(lp1[mask], lp0[mask], rtol=ULP, atol=1e-6)
    torch.testing.assert_close(ent1[mask], ent0[mask], rtol=ULP, atol=1e-6)
    assert set(g1) == set(g0)
    moved = max(float(g.abs().max()) for g in g0.values())
    assert moved > 1e-3  # a gradient worth comparing
    for name in g0:
        torch.testing.assert_close(g1[name], g0[name], rtol=0, atol=1e-5, msg=name)


@pytest.mark.parametrize(
    "layout", ["padded", "packed"]
)  # (padded sharing needs the KV cache checkpointing drops)
def test_under_gradient_checkpointing_of_the_body(tiny_model, layout):
    # The body's layers recompute in the backward; the decoder's forward (and the hook that takes its
    # output) runs once, so the chunked head sees the same hidden states: the plain path's gradient.
    batch = layout_batch(layout)
    mask = batch.loss_mask
    plain = copy.deepcopy(tiny_model)
    loss_of(*layout_call(layout, plain, batch, None), mask).backward()
    model = copy.deepcopy(tiny_model)
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    assert model.model.gradient_checkpointing
    loss_of(*layout_call(layout, model, batch, 5), mask).backward()
    want, got = grads(plain), grads(model)
    assert set(got) == set(want)
    for name in want:
        torch.testing.assert_close(got[name], want[name], rtol=0, atol=1e-5, msg=name)


def test_no_grad_pass_equals_the_plain_path(tiny_model):
    # The reference / old-logprob passes: no graph, the chunks just bound the live logits.
    batch = _group_batch()
    with torch.no_grad():
        for layout in ("padded", "shared", "packed"):
            b = layout_batch(layout)
            plain, _ = layout_call(layout, tiny_model, b, None)
            chunked, _ = layout_call(layout, tiny_model, b, 5)
            torch.testing.assert_close(chunked[b.loss_mask], plain[b.loss_mask], rtol=ULP, atol=1e-6)
            assert not chunked.requires_grad
    assert batch.loss_mask.any()


def lora_model(tiny_model, targets):
    from peft import LoraConfig, get_peft_model

    model = get_peft_model(copy.deepcopy(tiny_model), LoraConfig(r=4, lora_alpha=8, target_modules=targets))
    with torch.no_grad():  # LoRA's B starts at 0 (adapter = identity): make the adapters matter
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=torch.Generator().manual_seed(len(name))) * 0.5)
    return model.train()


def test_lora_on_the_body_equals_the_plain_path_adapters_on_and_off(tiny_model):
    pytest.importorskip("peft")
    batch = _group_batch()
    mask = batch.loss_mask
    results = []
    lora = lora_model(tiny_model, ["q_proj", "v_proj", "down_proj"])  # A is drawn at random: build once
    for chunk in (None, 7):
        model = copy.deepcopy(lora)
        lp, ent = forward_logprobs(model, batch, with_entropy=True, entropy_grad=True, chunk_tokens=chunk)
        loss_of(lp, ent, mask).backward()
        with torch.no_grad(), model.disable_adapter():  # the LoRA run's KL reference
            ref, _ = forward_logprobs(model, batch, with_entropy=False, chunk_tokens=chunk)
        results.append((lp.detach(), ref, {n: g for n, g in grads(model).items() if "lora_" in n}))
        assert chunked_head_refusal(model) is None
    (lp0, ref0, g0), (lp1, ref1, g1) = results
    torch.testing.assert_close(lp1[mask], lp0[mask], rtol=ULP, atol=1e-6)
    torch.testing.assert_close(ref1[mask], ref0[mask], rtol=ULP, atol=1e-6)
    assert (ref0[mask] - lp0[mask]).abs().max() > 1e-3  # adapters off is another model
    assert len(g0) == 12 and set(g1) == set(g0)  # 3 modules x 2 layers x (A, B)
    for name in g0:
        torch.testing.assert_close(g1[name], g0[name], rtol=0, atol=1e-5, msg=name)


def test_a_vlm_chunks_its_text_micro_batches_and_keeps_the_plain_head_with_images(monkeypatch):
    # SmolVLM (Idefics3): get_decoder() is its text model, whose output the lm head reads, so the
    # probe passes and a text-only micro-batch gets the plain logprobs; a micro-batch with images
    # takes the plain forward (policy_logprobs), so no chunk is computed for it.
    from test_vlm import tiny_vlm, trajectories
    from transformers import AutoTokenizer

    import chatgym.trainer.learner.logprobs as logprobs_module
    from chatgym.trainer.learner.batch import collate
    from chatgym.trainer.learner.forward import ForwardPlan, batch_logprobs
    from chatgym.trainer.models import vlm
    from chatgym.trainer.models.packaged import load_model_path

    model = tiny_vlm().train()
    assert chunked_head_refusal(model) is None
    batch = _group_batch()
    batch.input_ids = batch.input_ids % model.get_output_embeddings().weight.shape[0]
    with torch.no_grad():
        plain, _ = forward_logprobs(model, batch, with_entropy=False)
        chunked, _ = forward_logprobs(model, batch, with_entropy=False, chunk_tokens=5)
    torch.testing.assert_close(chunked[batch.loss_mask], plain[batch.loss_mask], rtol=ULP, atol=1e-6)

    calls = []
    head_chunk = logprobs_module._head_chunk
    monkeypatch.setattr(logprobs_module, "_head_chunk", lambda *a: calls.append(1) or head_chunk(*a))
    path = load_model_path("smolvlm")
    pixels = vlm.ImagePixels(vlm.load_image_processor(path))
    images = collate(trajectories(AutoTokenizer.from_pretrained(path)), pad_id=2, pixels=pixels)
    got = [
        batch_logprobs(model, images, ForwardPlan(micro_batch_size=2, logprob_chunk_tokens=c))
        for c in (None, 5)
    ]
    assert torch.equal(got[0], got[1]) and calls == []


def test_fsdp2_sharded_model_equals_the_plain_path(tiny_model, tmp_path):
    # FSDP2 over one gloo rank: the embedding, final norm and (tied) lm head live on the root module,
    # gathered by its forward hooks; the chunked head reads the weight after the root forward and the
    # root's gradients are reduce-scattered as usual. Two optimizer-less backward passes, as two
    # micro-batches of an update, with a no-grad pass before them (old logprobs).
    batch = _group_batch()
    mask = batch.loss_mask
    plain = copy.deepcopy(tiny_model)
    loss_of(*forward_logprobs(plain, batch, with_entropy=True, entropy_grad=True), mask).backward()
    want = grads(plain)
    with fsdp2_one_rank(copy.deepcopy(tiny_model), tmp_path) as model:
        with torch.no_grad():
            old, _ = forward_logprobs(model, batch, with_entropy=False, chunk_tokens=5)
        for _ in range(2):
            model.zero_grad(set_to_none=True)
            lp, ent = forward_logprobs(model, batch, with_entropy=True, entropy_grad=True, chunk_tokens=5)
            loss_of(lp, ent, mask).backward()
            got = {n: p.grad.full_tensor() for n, p in model.named_parameters()}
            assert set(got) == set(want)
            for name in want:
                torch.testing.assert_close(got[name], want[name], rtol=0, atol=1e-5, msg=name)
        torch.testing.assert_close(old[mask], lp.detach()[mask], rtol=ULP, atol=1e-6)


# ---------------------------------------------------------------------------------------- refusals


@pytest.mark.parametrize(
    ("override", "message"),
    [
        (
            "model.logprob_chunk_tokens=0",
            r"^model\.logprob_chunk_tokens must be >= 1 \(positions per lm-head chunk\) or unset, got 0$",
        ),
        (
            "model.logprob_chunk_tokens=-3",
            r"^model\.logprob_chunk_tokens must be >= 1 \(positions per lm-head chunk\) or unset, got -3$",
        ),
        ("model.logprob_chunk_tokens=many", r"^model\.logprob_chunk_tokens: .*'many'"),
    ],
)
def test_bad_chunk_values_fail_at_config_load(override, message):
    with pytest.raises(ConfigError, match=message):
        load_config(None, [override])


def test_lora_on_lm_head_fails_at_config_load():
    overrides = [
        "model.logprob_chunk_tokens=64",
        "lora.enabled=true",
        'lora.target_modules=["q_proj", "lm_head"]',
    ]
    with pytest.raises(ConfigError) as err:
        load_config(None, overrides)
    assert str(err.value) == (
        "model.logprob_chunk_tokens: lora.target_modules has lm_head, whose adapter the chunked head would "
        "skip (it multiplies by the base weight); drop one of the two"
    )
    assert load_config(None, overrides[1:]).model.logprob_chunk_tokens is None  # fine without chunking


def test_lora_on_lm_head_is_refused_because_the_chunked_head_would_drop_the_adapter(tiny_model):
    pytest.importorskip("peft")
    model = lora_model(tiny_model, ["q_proj", "lm_head"])
    assert chunked_head_refusal(model) == (
        "model.logprob_chunk_tokens: the output embedding of LlamaForCausalLM is a "
        "peft.tuners.lora.layer.Linear, "
        "not a plain torch.nn.Linear (LoRA on lm_head?); the chunked head multiplies by its weight alone"
    )
    # What it would get wrong: the base weight alone gives other logprobs than the adapted head.
    batch = _group_batch()
    with torch.no_grad():
        plain, _ = forward_logprobs(model, batch, with_entropy=False)
        chunked, _ = forward_logprobs(model, batch, with_entropy=False, chunk_tokens=8)
    assert (plain - chunked)[batch.loss_mask].abs().max() > 1e-2


def tiny_config_of(name, **fields):
    import transformers

    shape = {
        "vocab_size": 64,
        "hidden_size": 16,
        "intermediate_size": 32,
        "num_hidden_layers": 1,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
    }
    return getattr(transformers, name)(**shape, **fields)


@pytest.mark.parametrize(
    ("config_name", "fields", "untransformed", "message"),
    [
        (
            "Gemma2Config",
            {"head_dim": 8, "final_logit_softcapping": 30.0},
            {"final_logit_softcapping": None},
            "model.logprob_chunk_tokens: Gemma2ForCausalLM caps its logits with tanh after the lm head "
            "(final_logit_softcapping=30.0), which the chunked head does not do; "
            "leave it unset for this model",
        ),
        (
            "CohereConfig",  # always scales (logit_scale None fails in its own forward)
            {"logit_scale": 0.0625},
            None,
            "model.logprob_chunk_tokens: CohereForCausalLM scales its logits after the lm head "
            "(logit_scale=0.0625), which the chunked head does not do; leave it unset for this model",
        ),
        (
            # Not in the list of known fields: the probe forward finds logits / 4 != lm_head(hidden).
            "GraniteConfig",
            {"logits_scaling": 4.0},
            {"logits_scaling": 1.0},
            "model.logprob_chunk_tokens: GraniteForCausalLM's logits are not its lm head applied to its "
            "decoder's output (a probe forward differs); leave it unset for this model",
        ),
    ],
)
def test_models_whose_logits_are_not_the_heads_output_are_refused(
    config_name, fields, untransformed, message
):
    from chatgym.trainer.models.random_init import random_model

    model = random_model(tiny_config_of(config_name, **fields)).train()
    assert chunked_head_refusal(model) == message
    if untransformed is not None:  # the same architecture without the transform is accepted
        fine = random_model(tiny_config_of(config_name, **{**fields, **untransformed})).train()
        assert chunked_head_refusal(fine) is None


def test_the_refusal_probe_leaves_the_rng_alone(tiny_model):
    torch.manual_seed(5)
    expected = torch.rand(3)
    torch.manual_seed(5)
    assert chunked_head_refusal(tiny_model) is None
    assert torch.equal(torch.rand(3), expected)


def test_the_learner_refuses_at_build(tmp_path):
    from chatgym.trainer.learner.learner import Learner

    tiny_config_of("Gemma2Config", head_dim=8, final_logit_softcapping=30.0).save_pretrained(tmp_path)
    cfg = load_config(
        None,
        [
            f"model.path={tmp_path}",
            "model.random_init=true",
            "model.device=cpu",
            "model.logprob_chunk_tokens=32",
            "engine.backend=hf",
        ],
    )
    with pytest.raises(ConfigError, match=r"^model\.logprob_chunk_tokens: Gemma2ForCausalLM caps its logits"):
        Learner(cfg, types.SimpleNamespace(pad_token_id=0))


# ------------------------------------------------------------------------------------- a real step


def step_trajectories():
    """Two GRPO groups of three samples (different rewards: non-zero advantages), prompts of 4 and 6
    tokens, answers of 2-6 tokens."""
    gen = torch.Generator().manual_seed(11)
    out = []
    for group, n_prompt in ((0, 4), (1, 6)):
        prompt = torch.randint(0, V_SMOL, (n_prompt,), generator=gen).tolist()
        for i, n_gen in enumerate((5, 2, 6)):
            ids = prompt + torch.randint(0, V_SMOL, (n_gen,), generator=gen).tolist()
            mask = [0] * n_prompt + [1] * n_gen
            out.append(traj(ids, mask, reward=float(i), group=group, prompt_len=n_prompt))
    return out


@pytest.mark.parametrize("pack", ["true", "false"])
def test_a_learner_step_with_chunks_equals_the_plain_step(tmp_path, pack):
    # KL to a reference (a chunked no-grad pass), an entropy bonus (chunked entropy gradient), two
    # mini-batches (a chunked old-logprob pass), fp32. AdamW's first steps divide by sqrt(v), which
    # would blow a near-zero gradient's rounding up to ~lr: eps 1e-3 keeps each step ~ lr * g / eps.
    from chatgym.trainer.learner.learner import Learner

    base = [
        "model.random_init=true",
        "model.config_overrides=" + json.dumps(TINY_LLAMA),
        "model.device=cpu",
        "model.compute_dtype=float32",
        f"model.pack={pack}",
        "engine.backend=hf",
        "train.micro_batch_size=2",
        "algo.kl_coef=0.05",
        "algo.entropy_coef=0.01",
        "algo.mini_batches=2",
        "algo.tis_cap=null",
        "optim.lr=1e-3",
        "optim.eps=1e-3",
    ]
    results = []
    for chunk in ([], ["model.logprob_chunk_tokens=3"]):
        torch.manual_seed(0)
        learner = Learner(load_config(None, base + chunk), types.SimpleNamespace(pad_token_id=0))
        assert learner.plan.logprob_chunk_tokens == (3 if chunk else None)
        before = {n: p.detach().clone() for n, p in learner.policy.named_parameters()}
        metrics = learner.train_on(step_trajectories())
        results.append((metrics, {n: p.detach().clone() for n, p in learner.policy.named_parameters()}))
    (m0, w0), (m1, w1) = results
    assert m0["actor/optimizer_steps"] == m1["actor/optimizer_steps"] == 2
    for key in ("actor/pg_loss", "actor/kl", "actor/entropy", "actor/grad_norm"):
        assert m1[key] == pytest.approx(m0[key], rel=1e-5, abs=1e-7), key
    assert m0["actor/kl"] > 0  # the second mini-batch ran after a step: the reference pass mattered
    assert max(float((w0[n] - before[n]).abs().max()) for n in w0) > 1e-4
    for name in w0:
        torch.testing.assert_close(w1[name], w0[name], rtol=0, atol=1e-6, msg=name)


def test_the_learner_logs_the_chunk_setting(capsys):
    from chatgym.trainer.learner.learner import Learner

    cfg = load_config(None, ["engine.backend=hf", "model.logprob_chunk_tokens=256"])
    learner = Learner.__new__(Learner)  # only the compute set-up, no models
    learner.cfg, learner.device = cfg, torch.device("cpu")
    learner._set_up_compute()
    assert capsys.readouterr().err.endswith(
        ", packed micro-batches (<= 512 tokens), lm head in chunks of 256 positions\n"
    )
    learner.cfg = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, logprob_chunk_tokens=None))
    learner._set_up_compute()
    assert capsys.readouterr().err.endswith(", packed micro-batches (<= 512 tokens)\n")
