"""The fused decode step (trainer/engines/hf_fused.py): the static slots' step on concatenated weights
gives the logits of full forward passes of the model (fp32, so only summation order differs) for
Llama, Qwen2 (q/k/v biases) and Qwen3 (per-head q/k norms); its weight copies follow in-place updates;
models it cannot run are named and decoded through their own layers."""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig, Qwen2Config, Qwen3Config

from chatgym.trainer.chat.tokenizer import get_tokenizer
from chatgym.trainer.engines import SamplingParams
from chatgym.trainer.engines.hf import TransformersEngine
from chatgym.trainer.engines.hf_fused import fusable
from chatgym.trainer.engines.hf_static import StaticSlots
from chatgym.trainer.models.random_init import random_model

SHAPE = dict(num_hidden_layers=2, hidden_size=64, intermediate_size=128, num_attention_heads=4,
             num_key_value_heads=2, head_dim=16, vocab_size=320, max_position_embeddings=256)
ATOL = 2e-5  # fp32 logits of magnitude ~1: summation order only


def tiny(config_class, device="cpu", seed=3, **overrides):
    """A random model; biases and norm weights (initialised to 0 and 1) drawn too, so that a step
    which dropped a bias or used the wrong norm's weight would give other logits."""
    model = random_model(config_class(**{**SHAPE, **overrides}), device=device, seed=seed)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("bias") or "norm" in name:
                base = 0.0 if name.endswith("bias") else 1.0
                param.copy_(base + 0.5 * torch.randn(param.shape, generator=generator))
    return model.eval()


