"""The vLLM engine's image requests without vLLM (``trainer/engines/vllm_vision.py``), and every engine
without vision refusing images with a ``ValueError`` that names it.

vLLM 0.32 re-expands every ``<image>`` id of a token prompt (one pre-expanded image: 22 ids in, 40 ids
out, measured), so the engine collapses each image's run to the one ``<image>`` id the template wrote
and lets vLLM expand it again, then compares vLLM's prompt ids with ours.
"""

from __future__ import annotations

import asyncio

import pytest
from PIL import Image

from chatgym.trainer.engines import SamplingParams
from chatgym.trainer.engines.common import refuse_images
from chatgym.trainer.engines.vllm_vision import VLLMImages, check_prompt_echo, vllm_prompt
from chatgym.trainer.models import vlm
from chatgym.trainer.models.packaged import load_model_path


@pytest.fixture(scope="module")
def vision():
    from transformers import AutoTokenizer

    path = load_model_path("smolvlm")
    return VLLMImages(path, AutoTokenizer.from_pretrained(path))


def ids_of(vision, *tokens):
    return vision.processor.tokenizer.convert_tokens_to_ids(list(tokens))


def pictures():
    return Image.new("RGB", (64, 40), (230, 20, 20)), Image.new("RGB", (128, 128), (5, 90, 200))


def test_each_image_run_becomes_the_one_image_id_vllm_expands(vision):
    fake, glob, image = ids_of(vision, vlm.FAKE_IMAGE_TOKEN, vlm.GLOBAL_IMAGE_TOKEN, vlm.IMAGE_TOKEN)
    assert image == vision.image_token_id == 49153
    run = [fake, glob, *[image] * 16, fake]  # the processor's expansion without splitting, by hand
    red, blue = pictures()
    assert list(vision.run(red)) == run == list(vision.run(blue))
    ids = [5, *run, 7, 8, *run, 9]
    request = vision.request(ids, [red, blue])
    assert request == {"prompt_token_ids": [5, image, 7, 8, image, 9], "multi_modal_data": {"image": [red, blue]}}
    assert request["multi_modal_data"]["image"][0] is red  # the caller's PIL objects, not copies
    # The same image twice is two runs and two items, in the prompt's order.
    assert vision.request([*run, *run], [blue, blue])["prompt_token_ids"] == [image, image]
    assert vllm_prompt(vision, ids, (red, blue)) == request
    # Text only: the ids as they are, no multimodal data (a VLM with no image this turn, or a text model).
    assert vllm_prompt(vision, [5, 6], ()) == {"type": "token", "prompt_token_ids": [5, 6]}
    assert vllm_prompt(None, [5, 6], []) == {"type": "token", "prompt_token_ids": [5, 6]}  # vLLM 0.32's tokens_input
    # Built from the processor the collector holds (passed as the engine's tokenizer), the same runs.
    from_processor = VLLMImages(load_model_path("smolvlm"), vision.processor)
    assert from_processor.request(ids, [red, blue]) == request


def test_a_prompt_whose_runs_do_not_match_its_images_is_refused(vision):
    fake, glob, image = ids_of(vision, vlm.FAKE_IMAGE_TOKEN, vlm.GLOBAL_IMAGE_TOKEN, vlm.IMAGE_TOKEN)
    run = [fake, glob, *[image] * 16, fake]
    red, blue = pictures()
    with pytest.raises(ValueError, match=r"run of images\[1\] \(19 ids.*do not match the 2 image\(s\)"):
        vision.request([5, *run, 6], [red, blue])
    with pytest.raises(ValueError, match=r"16 <image> id\(s\) \(id 49153\) outside the runs of the 0 image"):
        vision.request([5, *run, 6], [])
    with pytest.raises(ValueError, match=r"16 <image> id\(s\) .* outside the runs of the 1 image"):
        vision.request([5, *run, *run[1:-1], 6], [red])  # a second, headless run
    with pytest.raises(TypeError, match=r"images\[0\] must be a PIL\.Image\.Image, got str"):
        vision.request([5, *run], ["red.png"])
    with pytest.raises(ValueError, match=r"VLLMEngine: 1 image.*no vision tower"):
        vllm_prompt(None, [5, 6], [red])


