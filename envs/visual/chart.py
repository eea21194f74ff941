"""ChartQA-v0: questions over a matplotlib-rendered bar or line chart, with a ``zoom`` tool.

Each episode is one seeded chart (a bar or line chart of 4-7 categories, each value printed above its
bar or point; :mod:`chatgym.envs.visual.chartgen`) and one question about it: which category is
largest / smallest, the value of one category, or the difference of two. The opening user message
holds the question and the chart as an image (``image_size`` px square).

The ``zoom`` tool takes ``bbox = [x0, y0, x1, y1]`` in the shown image's pixels (origin top-left; a
box reaching past the image is clipped to it) and answers with a ``tool`` message whose content is a
list of parts: a text line naming the region, then the region as an image whose longer side is
``image_size`` px, cropped from a render ``zoom_detail`` times larger than the shown one (so the zoom
shows detail the small image lost). A region under 4 px a side, a malformed call or a zoom past
``max_zooms`` is answered by an error ``tool`` message; the episode goes on.

A turn without a tool call is the answer: the text of the last ``<answer>…</answer>`` outside
``<think>`` (the whole reply without a tag, ``info["reward_components"]["format"]`` 0). Scoring is an
exact match after normalisation (:func:`answers_match`): numbers by value (``1,234``, `` 42 `` and
``42.0`` are 42; nothing else may stand beside the number), category names case- and
punctuation-insensitively. Reward 1.0 and ``success`` True on a match, else 0.0 and False. An episode
that reaches ``max_turns`` without an answer is truncated with ``success`` False.

The reference policy zooms once into the region the question is about (the target categories' bars,
or the whole plot area for largest / smallest), then answers with the gold answer; with
``reference_zoom=False`` it answers at once.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Sequence
from typing import Any

from chatgym.envs import messages as M
from chatgym.envs.core import AssistantTurn, ChatEnv, StepOutcome, load_prompt
from chatgym.envs.tools import Tool, ToolResult
from chatgym.envs.visual import chartgen
from chatgym.envs.visual.grid import outside_reasoning
from chatgym.envs.visual.images import image_part, text_part, transcript, zoom_crop
from chatgym.envs.visual.tasks import DEFAULT_SIZES, SeededTasks, check_split

_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.S | re.I)
_NUMBER = re.compile(r"[-+]?\d+(?:\.\d+)?")
_NOT_WORD = re.compile(r"[\W_]+")
MIN_ZOOM_PX = 4
ZOOM_SCHEMA = {
    "type": "object",
    "properties": {
        "bbox": {
            "type": "array",
            "items": {"type": "number"},
            "minItems": 4,
            "maxItems": 4,
            "description": "The region [x0, y0, x1, y1] in the chart image's pixels, origin at the top left.",
        }
    },
    "required": ["bbox"],
    "additionalProperties": False,
}


def _number(text: str) -> float | None:
    t = text.strip().replace(",", "").rstrip(".").strip()
    return float(t) if _NUMBER.fullmatch(t) else None


def answers_match(answer: str, gold: str) -> bool:
    """The scorer: numbers (the gold one is) equal by value, after dropping thousands commas and a
    final full stop, with nothing else beside the number; names equal after case folding and
    dropping everything but letters and digits (``" apples."`` matches ``"Apples"``)."""
    g = _number(gold)
    if g is not None:
        return _number(answer) == g
    norm = _NOT_WORD.sub("", answer.casefold())
    return bool(norm) and norm == _NOT_WORD.sub("", gold.casefold())


@functools.lru_cache(maxsize=16)
def chart_tasks(split: str, n: int, seed: int, settings: str) -> SeededTasks:
    """The seeded chart question rows of a split (``settings``: the generator's keywords as JSON)."""
    s = json.loads(settings)

    def make(rng):
        spec = chartgen.make_spec(rng, tuple(s["kinds"]), s["min_categories"], s["max_categories"], *s["value_range"])
        row = {"chart": spec, **chartgen.make_question(rng, spec, tuple(s["question_types"]))}
        return row, json.dumps([spec, row["question"]], sort_keys=True)

    return SeededTasks("chart_qa", split, n, seed, make)


class ChartQAEnv(ChatEnv):
    """ChartQA-v0 (see the module docstring).

    Args:
        split: ``train`` or ``test`` (disjoint, see :mod:`chatgym.envs.visual.tasks`).
        num_tasks: rows in the split (default 5000 train / 200 test; made on first access).
        seed: base seed of the generator.
        kinds: chart kinds to draw from (``bar``, ``line``).
        question_types: question kinds to draw from (``max``, ``min``, ``value``, ``diff``).
        min_categories, max_categories: categories per chart (2..8; default 4..7).
        value_range: ``(lo, hi)``, the values' range (distinct integers, ``0 <= lo``, at least
            ``max_categories`` of them).
        image_size: the shown chart's side in pixels (default 256); ``reset(options={"image_size": n})``
            overrides it for one episode. Zoom results have the same longer side.
        zoom_detail: the zoom's source is rendered this many times larger (1..8; default 4).
        max_zooms: zoom calls per episode (default 2); ``max_turns`` defaults to ``max_zooms + 1``.
        reference_zoom: the reference policy zooms before answering (default True).
        parser: the tool-call format of the model's text (default ``hermes``).

    Raises:
        ValueError: a setting out of range (named).
    """

    image_observations = True
    reset_options = ChatEnv.reset_options | {"image_size"}

    def __init__(
        self,
        *,
        split: str = "train",
        num_tasks: int | None = None,
        seed: int = 0,
        kinds: Sequence[str] = chartgen.KINDS,
        question_types: Sequence[str] = chartgen.QUESTION_TYPES,
        min_categories: int = 4,
        max_categories: int = 7,
        value_range: Sequence[int] = (5, 95),
        image_size: int = 256,
        zoom_detail: int = 4,
        max_zooms: int = 2,
        reference_zoom: bool = True,
        max_turns: int | None = None,
        **kwargs: Any,
    ):
        check_split("ChartQA-v0", split)  # here: the tasks load only at the first reset
        self._settings = _check_settings(kinds, question_types, min_categories, max_categories, value_range)
        _check_image_size(image_size)
        if not 1 <= zoom_detail <= 8:
            raise ValueError(f"ChartQA-v0: zoom_detail must be in 1..8, got {zoom_detail}")
        if max_zooms < 0:
            raise ValueError(f"ChartQA-v0: max_zooms must be >= 0, got {max_zooms}")
        zoom = Tool("zoom", "Show a region of the chart enlarged.", ZOOM_SCHEMA, self._zoom)
        super().__init__(split=split, tools=[zoom] if max_zooms else [], max_turns=max_turns or max_zooms + 1, **kwargs)
        self.num_tasks, self.seed = num_tasks, seed
        self.image_size, self.zoom_detail, self.max_zooms = image_size, zoom_detail, max_zooms
        self.reference_zoom = reference_zoom
        self.stop_strings: list[str] = []
        self._prompt = load_prompt(__package__, "chart_system.txt")
        self.chart: chartgen.RenderedChart | None = None
        self.zooms = 0
        self._episode_image_size = image_size

    def load_tasks(self, split: str) -> Sequence[dict[str, Any]]:
        n = self.num_tasks or DEFAULT_SIZES.get(split, 1)
        return chart_tasks(split, n, self.seed, json.dumps(self._settings, sort_keys=True))

    async def areset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        self._check_options(options)  # before reading one: a list here was an AttributeError
        size = (options or {}).get("image_size", self.image_size)
        _check_image_size(size)
        self._episode_image_size = int(size)
        return await super().areset(seed=seed, options=options)

    async def on_reset(self, task: dict[str, Any]) -> None:
        chartgen.check_spec(task.get("chart"))
        if not (isinstance(task.get("question"), str) and isinstance(task.get("answer"), str)):
            raise ValueError("a ChartQA-v0 row needs a str 'question' and a str 'answer'")
        self.chart = chartgen.render_chart(task["chart"], self._episode_image_size, self.zoom_detail)
        self.zooms = 0

    def initial_messages(self, task: dict[str, Any]) -> list[dict[str, Any]]:
        assert self.chart is not None
        size = self._episode_image_size
        system = self._prompt.format(image_size=size, max_zooms=self.max_zooms)
        image = {"type": "image_url", "image_url": {"url": self.chart.data_url}}
        return [M.system(system), {"role": "user", "content": [text_part(task["question"]), image]}]

    def _zoom(self, bbox: list[float]) -> ToolResult:
        chart, size = self.chart, self._episode_image_size
        if chart is None:
            return ToolResult("Error: no chart (the episode has not started).", is_error=True)
        if self.zooms >= self.max_zooms:
            return ToolResult(f"Error: zoom limit reached ({self.max_zooms} per question); answer now.", is_error=True)
        x0, y0, x1, y1 = (min(max(float(v), 0.0), float(size)) for v in bbox)
        if x1 - x0 < MIN_ZOOM_PX or y1 - y0 < MIN_ZOOM_PX:
            return ToolResult(
                f"Error: bbox {bbox} covers less than {MIN_ZOOM_PX}x{MIN_ZOOM_PX} pixels of the "
                f"{size}x{size} image; give [x0, y0, x1, y1] with x0 < x1 and y0 < y1.",
                is_error=True,
            )
        self.zooms += 1
        large = chart.large()
        d = large.width / size
        crop = zoom_crop(large, (x0 * d, y0 * d, x1 * d, y1 * d), size)
        shown = ", ".join(f"{v:g}" for v in (x0, y0, x1, y1))
        note = f"Zoom of [{shown}] (a {x1 - x0:g}x{y1 - y0:g} pixel region), shown at {crop.width}x{crop.height}:"
        return ToolResult([text_part(note), image_part(crop)], info={"zooms": self.zooms})

    async def react(self, turn: AssistantTurn) -> StepOutcome:
        out = await super().react(turn)
        if not out.terminated and self.turn >= self.max_turns:
            # The last turn went to tools: the episode is truncated unanswered.
            out.info["success"] = False
            out.info["reward_components"] = {"correct": 0.0, "format": 0.0}
        out.info.setdefault("zooms", self.zooms)
        return out

    async def score(self, turn: AssistantTurn) -> StepOutcome:
        assert self.task is not None
        tags = _ANSWER.findall(outside_reasoning(turn.raw_text))
        answer = tags[-1].strip() if tags else outside_reasoning(turn.parsed.content).strip()
        right = answers_match(answer, self.task["answer"])
        info = {
            "answer": answer,
            "expected": self.task["answer"],
            "zooms": self.zooms,
            "success": right,
            "reward_components": {"correct": float(right), "format": float(bool(tags))},
        }
        return StepOutcome(reward=float(right), terminated=True, info=info)

    def reference_region(self) -> tuple[int, int, int, int]:
        """The region the reference zooms into: the union of the target categories' boxes, or the
        plot area when the question has no targets (``(x0, y0, x1, y1)``, shown-image pixels).

        Raises:
            RuntimeError: called before ``reset``.
        """
        if self.chart is None or self.task is None:
            raise RuntimeError("call reset() before reference_region()")
        boxes = [self.chart.regions[c] for c in self.task.get("targets") or [] if c in self.chart.regions]
        if not boxes:
            return self.chart.plot_box
        return (min(b[0] for b in boxes), min(b[1] for b in boxes), max(b[2] for b in boxes), max(b[3] for b in boxes))

    def reference_action(self) -> str | M.Message:
        """A zoom into :meth:`reference_region` (first turn, when ``reference_zoom`` and zooms are
        allowed), then the gold answer in ``<answer>`` tags.

        Raises:
            RuntimeError: called before ``reset``.
        """
        if self.task is None:
            raise RuntimeError("call reset() before reference_action()")
        if self.reference_zoom and self.max_zooms and self.zooms == 0 and self.turn == 0:
            call = M.make_tool_call("zoom", {"bbox": list(self.reference_region())}, "call_zoom_0")
            return M.assistant("", [call])
        return f"<answer>{self.task['answer']}</answer>"

    def render(self) -> str | None:
        if self.render_mode != "ansi":
            return None
        return transcript(self.messages)


def _check_image_size(image_size: Any) -> None:
    if not (isinstance(image_size, int) and not isinstance(image_size, bool) and 64 <= image_size <= 1024):
        raise ValueError(f"ChartQA-v0: image_size must be an int in 64..1024, got {image_size!r}")


def _check_settings(kinds, question_types, n_min, n_max, value_range) -> dict[str, Any]:
    kinds, types = list(kinds), list(question_types)
    if not kinds or set(kinds) - set(chartgen.KINDS):
        raise ValueError(f"ChartQA-v0: kinds must be a non-empty subset of {chartgen.KINDS}, got {kinds}")
    if not types or set(types) - set(chartgen.QUESTION_TYPES):
        raise ValueError(f"ChartQA-v0: question_types must be a non-empty subset of {chartgen.QUESTION_TYPES}, got {types}")
    if not 2 <= n_min <= n_max <= 8:
        raise ValueError(f"ChartQA-v0: need 2 <= min_categories <= max_categories <= 8, got {n_min}, {n_max}")
    lo, hi = (int(v) for v in value_range)
    if lo < 0 or hi - lo + 1 < n_max:
        raise ValueError(f"ChartQA-v0: value_range {tuple(value_range)} must have lo >= 0 and >= {n_max} values")
    return {"kinds": kinds, "question_types": types, "min_categories": n_min, "max_categories": n_max, "value_range": [lo, hi]}
