"""ChartQA-v0's data: seeded chart specs and questions, and the matplotlib rendering.

A chart spec is plain data (``kind``, ``title``, ``x_label``, ``y_label``, ``categories``,
``values``: distinct integers, each printed on the chart above its bar or point), so a task row
carries the chart, not its pixels, and the pixels are a pure function of the row and the image size.

Rendering draws the chart once at ``detail`` times the shown size (Agg, no pyplot, fonts and sizes
set on every element, under one process-wide lock: matplotlib's font cache is not thread-safe, and the
envs reset on their own threads); the shown image is that render downscaled, and the ``zoom`` tool
crops the large one, so a zoom shows detail the small image lost.
"""

from __future__ import annotations

import functools
import io
import json
import random
import threading
from dataclasses import dataclass
from typing import Any

from PIL import Image

from chatgym.envs.visual.images import to_data_url

KINDS = ("bar", "line")
QUESTION_TYPES = ("max", "min", "value", "diff")
# (title, x label, y label, categories); a theme whose categories are ordered (months) keeps them in order.
THEMES: tuple[tuple[str, str, str, tuple[str, ...], bool], ...] = (
    ("Fruit sold", "Fruit", "Boxes", ("Apples", "Bananas", "Cherries", "Grapes", "Lemons", "Mangoes", "Pears", "Plums"), False),
    ("Visitors by city", "City", "Visitors (thousands)", ("Oslo", "Lima", "Cairo", "Perth", "Quito", "Seoul", "Turin", "Dakar"), False),
    ("Rainfall by month", "Month", "Rain (mm)", ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug"), True),
    ("Books read", "Student", "Books", ("Ana", "Ben", "Cleo", "Dev", "Eli", "Fay", "Gus", "Hana"), False),
    ("Sales by quarter", "Quarter", "Units", ("Q1", "Q2", "Q3", "Q4", "Q5", "Q6", "Q7", "Q8"), True),
    ("Animals counted", "Animal", "Count", ("Ants", "Bees", "Crows", "Deer", "Eels", "Foxes", "Geese", "Hares"), False),
)
FONT = "DejaVu Sans"  # shipped with matplotlib: the same glyphs on every machine
BAR_COLOR = "#3b75af"
_RENDER_LOCK = threading.Lock()


def make_spec(rng: random.Random, kinds: tuple[str, ...], n_min: int, n_max: int, lo: int, hi: int) -> dict[str, Any]:
    """A seeded chart spec: a theme, ``n_min``..``n_max`` categories, distinct values in ``lo..hi``."""
    title, x_label, y_label, names, ordered = rng.choice(THEMES)
    n = rng.randint(n_min, n_max)
    if ordered:
        start = rng.randint(0, len(names) - n)
        categories = list(names[start : start + n])
    else:
        categories = rng.sample(names, n)
    return {
        "kind": rng.choice(kinds),
        "title": title,
        "x_label": x_label,
        "y_label": y_label,
        "categories": categories,
        "values": rng.sample(range(lo, hi + 1), n),
    }


def make_question(rng: random.Random, spec: dict[str, Any], types: tuple[str, ...]) -> dict[str, Any]:
    """A question about ``spec``: ``question``, ``answer`` (str), ``question_type`` and ``targets``
    (the categories it is about; empty for max/min, which need the whole chart)."""
    cats, vals = spec["categories"], spec["values"]
    noun = spec["x_label"].lower()
    kind = rng.choice(types)
    if kind in ("max", "min"):
        pick = max if kind == "max" else min
        best = cats[vals.index(pick(vals))]
        word = "highest" if kind == "max" else "lowest"
        return {"question": f"Which {noun} has the {word} value in the chart?", "answer": best, "question_type": kind, "targets": []}
    if kind == "value":
        i = rng.randrange(len(cats))
        return {"question": f"What is the value for {cats[i]}?", "answer": str(vals[i]), "question_type": kind, "targets": [cats[i]]}
    i, j = rng.sample(range(len(cats)), 2)
    if vals[i] < vals[j]:
        i, j = j, i
    return {
        "question": f"How much higher is the value for {cats[i]} than for {cats[j]}?",
        "answer": str(vals[i] - vals[j]),
        "question_type": "diff",
        "targets": [cats[i], cats[j]],
    }


def check_spec(spec: Any) -> None:
    """Raise ``ValueError`` naming the problem when ``spec`` is not a chart spec."""
    if not isinstance(spec, dict):
        raise ValueError(f"chart must be a dict, got {type(spec).__name__}")
    missing = [k for k in ("kind", "title", "x_label", "y_label", "categories", "values") if k not in spec]
    if missing:
        raise ValueError(f"chart is missing {missing}")
    if spec["kind"] not in KINDS:
        raise ValueError(f"chart kind must be one of {KINDS}, got {spec['kind']!r}")
    cats, vals = spec["categories"], spec["values"]
    if not (isinstance(cats, list) and cats and all(isinstance(c, str) and c for c in cats) and len(set(cats)) == len(cats)):
        raise ValueError("chart categories must be a non-empty list of distinct non-empty str")
    if not (isinstance(vals, list) and len(vals) == len(cats) and all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in vals)):
        raise ValueError("chart values must be one int >= 0 per category")


