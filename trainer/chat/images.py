"""Images in chat messages: decoding, content hashes, the per-trajectory image store, and the
processor's expansion of an image placeholder into image token ids.

The message format is in :mod:`chatgym.envs.messages` (content parts); the token rules in
docs/multimodal.md. In short:

* every image part (a PIL image or a ``data:`` URL) is decoded once to RGB and named by the sha256
  of its canonical bytes (:func:`image_sha256`: mode, size, raw RGB pixels), so the same picture
  sent as a PNG data URL or as a PIL object is one image; :func:`intern_images` replaces each image
  part by ``{"type": "image", "ref": sha256}`` and returns the images a store does not hold yet;
* the chat template writes one placeholder (the processor's ``image_token``, ``<image>`` for
  Idefics3) per image part; :class:`ImageTokens` turns the k-th placeholder id of a rendering into
  the ids the processor itself writes for the k-th image (``processor(text=placeholder,
  images=[image])``), so a turn's ids are the template's ids with each new image expanded exactly as
  the processor would expand it in a rendering of the whole conversation;
* network URLs are refused: nothing here downloads.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import io
import threading
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from chatgym.envs.messages import Message, content_errors, image_url_error, is_image_part, is_pil_image
from chatgym.trainer.chat.template_probe import TemplateError
from chatgym.trainer.chat.tokenizer import content_ids


class ImageInputError(ValueError):
    """An image part that cannot be read (a network URL, a broken data URL, not an image), an image
    reference no store holds, or images given to a model that reads none."""


def decode_image(value: Any) -> Any:
    """An image part's value as a new RGB ``PIL.Image.Image``.

    Args:
        value: a ``PIL.Image.Image`` (converted to RGB, always copied, so the env may change its own
            object later), or a data URL ``data:image/<format>;base64,<data>``.

    Raises:
        ImageInputError: an http(s) URL (never downloaded), another kind of URL or string, base64 that
            does not decode, or bytes PIL cannot read.
    """
    from PIL import Image, UnidentifiedImageError

    if is_pil_image(value):
        return value.convert("RGB")
    error = image_url_error(value)
    if error is not None:
        raise ImageInputError(error)
    header, sep, data = value.partition(",")
    if not sep or not header.lower().endswith(";base64"):
        raise ImageInputError(f"image data URL must be base64 encoded (data:image/...;base64,...): {value[:60]!r}")
    try:
        raw = base64.b64decode(data, validate=True)
        with Image.open(io.BytesIO(raw)) as img:
            return img.convert("RGB")
    except (binascii.Error, ValueError, UnidentifiedImageError, OSError) as exc:
        raise ImageInputError(f"image data URL does not hold a readable image: {exc}") from None


def image_sha256(image: Any) -> str:
    """The sha256 hex digest of an RGB image's canonical bytes: ``b"RGB <width> <height>\\n"`` then
    the raw pixels (``image.tobytes()``, row-major, 3 bytes a pixel)."""
    w, h = image.size
    digest = hashlib.sha256(f"{image.mode} {w} {h}\n".encode())
    digest.update(image.tobytes())
    return digest.hexdigest()


def encode_data_url(image: Any) -> str:
    """A PNG data URL of ``image`` (lossless: :func:`decode_image` of it has the same sha256)."""
    buf = io.BytesIO()
    image.convert("RGB").save(buf, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode("ascii")


def _part_value(part: Mapping[str, Any]) -> Any:
    if part["type"] == "image_url":
        return (part.get("image_url") or {}).get("url")
    return part.get("image")


def has_images(messages: Sequence[Message]) -> bool:
    """True when some message's content is a list holding an image part."""
    return any(
        isinstance(m.get("content"), list) and any(is_image_part(p) for p in m["content"]) for m in messages
    )


def intern_images(
    messages: Sequence[Message], store: Mapping[str, Any]
) -> tuple[list[Message], dict[str, Any], list[str]]:
    """Messages with every image part replaced by its reference, and the images that are new.

    Args:
        messages: messages whose content is a str or a list of parts (PIL images, data URLs, refs).
        store: the images known so far, by sha256 (a ``ref`` part must name one of them or one
            decoded earlier in ``messages``).

    Returns:
        ``(messages, new, refs)``: the messages (text-only ones are the same objects; others copies
        whose image parts are ``{"type": "image", "ref": sha256}``), the decoded images ``store``
        lacks (``{sha256: RGB PIL image}``, each once), and the ref of every image part in order
        (one per placeholder the template writes; an image shown twice is listed twice).

    Raises:
        ImageInputError: a part that is not valid content, cannot be decoded, or names an unknown ref.
    """
    out: list[Message] = []
    new: dict[str, Any] = {}
    refs: list[str] = []
    for m in messages:
        content = m.get("content")
        if not isinstance(content, list):
            out.append(m)
            continue
        errors = content_errors(content)
        if errors:
            raise ImageInputError("; ".join(errors))
        parts = []
        for part in content:
            if not is_image_part(part):
                parts.append(part)
                continue
            if "ref" in part:
                ref = part["ref"]
                if ref not in store and ref not in new:
                    raise ImageInputError(f"image ref {ref} is not in the trajectory's image store")
            else:
                image = decode_image(_part_value(part))
                ref = image_sha256(image)
                if ref not in store:
                    new.setdefault(ref, image)
            refs.append(ref)
            parts.append({"type": "image", "ref": ref})
        out.append({**m, "content": parts})  # type: ignore[typeddict-item]
    return out, new, refs


