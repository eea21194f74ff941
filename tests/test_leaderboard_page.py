"""``chatgym leaderboard``: the console tables and the static HTML page, opened in real headless
Chromium (Debian ``chromium``; skipped where it is not installed). The page's numbers are compared with
values computed straight from the SQLite rows with SQL, its sorting JS is exercised through the URL
fragment, and a screenshot is saved."""

from __future__ import annotations

import asyncio
import shutil
import sqlite3
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import pytest

from chatgym.trainer.eval.cli import leaderboard_main
from chatgym.trainer.eval.run import EvalConfig, evaluate
from chatgym.trainer.eval.store import ResultsStore

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


@pytest.fixture(scope="module")
def db(tmp_path_factory) -> Path:
    """Real reference-policy rows on Math-v0 and CodeSandbox-v0, plus a second model "toy" whose
    rows are the same episodes with rewards set by a fixed pattern (so the two rows differ)."""
    path = tmp_path_factory.mktemp("board") / "results.sqlite"
    for env, tasks in (("Math-v0", 5), ("CodeSandbox-v0", 3)):
        config = EvalConfig(engine="reference", envs=(env,), max_tasks=tasks, n_samples=2, db=str(path))
        asyncio.run(evaluate(config, progress=False, log=lambda m: None))
    with ResultsStore(path) as store:
        for row in store.episodes():
            t, s = row["task_index"], row["sample_index"]
            reward = 1.0 if (t + s) % 3 == 0 else (0.5 if row["env_id"] == "CodeSandbox-v0" else 0.0)
            toy = {k: v for k, v in row.items() if k != "id"}
            toy.update(
                run_key="toy-" + row["run_key"],
                model_name="toy",
                model_hash="0123456789abcdef",
                engine="hf",
                sampling='{"max_tokens":64,"temperature":1.0,"top_p":1.0}',
                reward=reward,
                success=int(reward >= 1.0),
                generated_tokens=10 * (t + 1),
            )
            assert store.add_episode(toy)
    return path


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


def test_expected_values_are_not_trivial(db):
    exp = sql_expected(db)
    # Toy on Math-v0, 5 tasks x 2 samples, reward 1 iff (t + s) % 3 == 0: t+s per task is (0, 1),
    # (1, 2), (2, 3), (3, 4), (4, 5) -> task means 1/2, 0, 1/2, 1/2, 0 -> 0.3.
    assert exp[("toy", "Math-v0")] == ("0.300", "0.300", 10)
    assert exp[("reference", "Math-v0")] == ("1.000", "1.000", 10)
    # Toy on CodeSandbox-v0, 3 tasks: rewards (1, .5), (.5, .5), (.5, 1) -> means .75, .5, .75; pass@1 1/2, 0, 1/2.
    assert exp[("toy", "CodeSandbox-v0")] == ("0.667", "0.333", 6)


def test_leaderboard_cli_prints_tables_and_writes_page(db, tmp_path, capsys):
    out = tmp_path / "page.html"
    assert leaderboard_main(["--db", str(db), "--html", str(out)]) == 0
    text = capsys.readouterr().out
    assert "chatgym leaderboard" in text and "toy" in text and "reference" in text
    assert "0.300" in text and f"wrote {out}" in text
    page = out.read_text()
    # Self-contained: no external resource of any kind.
    for needle in ("http://", "https://", "<link", "src="):
        assert needle not in page
    assert leaderboard_main(["--db", str(db), "--html", str(out), "--env", "Nope-v0"]) == 1
    with pytest.raises(SystemExit, match="no results file"):
        leaderboard_main(["--db", str(tmp_path / "missing.sqlite")])


class _Page(HTMLParser):
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


def _chromium(args: list[str], tmp_path: Path) -> subprocess.CompletedProcess:
    profile = tmp_path / "profile"
    profile.mkdir(exist_ok=True)
    return subprocess.run(
        [CHROMIUM, *FLAGS, f"--user-data-dir={profile}", *args], capture_output=True, text=True, timeout=120
    )


@pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (apt-get install chromium)")
def test_page_in_headless_chromium_matches_sqlite(db, tmp_path):
    page = tmp_path / "leaderboard.html"
    assert leaderboard_main(["--db", str(db), "--html", str(page)]) == 0
    # The fragment asks the page's JS to sort by the first env column, descending, on load.
    url = page.as_uri() + "#sort=1-desc"
    dom = _chromium(["--dump-dom", url], tmp_path)
    assert dom.returncode == 0, dom.stderr[-2000:]
    parsed = _Page()
    parsed.feed(dom.stdout)

    expected = sql_expected(db)
    seen = {(model, env.split("@")[0]) for model, env in parsed.cells}
    assert seen == set(expected)
    for (model, env_label), cell in parsed.cells.items():
        mean, p1, episodes = expected[(model, env_label.split("@")[0])]
        assert cell["mean"] == mean, (model, env_label)
        assert cell["p1"] == f"pass@1 {p1}", (model, env_label)
        row = parsed.metric_rows[(model, env_label)]
        # model, pass@1, pass@2, mean reward, CI, turns, tokens/ep, tool err, fail, wall, episodes, tasks x n
        assert (row[0], row[1], row[3], row[10]) == (model, p1, mean, str(episodes))
    # Column 1 is CodeSandbox-v0 (columns sort by env id): reference (1.000) before toy (0.667) after
    # the JS sort; the page itself lists toy first (the reference row goes last).
    assert parsed.row_order == ["reference", "toy"]
    assert parsed.sorted_headers == ["desc"]
    assert page.read_text().index('data-testid="model">toy') < page.read_text().index(
        'data-testid="model">reference'
    )
    # Every sample-trace link points at an embedded trace.
    assert parsed.links and all(link in parsed.ids for link in parsed.links)

    shot = tmp_path / "leaderboard.png"
    res = _chromium([f"--screenshot={shot}", "--window-size=1400,1600", page.as_uri()], tmp_path)
    assert res.returncode == 0, res.stderr[-2000:]
    data = shot.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 20_000
    print(f"screenshot: {shot}")