def full_forward_logits(model, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return model(torch.tensor([ids], device=model.device)).logits[0, -1].float()


def decode_sequence(slots: StaticSlots, prompts: list[list[int]], steps: int) -> dict[int, list]:
    """Prefill ``prompts``, decode ``steps`` greedy steps with row 1 leaving after step 2; returns each
    prompt's (ids so far, logits) before every token it took."""
    seen: dict[int, list] = {i: [] for i in range(len(prompts))}
    ids = {i: list(p) for i, p in enumerate(prompts)}
    running = list(range(len(prompts)))
    with torch.inference_mode():
        logits = slots.admit(prompts, pad_id=0).float()
        for step in range(steps):
            tokens = logits.argmax(-1)
            for r, i in enumerate(running):
                seen[i].append((list(ids[i]), logits[r].clone()))
                ids[i].append(int(tokens[r]))
            if step == 2:
                slots.select([0, 2])
                tokens, running = tokens[[0, 2]], [running[0], running[2]]
            slots.set_tokens(tokens)
            logits = slots.decode().float()
    return seen


@pytest.mark.parametrize("config_class", [LlamaConfig, Qwen2Config, Qwen3Config], ids=["llama", "qwen2", "qwen3"])
def test_the_fused_step_gives_the_logits_of_full_forward_passes(config_class):
    model = tiny(config_class)
    slots = StaticSlots(model, max_rows=4, max_len=96, use_graphs=False)
    assert slots.fused is not None and slots.unfused_reason == ""
    seen = decode_sequence(slots, [[1, 5, 9, 200, 3], [7, 8], list(range(11, 40))], steps=6)
    assert [len(v) for v in seen.values()] == [6, 3, 6]
    for rows in seen.values():
        for ids, logits in rows:
            assert (logits - full_forward_logits(model, ids)).abs().max().item() < ATOL


def test_the_fused_step_equals_the_models_own_layers_step():
    model = tiny(LlamaConfig)
    prompts = [[4, 5, 6], list(range(20, 50)), [9]]
    fused = decode_sequence(StaticSlots(model, 4, 96, use_graphs=False), prompts, steps=5)
    layers_slots = StaticSlots(model, 4, 96, use_graphs=False, fused=False)
    assert layers_slots.fused is None and layers_slots.unfused_reason == "fused=False"
    layers = decode_sequence(layers_slots, prompts, steps=5)
    for i in fused:
        for (ids_a, a), (ids_b, b) in zip(fused[i], layers[i], strict=True):
            assert ids_a == ids_b and (a - b).abs().max().item() < ATOL


def test_the_fused_weights_follow_in_place_updates():
    model, other = tiny(LlamaConfig, seed=3), tiny(LlamaConfig, seed=4)
    slots = StaticSlots(model, 2, 64, use_graphs=False)
    prompt = [3, 1, 4, 1, 5]
    with torch.inference_mode():
        slots.admit([prompt], pad_id=0)
    assert slots.fused.refreshes == 0 and slots.fused.refresh() is False  # nothing changed: no copy
    slots.clear()
    with torch.no_grad():  # what TransformersEngine.update_weights does: copy_ into each parameter
        for name, tensor in other.state_dict().items():
            model.get_parameter(name).copy_(tensor)
    with torch.inference_mode():
        slots.admit([prompt], pad_id=0)
        slots.set_tokens(torch.tensor([7]))
        logits = slots.decode().float()[0]
    assert slots.fused.refreshes == 1
    assert (logits - full_forward_logits(other, [*prompt, 7])).abs().max().item() < ATOL


def test_models_it_cannot_run_are_named_and_decode_through_their_layers():
    gelu = tiny(LlamaConfig, hidden_act="gelu")
    assert fusable(gelu) == (False, "hidden_act 'gelu'")
    assert fusable(tiny(LlamaConfig, mlp_bias=True)) == (False, "layer 0: bias on o_proj or the MLP")
    lora_like = tiny(LlamaConfig)

    class Adapter(torch.nn.Linear):  # stands for a LoRA layer: its forward is not the plain matmul
        pass

    lora_like.model.layers[1].self_attn.v_proj.__class__ = Adapter
    assert fusable(lora_like) == (False, "layer 1: a projection is not a plain torch.nn.Linear")
    slots = StaticSlots(gelu, 4, 64, use_graphs=False)
    assert slots.fused is None and slots.unfused_reason == "hidden_act 'gelu'"
    seen = decode_sequence(slots, [[1, 2, 3], [4, 5], [6]], steps=3)
    for ids, logits in seen[0]:
        assert (logits - full_forward_logits(gelu, ids)).abs().max().item() < ATOL


async def test_the_engine_option_turns_the_fused_step_off():
    model, tokenizer = tiny(LlamaConfig, vocab_size=49152), get_tokenizer("smollm2")
    params = SamplingParams(max_tokens=5, temperature=0)
    outs = []
    for fused_step in (True, False):
        engine = TransformersEngine(model, tokenizer, decode="static", max_model_len=64, fused_step=fused_step)
        try:
            outs.append((await engine.generate([1, 2, 3, 4], params)).token_ids)
            assert (engine._slots.fused is not None) is fused_step
        finally:
            await engine.close()
    assert outs[0] == outs[1]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_fused_graphs_on_cuda_give_the_full_forward_logits():
    model = tiny(LlamaConfig, device="cuda")
    slots = StaticSlots(model, max_rows=4, max_len=128)
    assert slots.use_graphs and slots.fused is not None
    seen = decode_sequence(slots, [[1, 5, 9, 200, 3], [7, 8], list(range(11, 40))], steps=6)
    assert slots.graphs_captured >= 2 and not slots.capture_failures  # 4 rows then 2: two buckets
    for rows in seen.values():
        for ids, logits in rows:
            assert (logits - full_forward_logits(model, ids)).abs().max().item() < 1e-4  # TF32 off: fp32


def test_replaced_weights_and_modules_rebuild_the_step():
    """Regression: ``load_state_dict(assign=True)`` gives the model new Parameter
    objects; the fused copies followed the old ones (logits 0.836 from the new model's forward)."""
    model, other = tiny(LlamaConfig, seed=3), tiny(LlamaConfig, seed=4)
    slots = StaticSlots(model, 2, 64, use_graphs=False)
    prompt = [3, 1, 4, 1, 5]
    with torch.inference_mode():
        slots.admit([prompt], pad_id=0)
    slots.clear()
    model.load_state_dict(other.state_dict(), assign=True)
    with torch.inference_mode():
        logits = slots.admit([prompt], pad_id=0).float()[0]
    assert slots.rebuilds == 1 and slots.fused is not None
    assert (logits - full_forward_logits(other, prompt)).abs().max().item() < ATOL
    slots.clear()

    class Adapter(torch.nn.Linear):  # a module wrapped in after the slots were made (LoRA-like)
        def forward(self, x):
            return super().forward(x) * 2

    v_proj = model.model.layers[0].self_attn.v_proj
    adapter = Adapter(v_proj.in_features, v_proj.out_features, bias=False)
    with torch.no_grad():
        adapter.weight.copy_(v_proj.weight)
    model.model.layers[0].self_attn.v_proj = adapter
    with torch.inference_mode():
        logits = slots.admit([prompt], pad_id=0).float()[0]
    assert slots.rebuilds == 2 and slots.fused is None
    assert slots.unfused_reason == "layer 0: a projection is not a plain torch.nn.Linear"
    assert (logits - full_forward_logits(model, prompt)).abs().max().item() < ATOL


def test_inference_tensor_weights_written_in_place_are_followed():
    """Inference tensors keep no version counter, and can be written in place inside
    ``inference_mode``: the fused copies are then refreshed whenever rows join an idle engine."""
    model, other = tiny(LlamaConfig, seed=3), tiny(LlamaConfig, seed=4)
    with torch.inference_mode():
        for name, param in list(model.named_parameters()):
            owner, attr = model.get_submodule(name.rpartition(".")[0]), name.rpartition(".")[2]
            setattr(owner, attr, torch.nn.Parameter(param.detach().clone(), requires_grad=False))
    assert model.model.layers[0].self_attn.q_proj.weight.is_inference()
    slots = StaticSlots(model, 2, 64, use_graphs=False)
    prompt = [2, 7, 1, 8]
    with torch.inference_mode():
        slots.admit([prompt], pad_id=0)
        slots.clear()
        for name, tensor in other.state_dict().items():
            model.get_parameter(name).copy_(tensor)
        logits = slots.admit([prompt], pad_id=0).float()[0]
    assert slots.rebuilds == 0 and slots.fused.refreshes == 2  # no version counter: copied each time
    assert (logits - full_forward_logits(other, prompt)).abs().max().item() < ATOL


def test_fusable_refuses_partial_qk_norms_and_sliding_windows():
    qwen3 = tiny(Qwen3Config)
    qwen3.model.layers[1].self_attn.k_norm = None
    assert fusable(qwen3) == (False, "layer 1: q/k norms do not match model_type 'qwen3'")
    windowed = tiny(Qwen3Config, sliding_window=16, use_sliding_window=True)
    assert fusable(windowed) == (False, "sliding-window attention")


@pytest.mark.parametrize("rope_type", ["dynamic", "longrope"])
def test_static_slots_refuse_rope_that_depends_on_the_sequence_length(rope_type):
    from chatgym.trainer.engines.hf_static import supports

    scaling = {"rope_type": rope_type, "factor": 2.0}
    if rope_type == "longrope":  # per-dimension factors, head_dim / 2 of each
        scaling = {**scaling, "short_factor": [1.0] * 8, "long_factor": [2.0] * 8,
                   "original_max_position_embeddings": 128}
    model = tiny(LlamaConfig, rope_scaling=scaling)
    assert supports(model) == (False, f"RoPE type {rope_type!r} (its scaling depends on the sequence length)")


async def test_engine_weight_updates_refresh_in_place_without_a_rebuild():
    """``update_weights`` copies in place: the fused copies are refreshed once, nothing is rebuilt (a
    rebuild on CUDA would drop and recapture every graph), and the ids are the new weights' greedy ids."""
    model, other = tiny(LlamaConfig, vocab_size=49152, seed=3), tiny(LlamaConfig, vocab_size=49152, seed=4)
    engine = TransformersEngine(model, get_tokenizer("smollm2"), decode="static", max_model_len=64)
    params, prompt = SamplingParams(max_tokens=4, temperature=0), [5, 6, 7]
    try:
        await engine.generate(prompt, params)
        engine.update_weights(other.state_dict())
        out = await engine.generate(prompt, params)
        await engine.generate(prompt, params)
    finally:
        await engine.close()
    assert engine._slots.rebuilds == 0 and engine._slots.fused.refreshes == 1
    ids = list(prompt)
    for _ in range(4):
        ids.append(int(full_forward_logits(other, ids).argmax()))
    assert out.token_ids == ids[len(prompt):]


def test_the_prefill_projects_the_real_tokens_only():
    """Prompts of 5, 2 and 29 tokens: each layer's projections see the 36 real tokens, not 3 x 29 padded
    ones (the prefill padded them all before); the logits match full forward passes, and the same prefill
    with the real tokens' indices left to it (computed from the lengths) writes the same cache columns."""
    model = tiny(Qwen2Config)
    prompts = [[1, 5, 9, 200, 3], [7, 8], list(range(11, 40))]
    slots = StaticSlots(model, max_rows=4, max_len=96, use_graphs=False)
    seen = []
    qkv = slots.fused._qkv
    slots.fused._qkv = lambda layer, hidden, *rest: (seen.append(hidden.shape[0]), qkv(layer, hidden, *rest))[1]
    with torch.inference_mode():
        logits = slots.admit(prompts, pad_id=0).float()
    assert seen == [36, 36]  # two layers
    width = 29
    ids = torch.zeros((3, width), dtype=torch.long)
    for i, p in enumerate(prompts):
        ids[i, : len(p)] = torch.tensor(p)
    lengths = torch.tensor([5, 2, 29])
    kv = torch.zeros_like(slots.kv)
    with torch.inference_mode():
        again = slots.fused.prefill(ids, lengths, [kv[0, i] for i in range(2)], [kv[1, i] for i in range(2)], 0)
    assert torch.equal(again.float(), logits)
    for i, n in enumerate(lengths.tolist()):
        assert torch.equal(kv[:, :, i, :, :n], slots.kv[:, :, i, :, :n])
    for i, p in enumerate(prompts):
        assert (logits[i] - full_forward_logits(model, p)).abs().max().item() < ATOL


@pytest.mark.parametrize("prompts,message", [([], "no prompts"), ([[4, 5], []], r"prompt\(s\) \[1\] empty")],
                         ids=["none", "an empty one"])
def test_admit_refuses_no_prompts_and_empty_ones(prompts, message):
    """An empty prompt has no last token to give logits at (the padded prefill read a padding column's)."""
    slots = StaticSlots(tiny(LlamaConfig), max_rows=4, max_len=32, use_graphs=False)
    with torch.inference_mode(), pytest.raises(ValueError, match=message):
        slots.admit(prompts, pad_id=0)
    assert slots.rows == 0


def test_admit_refuses_embeds_that_do_not_match_the_prompts():
    """Regression (second fresh-user walk): embeddings shorter than a prompt, or missing for one, were
    zero-filled without a word."""
    model = tiny(LlamaConfig)
    slots = StaticSlots(model, max_rows=4, max_len=32, use_graphs=False)
    prompts = [[4, 5, 6], [7, 8]]
    embeds = [model.model.embed_tokens(torch.tensor(p)).detach() for p in prompts]
    with torch.inference_mode():
        for bad in ([embeds[0][:2], embeds[1]], embeds[:1]):
            with pytest.raises(ValueError, match=r"embeds give \[.*\] rows for prompts of \[3, 2\] tokens"):
                slots.admit(prompts, pad_id=0, embeds=bad)
        assert slots.rows == 0
        slots.admit(prompts, pad_id=0, embeds=embeds)
    assert slots.rows == 2
