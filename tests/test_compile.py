"""``model.compile``: the learner's decoder layers under ``torch.compile`` (inductor, on the CPU here)
give the eager layers' logprobs, entropies and gradients in every forward layout, under gradient
checkpointing and in the no-grad pass; the policy keeps its weights' names; a model without a
decoder layer list is refused."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch
from test_chunked_logprobs import ULP, grads, layout_batch, layout_call, loss_of
from train_helpers import TINY_LLAMA, fsdp2_one_rank

from chatgym.trainer.config.run import ConfigError, LoraConfig, ModelConfig
from chatgym.trainer.learner.policy import compile_decoder_layers, load_policy


@pytest.fixture
def dynamo():
    """Dynamo's counters from zero, and its caches dropped after (no compiled code leaks into the
    other tests)."""
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    yield torch._dynamo.utils.counters
    torch._dynamo.reset()


def compiled_ran(counters) -> None:
    """The compiled path ran: dynamo compiled frames (the layer's, not one per layer) and none failed."""
    assert counters["frames"]["ok"] >= 1 and counters["frames"]["ok"] == counters["frames"]["total"]


def _compare(tiny_model, compiled, cases, checkpointing):
    """Each ``(layout, chunk)`` forward + backward on a fresh eager copy and on ``compiled``: fp32,
    inductor's fused kernels round differently; measured on a 2-core EPYC: logprobs within 1e-6,
    gradients within 1e-5 of the eager ones."""
    for layout, chunk in cases:
        batch = layout_batch(layout)
        mask = batch.loss_mask
        results = []
        for model in (copy.deepcopy(tiny_model), compiled):
            if checkpointing:
                model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
            model.zero_grad(set_to_none=True)
            lp, ent = layout_call(layout, model, batch, chunk)
            loss_of(lp, ent, mask).backward()
            results.append((lp.detach(), ent.detach(), grads(model)))
        (lp0, ent0, g0), (lp1, ent1, g1) = results
        where = f"{layout}, chunk {chunk}, checkpointing {checkpointing}"
        torch.testing.assert_close(lp1[mask], lp0[mask], rtol=ULP, atol=1e-6, msg=where)
        torch.testing.assert_close(ent1[mask], ent0[mask], rtol=ULP, atol=1e-6, msg=where)
        assert set(g1) == set(g0)
        for name in g0:
            torch.testing.assert_close(g1[name], g0[name], rtol=0, atol=1e-5, msg=f"{name} ({where})")


def test_compiled_layers_equal_the_eager_ones(tiny_model, dynamo):
    # ~25 s on 2 cores with inductor's cache empty (as in CI): the padded and the packed layouts (the
    # packed forward's other arguments compile the layer again), then the no-grad pass; the other
    # layouts are the slow test's.
    compiled = copy.deepcopy(tiny_model)
    assert compile_decoder_layers(compiled) == TINY_LLAMA["num_hidden_layers"]
    _compare(tiny_model, compiled, [("padded", None), ("packed", None)], checkpointing=False)
    compiled_ran(dynamo)
    with torch.no_grad():  # the old-logprob / reference pass
        batch = layout_batch("padded")
        want, _ = layout_call("padded", tiny_model, batch, None)
        got, _ = layout_call("padded", compiled, batch, None)
    torch.testing.assert_close(got[batch.loss_mask], want[batch.loss_mask], rtol=ULP, atol=1e-6)


def test_compiled_layers_take_other_batch_shapes_without_compiling_again(tiny_model, dynamo):
    """Regression (H100, vs-TRL step 5: 5.4 s): a padded batch of another length compiled the layers again."""
    compiled = copy.deepcopy(tiny_model)
    compile_decoder_layers(compiled)
    generator = torch.Generator().manual_seed(0)
    frames = []
    for shape in [(2, 7), (2, 9), (3, 12)]:
        ids = torch.randint(0, compiled.config.vocab_size, shape, generator=generator)
        compiled(input_ids=ids).logits.float().sum().backward()
        frames.append(dynamo["frames"]["ok"])
    assert frames[0] >= 1 and frames == [frames[0]] * 3


@pytest.mark.slow
def test_compiled_layers_with_the_chunked_head_and_under_gradient_checkpointing(tiny_model, dynamo):
    """~1 min on 2 cores (more graphs to compile): the shared-prompt layout, the chunked head's decoder
    call in each layout, then gradient checkpointing wrapping the compiled layers (padded, packed:
    checkpointing drops the shared prompt's KV cache)."""
    compiled = copy.deepcopy(tiny_model)
    compile_decoder_layers(compiled)
    _compare(tiny_model, compiled, [("shared", None), ("padded", 5), ("shared", 5), ("packed", 5)], checkpointing=False)
    _compare(tiny_model, compiled, [("padded", None), ("packed", 5)], checkpointing=True)
    compiled_ran(dynamo)


def test_load_policy_compiles_the_layers_and_keeps_the_weights_names(dynamo):
    cfg = ModelConfig(path="smollm2", random_init=True, config_overrides=TINY_LLAMA, device="cpu")
    plain = load_policy(cfg, LoraConfig(), torch.device("cpu"))
    compiled = load_policy(ModelConfig(**{**cfg.__dict__, "compile": True}), LoraConfig(), torch.device("cpu"))
    assert [layer._compiled_call_impl is not None for layer in compiled.model.layers] == [True, True]
    assert all(layer._compiled_call_impl is None for layer in plain.model.layers)
    assert list(compiled.state_dict()) == list(plain.state_dict())
    assert compiled.training


def test_a_model_without_a_decoder_layer_list_is_refused():
    class NoLayers(torch.nn.Module):
        def get_decoder(self):
            return torch.nn.Linear(2, 2)

    with pytest.raises(ConfigError, match=r"^model.compile: NoLayers has no decoder layer list \(get_decoder\(\).layers\) to compile$"):
        compile_decoder_layers(NoLayers())


def test_chatgym_train_refuses_compile_for_a_gpt2_in_one_line(tmp_path, capsys):
    # Regression: a model whose blocks are not get_decoder().layers (GPT-2: transformer.h) ended
    # chatgym train with an 11-frame traceback, rc 1, from the learner's build.
    from transformers import AutoTokenizer, GPT2Config, GPT2LMHeadModel

    from chatgym.trainer.models.packaged import load_model_path
    from chatgym.trainer.train_cli import main

    tokenizer = AutoTokenizer.from_pretrained(load_model_path("smollm2"))
    model_dir = tmp_path / "gpt2"
    ids = {"bos_token_id": tokenizer.bos_token_id, "eos_token_id": tokenizer.eos_token_id}
    config = GPT2Config(vocab_size=len(tokenizer), n_positions=512, n_embd=16, n_layer=1, n_head=2, **ids)
    GPT2LMHeadModel(config).save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir)
    capsys.readouterr()  # the save's progress bar
    out = tmp_path / "run"
    overrides = [f"model.path={model_dir}", "model.compile=true", "engine.backend=hf", "engine.options={}",
                 "train.max_steps=1", "train.prompts_per_step=2", "train.group_size=2", "env.eval_tasks=0"]
    config_file = Path(__file__).resolve().parent.parent / "examples" / "configs" / "math_grpo.yaml"
    assert main([str(config_file), "--output-dir", str(out), *overrides]) == 2
    err = capsys.readouterr().err  # after the start-up log and the weights' loading bar: one line
    assert err.endswith(
        "\nchatgym train: model.compile: GPT2LMHeadModel has no decoder layer list (get_decoder().layers) to compile\n"
    )
    assert "Traceback" not in err
    assert not out.exists()