class ImageTokens:
    """A processor's image placeholder and its expansion into image token ids.

    Args:
        processor: a Hugging Face multimodal processor: ``image_token`` (the placeholder text the
            chat template writes, an added token of ``processor.tokenizer``) and
            ``processor(text=[...], images=[[...]], add_special_tokens=False)["input_ids"]`` expanding
            each placeholder (Idefics3: ``<fake_token_around_image><global-img><image>*N
            <fake_token_around_image>``, tiles first when it splits images).
        cache_size: expansions kept, by image sha256 (an image is expanded once, not every turn).

    Raises:
        ImageInputError: the processor has no ``image_token``, or it is not one token of its tokenizer.
    """

    def __init__(self, processor: Any, cache_size: int = 4096):
        self.processor = processor
        token = getattr(processor, "image_token", None)
        if not isinstance(token, str) or not token:
            raise ImageInputError(f"{type(processor).__name__} has no image_token: it cannot place images")
        tokenizer = processor.tokenizer
        self.placeholder = token
        ids = tokenizer.encode(token, add_special_tokens=False)
        if len(ids) != 1:
            raise ImageInputError(f"the image placeholder {token!r} is {len(ids)} tokens, not one added token")
        self.placeholder_id = int(ids[0])
        self.cache_size = cache_size
        self._cache: OrderedDict[str, list[int]] = OrderedDict()
        self._lock = threading.Lock()

    def ids(self, ref: str, image: Any) -> list[int]:
        """The ids the processor writes for ``image`` in place of one placeholder (``list[int]``)."""
        with self._lock:
            hit = self._cache.get(ref)
            if hit is not None:
                self._cache.move_to_end(ref)
                return hit
        out = self.processor(text=[self.placeholder], images=[[image]], add_special_tokens=False)
        ids = [int(i) for i in out["input_ids"][0]]
        with self._lock:
            self._cache[ref] = ids
            while len(self._cache) > self.cache_size:
                self._cache.popitem(last=False)
        return ids

    def count(self, ref: str, image: Any) -> int:
        """How many tokens ``image`` takes in a prompt."""
        return len(self.ids(ref, image))

    def expand(self, ids: Sequence[int], refs: Sequence[str], images: Mapping[str, Any]) -> list[int]:
        """``ids`` with its k-th placeholder id replaced by the expansion of image ``refs[k]``.

        Raises:
            TemplateError: the rendering holds a different number of placeholders than ``refs`` (the
                chat template drops image parts, or writes the placeholder itself).
        """
        at = [i for i, t in enumerate(ids) if t == self.placeholder_id]
        if len(at) != len(refs):
            raise TemplateError(
                f"the chat template wrote {len(at)} image placeholder(s) {self.placeholder!r} for "
                f"{len(refs)} image part(s)"
            )
        out: list[int] = []
        pos = 0
        for i, ref in zip(at, refs, strict=True):
            out += ids[pos:i]
            out += self.ids(ref, images[ref])
            pos = i + 1
        out += ids[pos:]
        return out


def truncate_content(
    tokenizer: Any, parts: list[dict[str, Any]], max_tokens: int, image_len: Callable[[str], int]
) -> tuple[list[dict[str, Any]], int, int]:
    """Cut a list of content parts to ``max_tokens`` tokens, keeping its head.

    Parts are kept in order while they fit; the first that does not is cut — a text part to its first
    tokens, an image part whole (never part of an image's token run) — and every later part is left
    out, with a visible marker text part ``"\\n[... N more tokens truncated]"`` (``", K image(s) left
    out"`` before the ``]`` when images were).

    Args:
        tokenizer: the model's tokenizer (text is counted as plain text, as the model reads it).
        parts: interned content parts (images as ``ref`` parts).
        max_tokens: the budget of this message's content.
        image_len: the tokens an image takes, by ref (:meth:`ImageTokens.count`).

    Returns:
        ``(parts, cut, dropped)``: the parts unchanged, 0, 0 when they fit; else the kept head with
        the marker, the tokens left out and the images left out.
    """
    left, kept, cut, dropped = max_tokens, [], 0, 0
    for part in parts:
        if part.get("type") == "text":
            ids = content_ids(tokenizer, part["text"])
            if cut == 0 and len(ids) <= left:
                kept.append(part)
                left -= len(ids)
                continue
            if cut == 0 and left > 0:
                kept.append({"type": "text", "text": tokenizer.decode(ids[:left], skip_special_tokens=False)})
            cut, left = cut + len(ids) - left, 0
        else:
            n = image_len(part["ref"])
            if cut == 0 and n <= left:
                kept.append(part)
                left -= n
                continue
            cut, dropped, left = cut + n, dropped + 1, 0
    if cut == 0:
        return parts, 0, 0
    images = f", {dropped} image(s) left out" if dropped else ""
    kept.append({"type": "text", "text": f"\n[... {cut} more tokens truncated{images}]"})
    return kept, cut, dropped
