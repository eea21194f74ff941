"""Vision-language models built offline: a SmolVLM-shaped model around the packaged SmolLM2, its
processor, random-init VLM shapes, and the pieces the engine and the learner share (pixel values per
image, vision features, merging them into the token embeddings).

``load_model_path("smolvlm")`` (:mod:`.packaged`) builds the model once and caches it as safetensors
under ``$CHATGYM_CACHE/models/`` (the same cache rules as SmolLM2's conversion). The model is
transformers' ``Idefics3ForConditionalGeneration`` (SmolVLM's architecture):

* text side: SmolLM2-135M-Instruct's **real** weights (the packaged GGUF, dequantized), its embedding
  and (tied) LM head grown by the 40 tokens the processor needs (below); the new rows are the mean of the old ones;
* vision side: **random** (``torch.manual_seed(spec.seed)``): a SigLIP-style encoder of 4 layers,
  hidden 256, 4 heads, patches of 16 px over a 128 x 128 image (64 patches), and the pixel-shuffle
  connector (scale factor 2: 64 patches -> 16 image tokens, one linear layer 1024 -> 576) whose weights
  are scaled so an image token's embedding has the RMS of SmolLM2's token embeddings (0.136), not
  several times it (transformers' init would give ~0.6 and drown the text).

Anything learned from images therefore rests on random vision features until the vision side is
trained (the connector always is; the tower unless ``model.freeze_vision``).

Processor: ``Idefics3Processor`` over SmolLM2's tokenizer with ``<fake_token_around_image>``,
``<image>``, ``<global-img>`` and ``<row_i_col_j>`` (i, j in 1..6) and ``<end_of_utterance>`` added as special tokens (40), the PIL
image processor (no torchvision needed) with image splitting off, so every image is resized to
128 x 128 and becomes ``<fake_token_around_image><global-img>`` + 16 x ``<image>`` +
``<fake_token_around_image>`` (``image_seq_len`` = (128 / 16)^2 / 2^2 = 16, from the config).

Shapes for throughput (:data:`VLM_SHAPES`): config-only directories (config, processor, no weights)
for ``model.random_init``: SmolVLM-256M's vision side (768 hidden, 12 layers, 512 px, scale 4) on
SmolLM2-135M's text shape, and SmolVLM-2.2B's (SigLIP so400m: 1152 hidden, 27 layers, 384 px, patch 14,
scale 3) on SmolLM2-1.7B's text shape; both with the processor above at their image size.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

IMAGE_TOKEN = "<image>"
FAKE_IMAGE_TOKEN = "<fake_token_around_image>"
GLOBAL_IMAGE_TOKEN = "<global-img>"
# Idefics3Processor adds <end_of_utterance> itself; adding it first keeps the vocabulary's size known.
IMAGE_TOKENS: tuple[str, ...] = (
    FAKE_IMAGE_TOKEN,
    IMAGE_TOKEN,
    GLOBAL_IMAGE_TOKEN,
    *(f"<row_{i}_col_{j}>" for i in range(1, 7) for j in range(1, 7)),
    "<end_of_utterance>",
)
VISION_MODEL_TYPES = frozenset({"idefics3"})


@dataclass(frozen=True)
class VLMSpec:
    """A vision-language model chatgym builds from a config (nothing downloaded).

    Attributes:
        cache_name: folder under ``$CHATGYM_CACHE/models/``.
        text: the packaged text model (``"smollm2"``) whose tokenizer (and weights) it starts from.
        vision: ``Idefics3VisionConfig`` fields.
        scale_factor: the connector's pixel shuffle (tokens per image = patches / scale_factor^2).
        seed: ``torch.manual_seed`` before the random (vision) weights are drawn.
        weights: False: a config-only shape (``model.random_init`` only; no weights are written).
        text_overrides: text config fields changed from ``text``'s (a shape's larger text side).
    """

    cache_name: str
    text: str = "smollm2"
    vision: dict[str, Any] = field(default_factory=dict)
    scale_factor: int = 2
    seed: int = 0
    weights: bool = True
    text_overrides: dict[str, Any] = field(default_factory=dict)


_SMALL_VISION = dict(
    hidden_size=256, intermediate_size=1024, num_hidden_layers=4, num_attention_heads=4, image_size=128,
    patch_size=16,
)
BUILT_VLMS: dict[str, VLMSpec] = {
    "smolvlm": VLMSpec(cache_name="smolvlm-smollm2-135m-vision-random-s0", vision=_SMALL_VISION),
}
VLM_SHAPES: dict[str, VLMSpec] = {
    "smolvlm-256m-shape": VLMSpec(
        cache_name="smolvlm-256m-shape",
        vision=dict(hidden_size=768, intermediate_size=3072, num_hidden_layers=12, num_attention_heads=12,
                    image_size=512, patch_size=16),
        scale_factor=4,
        weights=False,
    ),
    "smolvlm-2b-shape": VLMSpec(
        cache_name="smolvlm-2b-shape",
        vision=dict(hidden_size=1152, intermediate_size=4304, num_hidden_layers=27, num_attention_heads=16,
                    image_size=384, patch_size=14),
        scale_factor=3,
        weights=False,
        text_overrides=dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=24,
                            num_attention_heads=32, num_key_value_heads=32, head_dim=64),
    ),
}
# Bump when the build changes, so stale caches are rebuilt rather than trusted.
BUILD_VERSION = 1


def is_vision_config(config: Any) -> bool:
    """True for a config of a vision-language architecture this module handles (Idefics3)."""
    return getattr(config, "model_type", None) in VISION_MODEL_TYPES


def is_vlm(model: Any) -> bool:
    """True when ``model`` (a peft wrapper included) is a vision-language model of this module."""
    return is_vision_config(getattr(base_model(model), "config", None))


def auto_model_class(config: Any) -> Any:
    """The ``transformers`` auto class that builds ``config``: image-text-to-text for a VLM, else
    causal LM."""
    from transformers import AutoModelForCausalLM, AutoModelForImageTextToText

    return AutoModelForImageTextToText if is_vision_config(config) else AutoModelForCausalLM


def image_seq_len(config: Any) -> int:
    """``<image>`` tokens per image: (image_size / patch_size)^2 / scale_factor^2."""
    vision = config.vision_config
    return int((vision.image_size // vision.patch_size) ** 2 // config.scale_factor**2)


def build_vlm(spec: VLMSpec, text_dir: Path, out: Path) -> None:
    """Write the model of ``spec`` (config, safetensors unless ``spec.weights`` is False, generation
    config) and its processor into ``out``; ``text_dir`` is the text model's directory."""
    import torch
    from tokenizers import AddedToken
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, Idefics3Config

    tokenizer = AutoTokenizer.from_pretrained(text_dir)
    tokenizer.add_tokens([AddedToken(t, special=True, normalized=False) for t in IMAGE_TOKENS], special_tokens=True)
    text_config = AutoConfig.from_pretrained(text_dir).to_dict()
    text_config.update(spec.text_overrides, vocab_size=len(tokenizer))
    config = Idefics3Config(
        text_config=text_config,
        vision_config=dict(spec.vision),
        scale_factor=spec.scale_factor,
        image_token_id=tokenizer.convert_tokens_to_ids(IMAGE_TOKEN),
        tie_word_embeddings=bool(text_config.get("tie_word_embeddings", True)),
        pad_token_id=text_config.get("pad_token_id"),
        bos_token_id=text_config.get("bos_token_id"),
        eos_token_id=text_config.get("eos_token_id"),
    )
    processor = make_processor(tokenizer, config)
    if not spec.weights:
        config.save_pretrained(out)
        processor.save_pretrained(out)
        return
    text = AutoModelForCausalLM.from_pretrained(text_dir, dtype=torch.float32)
    torch.manual_seed(spec.seed)
    model = auto_model_class(config).from_config(config, dtype=torch.float32)
    state = text.model.state_dict()
    old = state["embed_tokens.weight"]
    grown = old.mean(dim=0, keepdim=True).expand(len(tokenizer) - old.shape[0], -1)
    state["embed_tokens.weight"] = torch.cat([old, grown])
    model.model.text_model.load_state_dict(state, strict=True)
    if config.tie_word_embeddings:
        model.tie_weights()
    else:
        model.lm_head.weight.data.copy_(torch.cat([text.lm_head.weight, grown]))
    with torch.no_grad():  # image tokens at the text embeddings' scale (module doc)
        proj = model.model.connector.modality_projection.proj
        target = float(old.pow(2).mean().sqrt())
        proj.weight.normal_(0.0, target / proj.in_features**0.5)
    for key in ("eos_token_id", "pad_token_id", "bos_token_id"):
        setattr(model.generation_config, key, getattr(text.generation_config, key, None))
    model.save_pretrained(out, safe_serialization=True)
    processor.save_pretrained(out)