@dataclass(frozen=True)
class RenderedChart:
    """A chart drawn once: the shown image (``size`` px square) and its PNG data URL, the large render
    (``size * detail`` px) the zoom crops, kept as PNG bytes (a 1024 px RGB image is 3 MB, its PNG
    about 40 KB, and the cache holds many charts; :meth:`large` decodes it), each category's box and the plot area's box in shown-image
    pixels ``(x0, y0, x1, y1)``, origin top-left (a category's box covers its bar or point, its value
    label and its tick label)."""

    image: Image.Image
    data_url: str
    large_png: bytes
    detail: int
    regions: dict[str, tuple[int, int, int, int]]
    plot_box: tuple[int, int, int, int]

    def large(self) -> Image.Image:
        """The large render, decoded (RGB, ``size * detail`` px square)."""
        with Image.open(io.BytesIO(self.large_png)) as im:
            return im.convert("RGB")


def render_chart(spec: dict[str, Any], size: int, detail: int) -> RenderedChart:
    """Draw ``spec`` (cached: the same spec and sizes give the same object; treat it as read-only)."""
    return _render_cached(json.dumps(spec, sort_keys=True), size, detail)


@functools.lru_cache(maxsize=256)
def _render_cached(spec_json: str, size: int, detail: int) -> RenderedChart:
    spec = json.loads(spec_json)
    with _RENDER_LOCK:
        large, boxes, plot = _draw(spec, size * detail)
    image = large.resize((size, size), Image.Resampling.LANCZOS)

    def shown(b: tuple[float, float, float, float]) -> tuple[int, int, int, int]:
        x0, y0, x1, y1 = (v / detail for v in b)
        pad = 2
        return (max(0, int(x0) - pad), max(0, int(y0) - pad), min(size, int(x1) + 1 + pad), min(size, int(y1) + 1 + pad))

    regions = {c: shown(b) for c, b in zip(spec["categories"], boxes, strict=True)}
    buf = io.BytesIO()
    large.save(buf, format="PNG", compress_level=1)
    return RenderedChart(image, to_data_url(image), buf.getvalue(), detail, regions, shown(plot))


def _draw(spec: dict[str, Any], px: int) -> tuple[Image.Image, list[tuple[float, float, float, float]], tuple[float, float, float, float]]:
    """The chart at ``px`` x ``px`` pixels; each category's box and the axes' box in its pixels
    (origin top-left)."""
    import numpy as np

    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
        from matplotlib.transforms import Bbox
    except ImportError as exc:
        raise ImportError("ChartQA-v0 needs matplotlib: pip install 'chatgym[visual]'") from exc

    inches = 4.0  # the layout is in points, so the chart looks the same at every size
    fig = Figure(figsize=(inches, inches), dpi=px / inches, facecolor="white")
    canvas = FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    cats, vals = spec["categories"], spec["values"]
    xs = list(range(len(cats)))
    font = {"fontfamily": FONT}
    if spec["kind"] == "bar":
        marks = list(ax.bar(xs, vals, color=BAR_COLOR, width=0.6))
    else:
        ax.plot(xs, vals, color=BAR_COLOR, linewidth=1.5)
        marks = [ax.plot([x], [v], "o", color=BAR_COLOR, markersize=5)[0] for x, v in zip(xs, vals, strict=True)]
    labels = [
        ax.annotate(
            str(v), (x, v), xytext=(0, 4), textcoords="offset points", ha="center", va="bottom", fontsize=8,
            # a white box keeps a line chart's label readable where the line crosses it
            bbox={"boxstyle": "square,pad=0.1", "facecolor": "white", "edgecolor": "none"}, **font,
        )
        for x, v in zip(xs, vals, strict=True)
    ]
    ax.set_xticks(xs, cats, fontsize=8, rotation=30 if len(cats) > 5 else 0, **font)
    ax.tick_params(axis="y", labelsize=7)
    for t in ax.get_yticklabels():
        t.set_fontfamily(FONT)
    ax.set_ylim(0, max(vals) * 1.18 + 1)
    ax.set_xlim(-0.6, len(cats) - 0.4)
    ax.set_title(spec["title"], fontsize=10, **font)
    ax.set_xlabel(spec["x_label"], fontsize=8, **font)
    ax.set_ylabel(spec["y_label"], fontsize=8, **font)
    fig.tight_layout(pad=0.4)
    canvas.draw()
    renderer = canvas.get_renderer()
    ticks = ax.get_xticklabels()
    height = fig.bbox.height

    def flip(b: Bbox) -> tuple[float, float, float, float]:
        return (b.x0, height - b.y1, b.x1, height - b.y0)

    boxes = [
        flip(Bbox.union([m.get_window_extent(renderer), lab.get_window_extent(renderer), t.get_window_extent(renderer)]))
        for m, lab, t in zip(marks, labels, ticks, strict=True)
    ]
    plot = flip(Bbox.union([ax.get_window_extent(renderer), *(t.get_window_extent(renderer) for t in ticks)]))
    rgba = np.asarray(canvas.buffer_rgba())
    return Image.fromarray(rgba[..., :3].copy()), boxes, plot
