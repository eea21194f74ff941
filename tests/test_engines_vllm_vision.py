"""The in-process vLLM engine on the SmolVLM-shaped ``smolvlm`` with images (slow: vLLM starts in ~1 min
on 2 cores; ``-m gpu``: the same checks on CUDA in bf16).

vLLM is given the prompt with each image run collapsed to one ``<image>`` id and expands it again with
its own processor (``trainer/engines/vllm_vision.py``); these tests check the prompt vLLM reports
equals ours, and that its raw logprobs equal transformers' own forward over the same ids and pixels
(``Idefics3ForConditionalGeneration(input_ids, pixel_values)``), before and after weight syncs that
change the connector and the vision tower. CPU: float32, the tolerance of the text-only vLLM tests
(``tests/test_engines_vllm.py``); GPU: bf16 on both sides, the bf16 tolerance of the hf engine's GPU
tests (0.1 per logprob).
"""

from __future__ import annotations

import asyncio

import pytest
import torch
from PIL import Image

from chatgym.trainer.engines import SamplingParams
from chatgym.trainer.engines.hf import TransformersEngine
from chatgym.trainer.models import packaged, vlm
from chatgym.trainer.models.packaged import load_model_path

pytest.importorskip("vllm", reason="needs vLLM: pip install 'chatgym[vllm]' (see scripts/setup.sh)")

CPU_ATOL = 2e-4  # tests/test_engines_vllm.py: vLLM's CPU kernels vs PyTorch in fp32 (measured <= 4e-5)
# bf16 on both sides, different kernels (vLLM's attention and fused ops vs transformers' eager layers),
# with a random 4-layer vision tower in front: measured on the H200 (vLLM 0.26) up to 0.122 over 8
# sampled tokens, where the text-only bf16 tolerance (tests/test_engines_hf_continuous.py) is 0.1.
GPU_ATOL = 0.25
CONNECTOR = "model.connector.modality_projection.proj.weight"
TOWER = "model.vision_model.encoder.layers.0.mlp.fc1.weight"


def pictures():
    """A non-square red picture (resized by the processor) and a 128 x 128 noise picture."""
    red = Image.new("RGB", (64, 40), (230, 20, 20))
    noise = Image.frombytes("RGB", (128, 128), bytes((i * 97 + 13) % 251 for i in range(128 * 128 * 3)))
    return red, noise


def image_run(tokenizer):
    """The ids one image expands to (built by hand): <fake><global-img> 16 x <image> <fake>."""
    fake, glob, image = tokenizer.convert_tokens_to_ids([vlm.FAKE_IMAGE_TOKEN, vlm.GLOBAL_IMAGE_TOKEN, vlm.IMAGE_TOKEN])
    return [fake, glob, *[image] * 16, fake]


def prompt(tokenizer):
    enc = lambda text: tokenizer(text, add_special_tokens=False).input_ids  # noqa: E731
    return enc("Look:") + image_run(tokenizer) + enc(" and") + image_run(tokenizer) + enc(" Which is red?")


def forward_logprobs(model, ids, images, pixels, device):
    """Logprobs of ``ids[1:]`` from transformers' own forward with the images' pixel values."""
    values, masks = pixels(images)
    dtype = next(model.parameters()).dtype
    with torch.no_grad():
        logits = model(
            input_ids=torch.tensor([ids], device=device),
            pixel_values=values[None].to(device, dtype),
            pixel_attention_mask=masks[None].to(device),
        ).logits[0].float().cpu()
    return torch.log_softmax(logits[:-1], -1).gather(1, torch.tensor(ids[1:])[:, None])[:, 0]


def check_against_forward(engine, model, pixels, device, atol, seed):
    """One sampled completion with both images; its logprobs against the forward. Returns them."""
    tokenizer = engine.tokenizer
    ids, images = prompt(tokenizer), list(pictures())
    out = asyncio.run(engine.generate(ids, SamplingParams(max_tokens=8, temperature=1.0, seed=seed), images=images))
    assert out.info["prompt_tokens"] == len(ids)  # vLLM's prompt is ours (it fails the request otherwise)
    assert len(out.token_ids) == len(out.logprobs) > 0
    want = forward_logprobs(model, ids + out.token_ids, images, pixels, device)[len(ids) - 1 :]
    got = torch.tensor(out.logprobs)
    assert torch.allclose(got, want, atol=atol), (got - want).abs().max()
    return out, got