def make_processor(tokenizer: Any, config: Any) -> Any:
    """``Idefics3Processor`` for ``config``: ``tokenizer`` (with :data:`IMAGE_TOKENS`), the PIL image
    processor squaring every image to the vision tower's size (no splitting), ``image_seq_len`` from the
    config (:func:`image_seq_len`)."""
    from transformers import Idefics3ImageProcessorPil, Idefics3Processor

    side = int(config.vision_config.image_size)
    images = Idefics3ImageProcessorPil(
        do_image_splitting=False, size={"longest_edge": side}, max_image_size={"longest_edge": side}
    )
    return Idefics3Processor(image_processor=images, tokenizer=tokenizer, image_seq_len=image_seq_len(config))


def load_image_processor(path: str | Path) -> Any:
    """The image processor saved in a VLM directory (Idefics3's PIL one: the same pixels with or
    without torchvision).

    Raises:
        ValueError: the directory's model is not a vision-language model of this module.
    """
    from transformers import AutoConfig, Idefics3ImageProcessorPil

    config = AutoConfig.from_pretrained(path)
    if not is_vision_config(config):
        raise ValueError(f"{path}: model_type {config.model_type!r} has no image processor here")
    return Idefics3ImageProcessorPil.from_pretrained(path)


def load_processor(path: str | Path, tokenizer: Any = None) -> Any | None:
    """The multimodal processor of the model directory ``path`` (what the collector expands image
    placeholders with): ``Idefics3Processor`` over ``tokenizer`` (the run's, with its chat template;
    None: the directory's own) and the directory's image processor (:func:`load_image_processor`),
    ``image_seq_len`` from its config (:func:`image_seq_len`). None when ``path`` holds no
    ``config.json`` or a text-only model's.

    Raises:
        OSError: a vision-language directory without its image processor (``processor_config.json``
            / ``preprocessor_config.json``): save the processor beside the weights.
    """
    from transformers import AutoConfig, AutoTokenizer, Idefics3Processor

    path = Path(path)
    if not (path / "config.json").is_file():
        return None
    config = AutoConfig.from_pretrained(path)
    if not is_vision_config(config):
        return None
    images = load_image_processor(path)
    tokenizer = tokenizer if tokenizer is not None else AutoTokenizer.from_pretrained(path)
    return Idefics3Processor(image_processor=images, tokenizer=tokenizer, image_seq_len=image_seq_len(config))


