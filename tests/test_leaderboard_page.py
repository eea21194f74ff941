"""``chatgym leaderboard``: the console tables and the static HTML page, opened in real headless
Chromium (Debian ``chromium``; skipped where it is not installed). The page's numbers are compared with
values computed straight from the SQLite rows with SQL, its sorting JS is exercised through the URL
fragment, and a screenshot is saved."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from leaderboard_helpers import CHROMIUM, chromium, page_matches_sqlite, sql_expected

from chatgym.trainer.eval import leaderboard_cli
from chatgym.trainer.eval.config import EvalConfig
from chatgym.trainer.eval.run import evaluate
from chatgym.trainer.eval.store import ResultsStore


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
    assert leaderboard_cli.main(["--db", str(db), "--html", str(out)]) == 0
    text = capsys.readouterr().out
    assert "chatgym leaderboard" in text and "toy" in text and "reference" in text
    assert "0.300" in text and f"wrote {out}" in text
    page = out.read_text()
    # Self-contained: no external resource of any kind.
    for needle in ("http://", "https://", "<link", "src="):
        assert needle not in page
    assert leaderboard_cli.main(["--db", str(db), "--html", str(out), "--env", "Nope-v0"]) == 1
    capsys.readouterr()
    # Regression: bad arguments were SystemExit(str), status 1 (every other command's are 2).
    assert leaderboard_cli.main(["--db", str(tmp_path / "missing.sqlite")]) == 2
    assert capsys.readouterr().err == (
        f"chatgym leaderboard: --db: no results file at {tmp_path / 'missing.sqlite'} (run chatgym eval first)\n"
    )
    assert leaderboard_cli.main(["--db", str(db), "--k", "0"]) == 2
    assert capsys.readouterr().err == "chatgym leaderboard: --k must be >= 1, got 0\n"


@pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (apt-get install chromium)")
def test_page_in_headless_chromium_matches_sqlite(db, tmp_path):
    page = tmp_path / "leaderboard.html"
    assert leaderboard_cli.main(["--db", str(db), "--html", str(page)]) == 0
    # The fragment asks the page's JS to sort by the first env column, descending, on load.
    parsed = page_matches_sqlite(db, page, tmp_path, "#sort=1-desc")
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
    res = chromium([f"--screenshot={shot}", "--window-size=1400,1600", page.as_uri()], tmp_path)
    assert res.returncode == 0, res.stderr[-2000:]
    data = shot.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 20_000
    print(f"screenshot: {shot}")