def test_vllms_prompt_ids_must_equal_ours():
    # Regression: vLLM's re-expansion of a pre-expanded prompt (22 ids became 40) would have sampled
    # from another prompt than the trajectory records; the request fails instead.
    check_prompt_echo(None, [1, 2, 3])  # text only: nothing to compare
    check_prompt_echo([1, 2, 3], (1, 2, 3))
    with pytest.raises(RuntimeError, match=r"\(5 vs 3 ids, first difference at 1: \[9, 9, 2, 3\] vs \[2, 3\]\)"):
        check_prompt_echo([1, 2, 3], [1, 9, 9, 2, 3])
    with pytest.raises(RuntimeError, match=r"\(2 vs 3 ids, first difference at 2: \[\] vs \[3\]\)"):
        check_prompt_echo([1, 2, 3], [1, 2])


def test_refuse_images_counts_what_it_was_given():
    refuse_images("E", ())
    refuse_images("E", None)
    refuse_images("E", [])
    with pytest.raises(ValueError, match=r"^E: 2 image\(s\) given, but its model takes token ids only$"):
        refuse_images("E", iter(pictures()))


def engines_without_vision():
    from transformers import AutoTokenizer

    from chatgym.testing import ScriptedEngine
    from chatgym.trainer.engines.openai_chat import OpenAIChatEngine
    from chatgym.trainer.engines.replay import ReplayEngine
    from chatgym.trainer.engines.sglang_server import SGLangServerEngine
    from chatgym.trainer.engines.vllm_server import VLLMServerEngine

    tok = AutoTokenizer.from_pretrained(load_model_path("smollm2"))
    return {
        "ReplayEngine": ReplayEngine(lambda ids: [5, 2]),
        "ScriptedEngine": ScriptedEngine(tok),
        "SGLangServerEngine": SGLangServerEngine("smollm2", "http://127.0.0.1:9"),
        "VLLMServerEngine": VLLMServerEngine("smollm2", "http://127.0.0.1:9"),
        "OpenAIChatEngine": OpenAIChatEngine("smollm2", base_url="http://127.0.0.1:9/v1", api_key="x"),
    }


def test_every_engine_without_vision_refuses_images_before_any_request():
    # Port 9 has no server: a refusal that came after a request would be a connection error instead.
    params = SamplingParams(max_tokens=2)
    why = {
        "ReplayEngine": "a scripted engine reads token ids only",
        "ScriptedEngine": "a scripted engine reads token ids only",
        "SGLangServerEngine": "this engine sends token ids only",
        "VLLMServerEngine": r"vLLM's /v1/completions takes token prompts without images",
        "OpenAIChatEngine": r"a chat API takes images as message parts, through chat\(\)",
    }
    for name, engine in engines_without_vision().items():
        with pytest.raises(ValueError, match=rf"^{name}: 1 image\(s\) given, but {why[name]}"):
            asyncio.run(engine.generate([1, 2], params, images=[pictures()[0]]))
        asyncio.run(engine.close()) if hasattr(engine, "close") else None
    # Without images the scripted engines answer as before (the text-only contract is unchanged).
    replay = engines_without_vision()["ReplayEngine"]
    assert asyncio.run(replay.generate([1, 2], params, images=())).token_ids == [5, 2]
    assert asyncio.run(replay.generate([1, 2], params)).token_ids == [5, 2]


def test_idefics3_patch_count_is_clamped_to_the_one_global_patch():
    # transformers counts 0 patches for an unsplit Idefics3 image (our processor never splits);
    # vLLM 0.26 used that count as is (a reshape error on the H200). The shim makes it at least 1,
    # leaves larger counts alone, and wraps only once.
    from chatgym.trainer.engines.vllm_vision import clamp_idefics3_patches

    image_processor = vlm.load_image_processor(load_model_path("smolvlm"))
    assert image_processor.get_number_of_image_patches(40, 64)[0] == 0  # the count vLLM 0.26 got

    class Info:
        counts = iter([0, 5, 0])

        def get_num_patches(self, **kwargs):
            return next(self.counts)

    clamp_idefics3_patches(Info)
    wrapped = Info.get_num_patches
    clamp_idefics3_patches(Info)
    assert Info.get_num_patches is wrapped
    info = Info()
    assert [info.get_num_patches(image_width=64, image_height=40) for _ in range(3)] == [1, 5, 1]