def image_hash(image: Any) -> str:
    """sha256 of an image's mode, size and pixel bytes (hex): equal images give equal keys."""
    digest = hashlib.sha256(f"{image.mode}:{image.size[0]}x{image.size[1]}:".encode())
    digest.update(image.tobytes())
    return digest.hexdigest()


class ImagePixels:
    """Images -> pixel values in the processor's format, each distinct image processed once.

    Args:
        image_processor: an Idefics3 image processor (:func:`load_image_processor`).
        cache_size: distinct images kept (least recently used dropped first).

    Calling it on ``n`` PIL images gives ``(pixel_values, pixel_attention_mask)``: ``(n, 3, H, W)``
    float32 and ``(n, H, W)`` bool, on the CPU (images of different processed sizes are zero-padded to
    the largest, the mask marking the real pixels).
    """

    def __init__(self, image_processor: Any, cache_size: int = 512) -> None:
        self.image_processor = image_processor
        self.cache_size = int(cache_size)
        self._cache: OrderedDict[str, tuple[Any, Any]] = OrderedDict()
        self.processed = 0  # images run through the processor (cache misses)

    def one(self, image: Any) -> tuple[Any, Any]:
        """``(3, H, W)`` pixel values and ``(H, W)`` bool mask of one image (cached by :func:`image_hash`)."""
        key = image_hash(image)
        hit = self._cache.get(key)
        if hit is not None:
            self._cache.move_to_end(key)
            return hit
        out = self.image_processor(images=[[image.convert("RGB")]], return_tensors="pt")
        values = out["pixel_values"][0, 0].float()
        mask = out["pixel_attention_mask"][0, 0].bool() if "pixel_attention_mask" in out else None
        if mask is None:
            mask = values.new_ones(values.shape[1:], dtype=bool)
        self._cache[key] = (values, mask)
        self.processed += 1
        while len(self._cache) > self.cache_size:
            self._cache.popitem(last=False)
        return values, mask

    def __call__(self, images: Any) -> tuple[Any, Any]:
        import torch

        parts = [self.one(image) for image in images]
        if not parts:
            return torch.zeros(0, 3, 1, 1), torch.zeros(0, 1, 1, dtype=torch.bool)
        height = max(v.shape[1] for v, _ in parts)
        width = max(v.shape[2] for v, _ in parts)
        values = torch.zeros(len(parts), 3, height, width)
        masks = torch.zeros(len(parts), height, width, dtype=torch.bool)
        for i, (v, m) in enumerate(parts):
            values[i, :, : v.shape[1], : v.shape[2]] = v
            masks[i, : m.shape[0], : m.shape[1]] = m
        return values, masks


