"""Image inputs of the transformers engine: pixel values and vision features per image, merged into
the prompt's token embeddings at prefill.

A vision-language model (:mod:`chatgym.trainer.models.vlm`) decodes through its language side only:
:func:`text_decoder` gives a plain causal LM (``LlamaForCausalLM`` for SmolVLM) whose modules ARE the
VLM's text model and LM head (no copy), so both decode paths of the engine — the padded
``DynamicCache`` batch and the static slots with the fused step and CUDA graphs — run it unchanged. The
images enter once, at prefill: the prompt's embeddings with each image's features (vision tower +
connector) written at its ``<image>`` positions (:func:`~chatgym.trainer.models.vlm.merge_image_features`);
every later token attends to them through the KV cache.

Each image is processed once per engine (pixel values keyed by its content hash) and encoded once per
set of weights: the features are cached by hash and dropped when a vision or connector weight changed
(its version counter or storage, which ``update_weights`` and an optimizer step both bump), so a
multi-turn episode that sends all its images every turn encodes each image once. Features of an image
encoded alone equal those of a batch up to float rounding.
"""

from __future__ import annotations

import weakref
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

from chatgym.trainer.models import vlm


def text_decoder(model: Any) -> Any:
    """The causal LM the engine decodes with: ``model`` itself for a text-only model; for a VLM, its
    text config's causal-LM class built on the meta device whose ``model`` and ``lm_head`` are then the
    VLM's own modules (so weights, in-place updates and adapters are shared)."""
    if not vlm.is_vlm(model):
        return model
    import torch
    from transformers import AutoModelForCausalLM

    base = vlm.base_model(model)
    text_config = base.config.get_text_config()
    with torch.device("meta"):
        shell = AutoModelForCausalLM.from_config(text_config)
    shell.model = base.model.text_model
    shell.lm_head = base.lm_head
    shell.config = text_config
    return shell