@pytest.mark.slow
def test_compiled_layers_under_fsdp2_give_the_eager_gradients(tiny_model, dynamo, tmp_path):
    """FSDP2 over one gloo rank (as ``trainer.ray.learner_sharding: fsdp`` shards: each layer, then
    the model) around layers compiled first, as ``load_policy`` leaves them: two backward passes,
    gradients within 1e-5 of the eager model's (measured: 3.9e-8)."""
    from test_trainer import _group_batch

    from chatgym.trainer.learner.forward import forward_logprobs

    batch = _group_batch()
    mask = batch.loss_mask
    plain = copy.deepcopy(tiny_model)
    loss_of(*forward_logprobs(plain, batch, with_entropy=True, entropy_grad=True), mask).backward()
    want = grads(plain)
    compiled = copy.deepcopy(tiny_model)
    compile_decoder_layers(compiled)
    with fsdp2_one_rank(compiled, tmp_path) as model:
        for _ in range(2):
            model.zero_grad(set_to_none=True)
            loss_of(*forward_logprobs(model, batch, with_entropy=True, entropy_grad=True), mask).backward()
            got = {n: p.grad.full_tensor() for n, p in model.named_parameters()}
            assert set(got) == set(want)
            for name in want:
                torch.testing.assert_close(got[name], want[name], rtol=0, atol=1e-5, msg=name)
    compiled_ran(dynamo)