def base_model(model: Any) -> Any:
    """The transformers model under a peft wrapper (the model itself otherwise)."""
    return model.get_base_model() if hasattr(model, "get_base_model") and hasattr(model, "peft_config") else model


def vision_modules(model: Any) -> list[Any]:
    """The vision tower of a VLM (the modules ``model.freeze_vision`` freezes; not the connector)."""
    return [base_model(model).model.vision_model]


def image_token_id(model: Any) -> int:
    return int(base_model(model).config.image_token_id)


def image_features(model: Any, pixel_values: Any, pixel_attention_mask: Any = None) -> Any:
    """The connector's output for ``n`` images: ``(n, image_seq_len, text hidden)`` in the model's dtype.

    Args:
        pixel_values: ``(n, 3, H, W)`` float (:class:`ImagePixels`); moved to the model's device/dtype.
        pixel_attention_mask: ``(n, H, W)`` bool, the real pixels (None: all).

    Every image is encoded (no image is dropped for being all zeros, unlike transformers'
    ``get_image_features``, which takes such images for batch padding).
    """
    import torch

    inner = base_model(model).model
    param = next(inner.vision_model.parameters())
    pixel_values = pixel_values.to(device=param.device, dtype=param.dtype)
    if pixel_attention_mask is None:
        pixel_attention_mask = torch.ones(pixel_values.shape[0], *pixel_values.shape[2:], dtype=torch.bool)
    pixel_attention_mask = pixel_attention_mask.to(param.device)
    patch = inner.config.vision_config.patch_size
    grid = pixel_attention_mask.unfold(1, patch, patch).unfold(2, patch, patch)
    patch_mask = grid.sum(dim=(-1, -2)) > 0
    hidden = inner.vision_model(pixel_values=pixel_values, patch_attention_mask=patch_mask).last_hidden_state
    return inner.connector(hidden)


def merge_image_features(model: Any, input_ids: Any, features: Any) -> Any:
    """Token embeddings of ``input_ids`` ``(B, T)`` with ``features`` ``(n, S, hidden)`` written at the
    ``<image>`` positions in row-major order: ``(B, T, hidden)``.

    Raises:
        ValueError: the ids hold a different number of ``<image>`` tokens than ``n * S``.
    """
    embed = base_model(model).get_input_embeddings()
    embeds = embed(input_ids)
    where = input_ids == image_token_id(model)
    found, given = int(where.sum()), features.shape[0] * features.shape[1]
    if found != given:
        raise ValueError(
            f"the token ids hold {found} <image> tokens but {features.shape[0]} image(s) give {given} "
            f"features ({features.shape[1]} per image)"
        )
    if not given:
        return embeds
    return embeds.masked_scatter(where[..., None], features.to(embeds.dtype).reshape(-1, embeds.shape[-1]))