class EngineVision:
    """The image side of one engine (module doc). Used from the engine's worker thread only, except
    :meth:`check`.

    Args:
        model: the VLM (its vision tower, connector and input embeddings are read).
        image_processor: its image processor (:func:`chatgym.trainer.models.vlm.load_image_processor`);
            None: images are refused (:meth:`check` says to pass one).
        cache_size: distinct images whose features are kept (least recently used dropped first).
    """

    def __init__(self, model: Any, image_processor: Any, cache_size: int = 256) -> None:
        self.model = model
        self.pixels = None if image_processor is None else vlm.ImagePixels(image_processor, 4 * cache_size)
        self.image_token_id = vlm.image_token_id(model)
        self.tokens_per_image = vlm.image_seq_len(vlm.base_model(model).config)
        self.cache_size = int(cache_size)
        self._features: OrderedDict[str, Any] = OrderedDict()
        self._stamp: Any = None
        self._hashes: dict[int, tuple[Any, str]] = {}  # id(image) -> (weak reference, hash)
        self.encoded = 0  # images run through the vision tower (cache misses)

    @classmethod
    def of(cls, model: Any, image_processor: Any = None, source: Any = None) -> EngineVision | None:
        """The vision side for ``model``; None for a text-only model. ``image_processor`` None: loaded
        from ``source`` (the model's directory or name), else from the model's ``name_or_path``; None
        found there leaves images refused at :meth:`check`."""
        if not vlm.is_vlm(model):
            return None
        if image_processor is None:
            where = source if source is not None else getattr(vlm.base_model(model), "name_or_path", "")
            try:
                from chatgym.trainer.models.packaged import load_model_path

                image_processor = vlm.load_image_processor(load_model_path(where))
            except (OSError, ValueError):
                image_processor = None
        return cls(model, image_processor)

    def check(self, prompt_ids: Sequence[int], images: Sequence[Any]) -> tuple[Any, ...]:
        """The images as a tuple, after checking them against the prompt.

        Raises:
            TypeError: an image that is not a ``PIL.Image.Image``.
            ValueError: no image processor (pass ``image_processor=``), or the prompt's ``<image>``
                tokens are not ``len(images)`` x the tokens per image.
        """
        from PIL import Image

        images = tuple(images)
        for i, image in enumerate(images):
            if not isinstance(image, Image.Image):
                raise TypeError(f"images[{i}] must be a PIL.Image.Image, got {type(image).__name__}")
        found = sum(1 for t in prompt_ids if t == self.image_token_id)
        if images and self.pixels is None:
            raise ValueError("TransformersEngine: no image processor for this model: pass image_processor=")
        if found != len(images) * self.tokens_per_image:
            raise ValueError(
                f"prompt_ids hold {found} <image> tokens (id {self.image_token_id}) but {len(images)} "
                f"image(s) need {len(images) * self.tokens_per_image} ({self.tokens_per_image} each)"
            )
        return images

    def _hash(self, image: Any) -> str:
        """:func:`~chatgym.trainer.models.vlm.image_hash`, computed once per live image object."""
        known = self._hashes.get(id(image))
        if known is not None and known[0]() is image:
            return known[1]
        digest = vlm.image_hash(image)
        if len(self._hashes) > 8 * self.cache_size:
            self._hashes = {k: v for k, v in self._hashes.items() if v[0]() is not None}
        self._hashes[id(image)] = (weakref.ref(image), digest)
        return digest

    def _weights_stamp(self) -> Any:
        """The vision tower's and connector's weights as (version, storage) pairs; None when they keep
        no version (inference tensors), and then nothing is reused across prefills."""
        inner = vlm.base_model(self.model).model
        params = [*inner.vision_model.parameters(), *inner.connector.parameters()]
        try:
            return tuple((p._version, p.data_ptr()) for p in params)
        except RuntimeError:
            return None

    def features(self, images: Sequence[Any]) -> Any:
        """``(len(images), tokens_per_image, hidden)`` features; only images not cached are encoded
        (in one batch)."""
        import torch

        stamp = self._weights_stamp()
        if stamp is None or stamp != self._stamp:
            self._features.clear()
            self._stamp = stamp
        keys = [self._hash(image) for image in images]
        missing = list(dict.fromkeys(k for k in keys if k not in self._features))
        if missing:
            first = {k: image for k, image in zip(keys, images, strict=True)}
            values, masks = self.pixels([first[k] for k in missing])
            encoded = vlm.image_features(self.model, values, masks)
            self.encoded += len(missing)
            for k, f in zip(missing, encoded, strict=True):
                self._features[k] = f
        for k in keys:
            self._features.move_to_end(k)
        out = torch.stack([self._features[k] for k in keys])
        while len(self._features) > max(self.cache_size, len(set(keys))):
            self._features.popitem(last=False)
        return out

    def embeds(self, prompts: Sequence[Sequence[int]], images: Sequence[Sequence[Any]]) -> list[Any]:
        """Per prompt, ``(len, hidden)`` input embeddings: token embeddings with its images' features at
        its ``<image>`` positions (a prompt without images: its token embeddings)."""
        import torch

        device = next(vlm.base_model(self.model).get_input_embeddings().parameters()).device
        out = []
        for ids, imgs in zip(prompts, images, strict=True):
            tensor = torch.tensor([list(ids)], dtype=torch.long, device=device)
            feats = self.features(imgs) if imgs else torch.zeros(0, self.tokens_per_image, 1, device=device)
            out.append(vlm.merge_image_features(self.model, tensor, feats)[0])
        return out


def check_images(vision: EngineVision | None, prompt_ids: Sequence[int], images: Sequence[Any]) -> tuple[Any, ...]:
    """``images`` checked for ``generate`` (see :meth:`EngineVision.check`).

    Raises:
        ValueError: images given to an engine whose model has no vision tower; for a VLM, as
            :meth:`EngineVision.check` (a prompt with ``<image>`` tokens and no images included).
    """
    if vision is not None:
        return vision.check(prompt_ids, images)
    if images:
        raise ValueError(
            f"TransformersEngine: {len(images)} image(s) given, but this model has no vision tower "
            "(a text-only model takes token ids only)"
        )
    return ()
