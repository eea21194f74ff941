"""Image content parts for the visual envs: PNG data URLs, text parts, and the zoom crop.

Observations carry images as ``{"type": "image_url", "image_url": {"url": "data:image/png;base64,..."}}``
parts (the OpenAI shape): a message stays plain JSON — the checker's JSON rule, traces, the eval store,
the gateway and Ray's transport all take it as it is — and two observations of the same pixels are
equal strings, which is what Gymnasium's determinism checks compare. PNG is lossless, so the decoded
image is the rendered one, pixel for pixel; PIL's PNG writer adds no timestamp, so the same pixels give
the same bytes.
"""

from __future__ import annotations

import base64
import io
from typing import Any

from PIL import Image

DATA_URL_PREFIX = "data:image/png;base64,"


def to_data_url(image: Image.Image) -> str:
    """``image`` as a PNG data URL (``data:image/png;base64,...``), converted to RGB first."""
    buf = io.BytesIO()
    image.convert("RGB").save(buf, format="PNG", compress_level=6)
    return DATA_URL_PREFIX + base64.b64encode(buf.getvalue()).decode("ascii")


def from_data_url(url: str) -> Image.Image:
    """The RGB image of a PNG/JPEG ``data:`` URL (as :func:`to_data_url` writes).

    Raises:
        ValueError: ``url`` is not a base64 ``data:image/...`` URL (network URLs are never fetched).
    """
    if not (isinstance(url, str) and url.startswith("data:image/") and ";base64," in url):
        raise ValueError(f"not a base64 image data URL: {str(url)[:60]!r}")
    raw = base64.b64decode(url.split(",", 1)[1], validate=True)
    with Image.open(io.BytesIO(raw)) as im:
        return im.convert("RGB")


def image_part(image: Image.Image) -> dict[str, Any]:
    """An ``image_url`` content part holding ``image`` as a PNG data URL."""
    return {"type": "image_url", "image_url": {"url": to_data_url(image)}}


def text_part(text: str) -> dict[str, Any]:
    """A ``text`` content part."""
    return {"type": "text", "text": text}


def part_images(content: Any) -> list[Image.Image]:
    """The images of a message's ``content`` (a list of parts), decoded, in order; ``[]`` for a str."""
    if not isinstance(content, list):
        return []
    out = []
    for part in content:
        if part.get("type") == "image_url":
            out.append(from_data_url(part["image_url"]["url"]))
        elif part.get("type") == "image":
            out.append(part["image"].convert("RGB"))
    return out


def part_text(content: Any) -> str:
    """The text of a message's ``content``: the str itself, or its text parts joined by newlines."""
    if isinstance(content, str):
        return content
    return "\n".join(p["text"] for p in content if p.get("type") == "text")


def zoom_crop(
    image: Image.Image, box: tuple[float, float, float, float], out_size: int
) -> Image.Image:
    """The region ``box`` of ``image`` upscaled so its longer side is ``out_size`` pixels.

    Args:
        image: the source (a high-resolution render, so the zoom shows real detail).
        box: ``(x0, y0, x1, y1)`` in ``image``'s pixels, ``x0 < x1``, ``y0 < y1``, inside the image.
        out_size: the longer side of the result, in pixels (the aspect ratio is kept).

    Returns:
        An RGB image of ``max(w, h) == out_size``.

    Raises:
        ValueError: an empty box or one outside the image.
    """
    x0, y0, x1, y1 = box
    if not (0 <= x0 < x1 <= image.width and 0 <= y0 < y1 <= image.height):
        raise ValueError(f"box {box} is empty or outside the {image.width}x{image.height} image")
    w, h = x1 - x0, y1 - y0
    scale = out_size / max(w, h)
    size = (max(1, round(w * scale)), max(1, round(h * scale)))
    return image.convert("RGB").resize(size, Image.Resampling.LANCZOS, box=(x0, y0, x1, y1))


def transcript(messages: list[dict[str, Any]]) -> str:
    """The ``ansi`` render of a history: one ``[role] text`` line per message, each image part shown
    as ``<image WxH>`` instead of its data URL."""
    lines = []
    for m in messages:
        content = m.get("content")
        if isinstance(content, list):
            shown = []
            for p in content:
                if p.get("type") == "text":
                    shown.append(p["text"])
                else:
                    im = part_images([p])[0]
                    shown.append(f"<image {im.width}x{im.height}>")
            content = "\n".join(shown)
        lines.append(f"[{m['role']}] {content}")
    return "\n".join(lines)
