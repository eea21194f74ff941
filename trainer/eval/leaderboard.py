"""The leaderboard: models x envs from the results store, as a rich table and a static HTML page.

A row is one model identity with one set of sampling settings: (name, weights hash, engine,
sampling). A column is one env version: (id, ``-vN``, dataset hash, split, extra ``gym.make``
keywords), so results on different env versions are never mixed. A cell pools every episode of its
row and column — several seeds or several days add samples to the same tasks — once per (seed, task,
sample index): grids that differ only in ``-n`` share their first samples, which count once (see
:func:`_distinct`). Its metrics come from :func:`.metrics.cell_metrics`.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from chatgym.trainer.eval.identity import EnvId
from chatgym.trainer.eval.scores import CellMetrics, cell_metrics
from chatgym.trainer.eval.store import ResultsStore

ROW_FIELDS = ("model_name", "model_hash", "engine", "sampling")
COLUMN_FIELDS = ("env_id", "env_version", "dataset_hash", "split", "env_kwargs")


@dataclass
class Cell:
    metrics: CellMetrics
    samples: list[dict[str, Any]] = field(default_factory=list)  # sample episodes with their traces


@dataclass
class Leaderboard:
    """Rows (models), columns (env versions) and their cells; labels are unique and human-readable."""

    rows: list[tuple[Any, ...]]
    columns: list[tuple[Any, ...]]
    row_labels: dict[tuple[Any, ...], str]
    column_labels: dict[tuple[Any, ...], str]
    cells: dict[tuple[tuple[Any, ...], tuple[Any, ...]], Cell]
    k: int

    def cell(self, row: tuple[Any, ...], column: tuple[Any, ...]) -> Cell | None:
        return self.cells.get((row, column))


def _sampling_label(sampling: str) -> str:
    settings = json.loads(sampling or "{}")
    threshold = settings.pop("success_threshold", None)
    if not settings:
        parts = ["scripted"]
    else:
        parts = [f"T={settings.get('temperature')}"]
        if settings.get("top_p", 1.0) != 1.0:
            parts.append(f"top_p={settings['top_p']}")
        parts.append(f"max_tokens={settings.get('max_tokens')}")
    if threshold is not None:
        parts.append(f"success>={threshold}")
    return " ".join(parts)


def _row_labels(rows: Sequence[tuple[Any, ...]]) -> dict[tuple[Any, ...], str]:
    """A unique label per row: the model's name, then what tells its rows apart — the weights hash
    (``@``), the engine (``[vllm]``), the sampling settings — and, where settings the short form leaves
    out (``top_k``, ...) still leave two rows alike, a short hash of the sampling settings."""
    by_name: dict[str, list[tuple[Any, ...]]] = defaultdict(list)
    for r in rows:
        by_name[r[0]].append(r)
    labels = {}
    for name, group in by_name.items():
        hashes, engines, samplings = ({r[i] for r in group} for i in (1, 2, 3))
        for r in group:
            label = name
            if len(hashes) > 1:
                label += f" @{r[1][:8]}"
            if len(engines) > 1:
                label += f" [{r[2]}]"
            if len(samplings) > 1:
                label += f" ({_sampling_label(r[3])})"
            labels[r] = label
        counts = Counter(labels[r] for r in group)
        for r in group:
            if counts[labels[r]] > 1:
                labels[r] += f" {{{hashlib.sha256(str(r[3]).encode()).hexdigest()[:6]}}}"
    return labels


def trace_file(path: str | None, db: str | os.PathLike | None = None) -> Path | None:
    """The trace file a row names, or None when it is missing.

    Rows written before chatgym stored absolute paths hold one relative to the directory ``chatgym
    eval`` ran in; when that does not resolve from here, the file of that name in the default traces
    directory next to ``db`` is used.
    """
    if not path:
        return None
    candidates = [Path(path)]
    if db is not None and not Path(path).is_absolute():
        candidates.append(Path(db).expanduser().parent / "traces" / Path(path).name)
    return next((c for c in candidates if c.is_file()), None)


def load_sample_trace(
    path: str | None, task_index: int, sample_index: int, db: str | os.PathLike | None = None
) -> dict[str, Any] | None:
    """The last trace record of episode (task, sample) in ``path`` (a rerun after an interruption may
    have appended a second one), or None when the file or record is missing (``db``: see
    :func:`trace_file`)."""
    file = trace_file(path, db)
    if file is None:
        return None
    found = None
    with open(file, encoding="utf-8") as f:
        for line in f:
            if f'"group_id": {task_index},' not in line:
                continue  # skip the JSON parse of other episodes' (long) lines
            rec = json.loads(line)
            if rec.get("group_id") == task_index and rec.get("sample_index") == sample_index:
                found = rec
    return found


def _samples(
    rows: Sequence[Mapping[str, Any]], per_cell: int, db: str | os.PathLike | None = None
) -> list[dict[str, Any]]:
    """Up to ``per_cell`` sample episodes: first a success, then a non-success, then others."""
    ordered = sorted(rows, key=lambda r: (r["task_index"], r["sample_index"]))
    picks: list[Mapping[str, Any]] = []
    for want in (1, 0):
        hit = next((r for r in ordered if r["success"] == want), None)
        if hit is not None and len(picks) < per_cell:
            picks.append(hit)
    picks += [r for r in ordered if r not in picks][: max(0, per_cell - len(picks))]
    out = []
    for r in picks:
        trace = load_sample_trace(r.get("trace_path"), r["task_index"], r["sample_index"], db)
        out.append({"row": dict(r), "messages": (trace or {}).get("messages")})
    return out


def _distinct(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """``rows`` (one cell's) with one episode per ``(seed, task_index, sample_index)``: the first stored.

    Grids that differ only in ``-n`` (two run keys) both hold samples 0..min(n)-1 of each task, and
    an episode's sampling seed depends only on its seed and grid position, so those are the same
    sample twice. Collapsing them (rather than splitting rows by ``n``) keeps the model in one row and
    pass@k correct: the unbiased estimator needs n *distinct* samples per task — a duplicate would
    inflate n and count one success twice — and the larger grid's extra samples still add.
    """
    seen: set[tuple[Any, ...]] = set()
    out = []
    for r in rows:  # store order (by id): the first stored copy wins
        position = (r["seed"], r["task_index"], r["sample_index"])
        if position not in seen:
            seen.add(position)
            out.append(r)
    return out


def build_leaderboard(
    store: ResultsStore,
    *,
    k: int | None = None,
    env_ids: Sequence[str] = (),
    models: Sequence[str] = (),
    samples_per_cell: int = 2,
) -> Leaderboard:
    """Aggregate the store into a :class:`Leaderboard`.

    Args:
        store: the open results store.
        k: pass@k budget (default: the most samples per task of any cell), capped per cell at its
            samples per task.
        env_ids, models: keep only these env ids / model names (empty: all).
        samples_per_cell: sample episodes (with traces) kept per cell for the page.
    """
    rows = store.episodes()
    if env_ids:
        rows = [r for r in rows if r["env_id"] in env_ids]
    if models:
        rows = [r for r in rows if r["model_name"] in models]
    groups: dict[tuple[tuple[Any, ...], tuple[Any, ...]], list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        groups[(tuple(r[f] for f in ROW_FIELDS), tuple(r[f] for f in COLUMN_FIELDS))].append(r)
    groups = {key: _distinct(eps) for key, eps in groups.items()}
    if k is None:
        k = 1
        for eps in groups.values():
            per_task: dict[int, int] = defaultdict(int)
            for e in eps:
                per_task[e["task_index"]] += 1
            k = max(k, min(per_task.values()))
    cells = {
        key: Cell(
            cell_metrics(eps, k=k, wall_s=store.wall_seconds(eps)),
            _samples(eps, samples_per_cell, store.path),
        )
        for key, eps in groups.items()
    }
    row_keys = sorted({key[0] for key in groups}, key=lambda r: (r[0] == "reference", r[0], r[1], r[3]))
    col_keys = sorted({key[1] for key in groups})
    col_labels = {c: EnvId(c[0], c[1], c[2], c[3], c[4], 0).column for c in col_keys}
    return Leaderboard(row_keys, col_keys, _row_labels(row_keys), col_labels, cells, k)


def fmt(value: float | None, digits: int = 3) -> str:
    """Fixed-point text of a metric (``-`` for a missing one): the page and the console agree."""
    return "-" if value is None else f"{value:.{digits}f}"


def ci_text(m: CellMetrics) -> str:
    if m.reward_ci_low is None or m.reward_ci_high is None:
        return ""
    return f"[{fmt(m.reward_ci_low)}, {fmt(m.reward_ci_high)}]"


def metric_columns(m: CellMetrics) -> list[tuple[str, str]]:
    """``(header, text)`` of every metric of a cell, in display order."""
    return [
        ("pass@1", fmt(m.pass_at_1)),
        (f"pass@{m.k}" if m.k > 1 else "pass@k (k=1)", fmt(m.pass_at_k)),
        ("mean reward", fmt(m.mean_reward)),
        ("95% CI", ci_text(m) or "-"),
        ("turns", fmt(m.mean_turns, 2)),
        ("tokens/ep", fmt(m.tokens_per_episode, 1)),
        ("tool err rate", fmt(m.tool_error_rate)),
        ("fail rate", fmt(m.failure_rate)),
        ("wall s", fmt(m.wall_s, 1)),
        ("episodes", str(m.episodes)),
        ("tasks x n", f"{m.tasks} x {m.samples_per_task}"),
    ]


def metric_table(metrics: Sequence[CellMetrics]) -> tuple[list[str], list[list[str]]]:
    """Headers and each row's texts of one env's metrics table (rows: ``metrics``).

    A cell's pass@k uses ``k`` capped at its samples per task, so rows may differ (a model at ``-n 4``,
    the reference at ``-n 1``): then the header is ``pass@k`` and each value names its own ``k``,
    instead of a header taken from one row that is false for the others.
    """
    columns = [metric_columns(m) for m in metrics]
    headers = [header for header, _ in columns[0]]
    if len({m.k for m in metrics}) > 1:
        at = 1  # the pass@k column (metric_columns' order)
        headers[at] = "pass@k"
        for m, row in zip(metrics, columns, strict=True):
            row[at] = ("pass@k", f"{row[at][1]} (k={m.k})")
    return headers, [[text for _, text in row] for row in columns]


def rich_tables(board: Leaderboard) -> list[Any]:
    """The console view: models x envs (mean reward [95% CI] and pass@1), then one table per env."""
    from rich.table import Table

    # No k here: the cells are pass@1; each env table names its pass@k with the k of each cell.
    main = Table(title="chatgym leaderboard: mean reward [95% CI] / pass@1")
    main.add_column("model")
    for c in board.columns:
        main.add_column(board.column_labels[c], justify="right")
    for r in board.rows:
        cells = []
        for c in board.columns:
            cell = board.cell(r, c)
            if cell is None:
                cells.append("-")
            else:
                m = cell.metrics
                cells.append(f"{fmt(m.mean_reward)} {ci_text(m)}\npass@1 {fmt(m.pass_at_1)}".strip())
        main.add_row(board.row_labels[r], *cells)
    tables = [main]
    for c in board.columns:
        present = [(r, board.cell(r, c)) for r in board.rows if board.cell(r, c) is not None]
        if not present:
            continue
        t = Table(title=board.column_labels[c])
        t.add_column("model")
        headers, texts = metric_table([cell.metrics for _, cell in present])
        for header in headers:
            t.add_column(header, justify="right")
        for (r, _), row_texts in zip(present, texts, strict=True):
            t.add_row(board.row_labels[r], *row_texts)
        tables.append(t)
    return tables