def sync_checks(engine, model, pixels, device, atol):
    """Greedy ids are the forward's best (on the CPU: the hf engine's, exactly); then weight syncs
    that change the connector, then the vision tower, are followed exactly (vLLM's cached vision
    features of the same images are not reused); the original weights bring the logprobs back."""
    ids, images = prompt(engine.tokenizer), list(pictures())
    greedy = SamplingParams(max_tokens=6, temperature=0)
    mine = asyncio.run(engine.generate(ids, greedy, images=images))
    values, masks = pixels(images)
    dtype = next(model.parameters()).dtype
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([ids + mine.token_ids], device=device),
                       pixel_values=values[None].to(device, dtype), pixel_attention_mask=masks[None].to(device)).logits
    ref = torch.log_softmax(logits[0, len(ids) - 1 : -1].float().cpu(), -1)
    chosen = ref.gather(1, torch.tensor(mine.token_ids)[:, None])[:, 0]
    assert (chosen >= ref.max(-1).values - atol).all()  # bf16 near-ties may flip an argmax on a GPU
    if device == "cpu":
        hf = TransformersEngine(model, engine.tokenizer, max_model_len=256, image_processor=pixels.image_processor)
        theirs = asyncio.run(hf.generate(ids, greedy, images=images))
        assert mine.token_ids == theirs.token_ids
        assert torch.allclose(torch.tensor(mine.logprobs), torch.tensor(theirs.logprobs), atol=atol)

    _, before = check_against_forward(engine, model, pixels, device, atol, seed=3)
    original = {k: v.detach().clone() for k, v in model.state_dict().items()}
    last = before
    for name, factor in ((CONNECTOR, 3.0), (TOWER, -2.0)):
        with torch.no_grad():
            model.state_dict()[name].mul_(factor)
        engine.update_weights(model.state_dict())
        _, after = check_against_forward(engine, model, pixels, device, atol, seed=3)
        assert (after - last).abs().max() > 0.01  # the change reached the sampled logprobs (same engine: no noise)
        last = after
    model.load_state_dict(original)
    engine.update_weights(iter(original.items()))
    _, back = check_against_forward(engine, model, pixels, device, atol, seed=3)
    assert torch.allclose(back, before, atol=atol)


def make_engine(dtype):
    from chatgym.trainer.engines.vllm_inproc import VLLMEngine

    # kv_cache_gib sizes the cache on CPU only; on a GPU other tests' engines may still hold memory, so
    # a share of it (vLLM's default 0.92 is refused when less than that is free).
    memory = {"gpu_memory_utilization": 0.2} if torch.cuda.is_available() else {"kv_cache_gib": 1}
    return VLLMEngine("smolvlm", dtype=dtype, enforce_eager=True, max_model_len=1024, **memory)


@pytest.mark.slow
def test_vllm_with_images_equals_a_full_forward_and_follows_vision_weight_syncs():
    engine = make_engine("float32")
    try:
        assert engine.vision is not None and engine.vocab_size == 49192
        model = packaged.load_model("smolvlm").float().eval()
        pixels = vlm.ImagePixels(vlm.load_image_processor(load_model_path("smolvlm")))
        check_against_forward(engine, model, pixels, "cpu", CPU_ATOL, seed=5)
        sync_checks(engine, model, pixels, "cpu", CPU_ATOL)
    finally:
        asyncio.run(engine.close())


@pytest.mark.gpu
def test_vllm_with_images_on_cuda_equals_a_full_forward_within_bf16():
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    engine = make_engine("bfloat16")
    try:
        model = packaged.load_model("smolvlm").to("cuda", torch.bfloat16).eval()
        pixels = vlm.ImagePixels(vlm.load_image_processor(load_model_path("smolvlm")))
        check_against_forward(engine, model, pixels, "cuda", GPU_ATOL, seed=5)
        sync_checks(engine, model, pixels, "cuda", GPU_ATOL)
    finally:
        asyncio.run(engine.close())
