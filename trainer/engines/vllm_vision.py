"""Image inputs of the in-process vLLM engine.

Our prompt ids already hold each image's placeholder run, expanded by the Hugging Face processor
(Idefics3: ``<fake_token_around_image><global-img>`` + 16 x ``<image>`` + ``<fake_token_around_image>``,
tiles first when it splits images; :mod:`chatgym.trainer.chat.images`). vLLM 0.32 cannot take such a
prompt as it is: its multimodal processor *always* applies its prompt update to a token prompt
(``BaseMultiModalProcessor.apply`` -> ``_apply_prompt_updates``; there is no "already expanded"
option), replacing each ``<image>`` id by a whole run, so a pre-expanded prompt is expanded again
(measured: one image, 22 ids in, 40 ids out).

So the engine gives vLLM what its processor expects: each image's run collapsed back to the one
``<image>`` id the chat template wrote (:meth:`VLLMImages.request`), with ``multi_modal_data={"image":
[PIL images]}``. vLLM's processor then writes the run again, from the same processor config, and
places the vision features on its ``<image>`` ids. The run is found by asking the processor what it
writes for each image (cached by image size: Idefics3's run depends on the size only), so a prompt
whose runs do not match its images is refused before anything is queued; and the prompt ids vLLM
reports are compared with ours when the request finishes (:func:`check_prompt_echo`): any
difference fails the request rather than returning logprobs of another prompt.

One compatibility shim (:func:`clamp_idefics3_patches`): transformers' Idefics3
``get_number_of_image_patches`` counts 0 patches for an image that is not split (our processor never
splits: one 16-token image), and vLLM before 0.32 took that count as is (``num_patches`` 0, then a
reshape error in the vision tower: found with vLLM 0.26 on an H200). vLLM 0.32 clamps it to 1, the
one global patch; the shim does the same for older vLLM.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from chatgym.trainer.engines.common import refuse_images


class VLLMImages:
    """The image side of a vLLM engine on a vision-language model (module doc).

    Args:
        path: the model's directory (its config, tokenizer and processor config are read).
        tokenizer: its tokenizer (with the image tokens as added tokens), or a processor holding it.

    Raises:
        ValueError: the directory's model is not a vision-language model chatgym handles.
    """

    def __init__(self, path: str | Path, tokenizer: Any) -> None:
        from transformers import AutoConfig, Idefics3Processor

        from chatgym.trainer.models import vlm

        config = AutoConfig.from_pretrained(path)
        image_processor = vlm.load_image_processor(path)  # refuses a text-only model
        tokenizer = getattr(tokenizer, "tokenizer", tokenizer)  # the collector may hold the processor
        self.processor = Idefics3Processor.from_pretrained(path, image_processor=image_processor, tokenizer=tokenizer)
        self.image_token_id = int(config.image_token_id)
        self._runs: dict[tuple[int, int], tuple[int, ...]] = {}

    @classmethod
    def of(cls, path: str | Path, config: Any, tokenizer: Any) -> VLLMImages | None:
        """The image side for the model at ``path`` (``config``: its ``AutoConfig``); None when it is a
        text-only model."""
        from chatgym.trainer.models import vlm

        if not vlm.is_vision_config(config):
            return None
        clamp_idefics3_patches()
        return cls(path, tokenizer)

    def run(self, image: Any) -> tuple[int, ...]:
        """The ids the processor writes for ``image`` in place of one ``<image>`` placeholder."""
        key = (int(image.size[0]), int(image.size[1]))
        hit = self._runs.get(key)
        if hit is None:
            out = self.processor(
                text=[self.processor.image_token], images=[[image.convert("RGB")]], add_special_tokens=False
            )
            hit = self._runs[key] = tuple(int(i) for i in out["input_ids"][0])
        return hit

    def collapse(self, prompt_ids: Sequence[int], images: Sequence[Any]) -> list[int]:
        """``prompt_ids`` with the k-th image's run replaced by one ``<image>`` id, for every k.

        Raises:
            TypeError: an image that is not a ``PIL.Image.Image``.
            ValueError: an image whose run is not found (in order) in the prompt, or ``<image>`` ids
                outside the images' runs (a prompt with image tokens and no images included).
        """
        from PIL import Image

        for i, image in enumerate(images):
            if not isinstance(image, Image.Image):
                raise TypeError(f"images[{i}] must be a PIL.Image.Image, got {type(image).__name__}")
        ids = list(prompt_ids)
        out: list[int] = []
        pos = 0
        for k, image in enumerate(images):
            run = self.run(image)
            start = _find(ids, run, pos)
            if start < 0:
                raise ValueError(
                    f"VLLMEngine: the run of images[{k}] ({len(run)} ids, {run[:3]}...) is not in prompt_ids "
                    f"after position {pos}: the prompt's image runs do not match the {len(images)} image(s)"
                )
            out += ids[pos:start]
            out.append(self.image_token_id)
            pos = start + len(run)
        out += ids[pos:]
        stray = sum(1 for t in out if t == self.image_token_id) - len(images)
        if stray:
            raise ValueError(
                f"VLLMEngine: prompt_ids hold {stray} <image> id(s) (id {self.image_token_id}) outside the "
                f"runs of the {len(images)} image(s) given"
            )
        return out

    def request(self, prompt_ids: Sequence[int], images: Sequence[Any]) -> dict[str, Any]:
        """The prompt vLLM's ``add_request`` takes: ``{"prompt_token_ids": collapsed ids,
        "multi_modal_data": {"image": [images]}}`` (vLLM's processor expands and checks the images), or
        :func:`tokens_input` of the ids when there is no image (raises as :meth:`collapse`)."""
        ids = self.collapse(prompt_ids, images)
        if not images:
            return tokens_input(ids)
        return {"prompt_token_ids": ids, "multi_modal_data": {"image": list(images)}}


def clamp_idefics3_patches(info_class: Any = None) -> None:
    """Make ``Idefics3ProcessingInfo.get_num_patches`` (vLLM's count of an image's patches) at least 1,
    as vLLM 0.32 does itself (module doc). Idempotent; ``info_class`` is for tests (default: vLLM's)."""
    if info_class is None:
        from vllm.model_executor.models.idefics3 import Idefics3ProcessingInfo as info_class
    original = info_class.get_num_patches
    if getattr(original, "clamped_to_one", False):
        return

    def get_num_patches(self: Any, **kwargs: Any) -> int:
        return max(int(original(self, **kwargs)), 1)

    get_num_patches.clamped_to_one = True  # type: ignore[attr-defined]
    info_class.get_num_patches = get_num_patches


def vllm_prompt(vision: VLLMImages | None, prompt_ids: list[int], images: Sequence[Any]) -> dict[str, Any]:
    """The ``add_request`` prompt for ``prompt_ids`` and ``images``: the ids as they are for a text-only
    prompt (:func:`tokens_input`); :meth:`VLLMImages.request` with images.

    Raises:
        ValueError: images for a text-only model; as :meth:`VLLMImages.collapse` otherwise.
    """
    if vision is None:
        refuse_images("VLLMEngine", images, "this model has no vision tower (a text-only model takes token ids only)")
        return tokens_input(prompt_ids)
    return vision.request(prompt_ids, tuple(images))


def tokens_input(prompt_ids: list[int]) -> dict[str, Any]:
    """Token ids as vLLM's engine takes them without rendering: ``vllm.inputs.engine.tokens_input``
    (``{"type": "token", "prompt_token_ids": ...}``) where vLLM has it (0.26, the GPU kit's, and 0.32,
    the CPU one's: both deprecate a raw prompt dict, re-render it and warn at every start-up); the
    raw ``{"prompt_token_ids": ...}`` on older vLLM. The engine still checks the ids against the
    model (length) either way."""
    try:
        from vllm.inputs.engine import tokens_input as engine_tokens_input
    except ImportError:
        return {"prompt_token_ids": prompt_ids}
    return dict(engine_tokens_input(prompt_ids))


def check_prompt_echo(expected: list[int] | None, reported: Sequence[int] | None) -> None:
    """Raise unless vLLM's prompt ids (``RequestOutput.prompt_token_ids``) equal ours (``expected``;
    None: nothing to compare, a text-only prompt, which vLLM takes as it is).

    Raises:
        RuntimeError: the prompts differ; the message gives the first differing position.
    """
    if expected is None:
        return
    got = list(reported or ())
    if got == expected:
        return
    at = next((i for i, (a, b) in enumerate(zip(got, expected, strict=False)) if a != b), min(len(got), len(expected)))
    raise RuntimeError(
        f"vLLM expanded the images into other prompt ids than ours ({len(got)} vs {len(expected)} ids, first "
        f"difference at {at}: {got[at : at + 4]} vs {expected[at : at + 4]}): an image run reached "
        "vLLM uncollapsed, or its processor config differs from the one the prompt was built with"
    )


def _find(ids: list[int], run: tuple[int, ...], start: int) -> int:
    """The first index ``>= start`` where ``run`` occurs in ``ids``; -1 when it does not."""
    n = len(run)
    first = run[0]
    for i in range(start, len(ids) - n + 1):
        if ids[i] == first and tuple(ids[i : i + n]) == run:
            return i
    return -1
