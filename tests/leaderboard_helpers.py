"""Helpers shared by the leaderboard page tests: headless Chromium (the offline flags of
../shared/TESTING.md), a parser for the dumped DOM, and the expected numbers computed with SQL."""

from __future__ import annotations

import shutil
import sqlite3
import subprocess
from html.parser import HTMLParser
from pathlib import Path

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
# Flags that work offline (../shared/TESTING.md); a fresh profile per run.
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def sql_expected(db: Path) -> dict[tuple[str, str], tuple[str, str, int]]:
    """(model, env id) -> (mean reward over task means, pass@1, episodes), formatted like the page."""
    conn = sqlite3.connect(db)
    out = {}
    for model, env, mean, p1, n in conn.execute(
        "SELECT model_name, env_id, AVG(r), AVG(p), SUM(n) FROM ("
        "  SELECT model_name, env_id, AVG(reward) AS r, AVG(success) AS p, COUNT(*) AS n FROM episodes"
        "  GROUP BY model_name, env_id, task_index) GROUP BY model_name, env_id"
    ):
        out[(model, env)] = (f"{mean:.3f}", f"{p1:.3f}", n)
    conn.close()
    return out


class PageDom(HTMLParser):
    """Collects the main table's cells (by data-model / data-env) and row order, metrics tables'
    rows, element ids and trace links."""

    def __init__(self):
        super().__init__()
        self.cells: dict[tuple[str, str], dict[str, str]] = {}
        self.row_order: list[str] = []
        self.ids: set[str] = set()
        self.links: list[str] = []
        self.sorted_headers: list[str] = []
        self.metric_rows: dict[tuple[str, str], list[str]] = {}
        self._cell = self._span = self._metrics_env = self._metric_row = None
        self._in_model = self._in_td = False

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if "id" in a:
            self.ids.add(a["id"])
        if tag == "a" and a.get("href", "").startswith("#"):
            self.links.append(a["href"][1:])
        if tag == "th" and "sorted-desc" in (a.get("class") or ""):
            self.sorted_headers.append("desc")
        if tag == "td" and a.get("data-testid") == "model":
            self._in_model = True
            self.row_order.append("")
        if tag == "td" and "data-model" in a:
            self._cell = self.cells.setdefault((a["data-model"], a["data-env"]), {})
        if tag == "span" and self._cell is not None:
            self._span = a.get("class")
        if tag == "table" and a.get("class") == "metrics":
            self._metrics_env = a["data-env"]
        if tag == "tr" and self._metrics_env and "data-model" in a:
            self._metric_row = self.metric_rows.setdefault((a["data-model"], self._metrics_env), [])
        if tag == "td" and self._metric_row is not None:
            self._metric_row.append("")
            self._in_td = True

    def handle_endtag(self, tag):
        if tag == "td":
            self._cell, self._in_model, self._in_td = None, False, False
        if tag == "span":
            self._span = None
        if tag == "tr":
            self._metric_row = None
        if tag == "table":
            self._metrics_env = None

    def handle_data(self, data):
        if self._in_model:
            self.row_order[-1] += data.strip()
        if self._cell is not None and self._span:
            self._cell[self._span] = self._cell.get(self._span, "") + data.strip()
        if self._in_td and self._metric_row is not None:
            self._metric_row[-1] += data.strip()


def chromium(args: list[str], tmp_path: Path) -> subprocess.CompletedProcess:
    profile = tmp_path / "profile"
    profile.mkdir(exist_ok=True)
    return subprocess.run(
        [CHROMIUM, *FLAGS, f"--user-data-dir={profile}", *args], capture_output=True, text=True, timeout=120
    )


def page_matches_sqlite(db: Path, page: Path, tmp_path: Path, fragment: str = "") -> PageDom:
    """Open ``page`` in headless Chromium and assert each models x envs cell and each metrics-table
    row shows the numbers computed with SQL from ``db``; returns the parsed DOM."""
    dom = chromium(["--dump-dom", page.as_uri() + fragment], tmp_path)
    assert dom.returncode == 0, dom.stderr[-2000:]
    parsed = PageDom()
    parsed.feed(dom.stdout)
    expected = sql_expected(db)
    assert {(model, env.split("@")[0]) for model, env in parsed.cells} == set(expected)
    for (model, env_label), cell in parsed.cells.items():
        mean, p1, episodes = expected[(model, env_label.split("@")[0])]
        assert cell["mean"] == mean, (model, env_label)
        assert cell["p1"] == f"pass@1 {p1}", (model, env_label)
        row = parsed.metric_rows[(model, env_label)]
        # model, pass@1, pass@k, mean reward, CI, turns, tokens/ep, tool err, fail, wall, episodes, tasks x n
        assert (row[0], row[1], row[3], row[10]) == (model, p1, mean, str(episodes))
    return parsed


def report_json(stdout: str) -> str:
    """The JSON report ``chatgym eval`` prints (from a line ``[`` to a line ``]``), out of a stdout
    that may also hold an engine's log lines."""
    lines = stdout.splitlines()
    start = lines.index("[")
    return "\n".join(lines[start : lines.index("]", start) + 1])


def store_row(**over) -> dict:
    """One episode row for ``ResultsStore.add_episode`` (Math-v0, model "m", seed 0), ``over`` applied."""
    row = {
        "run_key": "k1",
        "model_name": "m",
        "model_hash": "h",
        "engine": "vllm",
        "env_id": "Math-v0",
        "env_version": "v0",
        "dataset_hash": "d",
        "split": "test",
        "env_kwargs": "{}",
        "seed": 0,
        "sampling": '{"max_tokens":64,"temperature":1.0,"top_p":1.0}',
        "task_index": 0,
        "task_id": "t0",
        "sample_index": 0,
        "reward": 1.0,
        "success": 1,
        "turns": 1,
        "generated_tokens": 7,
        "total_tokens": 30,
        "tool_calls": 0,
        "tool_errors": 0,
        "failed": 0,
        "error": None,
        "truncated": 0,
        "wall_s": 0.5,
        "trace_path": None,
        "chatgym_version": "0.1.0",
    }
    row.update(over)
    return row
