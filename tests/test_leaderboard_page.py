"""``chatgym leaderboard``: the console tables and the static HTML page, opened in real headless
Chromium (Debian ``chromium``; skipped where it is not installed). The page's numbers are compared with
values computed straight from the SQLite rows with SQL, its sorting JS is exercised through the URL
fragment, and a screenshot is saved."""

from __future__ import annotations

import asyncio
import html
import os
import sqlite3
from pathlib import Path

import pytest
from leaderboard_helpers import CHROMIUM, chromium, page_matches_sqlite, sql_expected, store_row

from chatgym.trainer.eval import leaderboard_cli
from chatgym.trainer.eval.config import EvalConfig
from chatgym.trainer.eval.leaderboard import build_leaderboard, metric_table
from chatgym.trainer.eval.page import render_html
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
    # Regression (fresh-user walk): an env id the store never saw was "holds no episodes (after filters)";
    # then exit status 1, where every other bad argument of the CLI is 2.
    assert leaderboard_cli.main(["--db", str(db), "--html", str(out), "--env", "Nope-v0", "--model", "toy"]) == 2
    assert capsys.readouterr().err == (f"chatgym leaderboard: --env: no episode in {db} has 'Nope-v0' (it holds "
                                       "CodeSandbox-v0, Math-v0)\n")
    assert leaderboard_cli.main(["--db", str(db), "--html", str(out), "--env", "Math-v0", "--model", "nobody"]) == 2
    assert capsys.readouterr().err == (f"chatgym leaderboard: --model: no episode in {db} has 'nobody' (it holds "
                                       "reference, toy)\n")
    # One unknown value among known ones is refused too (it was dropped without a word).
    assert leaderboard_cli.main(["--db", str(db), "--html", str(out), "--env", "Math-v0", "Nope-v0"]) == 2
    assert capsys.readouterr().err == (f"chatgym leaderboard: --env: no episode in {db} has 'Nope-v0' (it holds "
                                       "CodeSandbox-v0, Math-v0)\n")
    # Regression: bad arguments were SystemExit(str), status 1 (every other command's are 2).
    assert leaderboard_cli.main(["--db", str(tmp_path / "missing.sqlite")]) == 2
    assert capsys.readouterr().err == (
        f"chatgym leaderboard: --db: no results file at {tmp_path / 'missing.sqlite'} (run chatgym eval first)\n"
    )
    # Regression (second walk): --k 1000 titled the board "pass@1 (k=1000)", its cells pass@1.
    assert leaderboard_cli.main(["--db", str(db), "--k", "1000"]) == 0
    titles = [line.strip() for line in capsys.readouterr().out.splitlines() if "chatgym leaderboard:" in line]
    assert titles == ["chatgym leaderboard: mean reward [95% CI] / pass@1"]
    assert leaderboard_cli.main(["--db", str(db), "--k", "0"]) == 2
    assert capsys.readouterr().err == "chatgym leaderboard: --k must be >= 1, got 0\n"
    # Regression: a file that is not SQLite and an --html that is a directory were tracebacks.
    notdb = tmp_path / "notdb"
    notdb.write_text("hello, not a database\n" * 100)
    assert leaderboard_cli.main(["--db", str(notdb)]) == 2
    assert capsys.readouterr().err == (
        f"chatgym leaderboard: --db: {notdb} is not a usable results file: file is not a database\n"
    )
    assert leaderboard_cli.main(["--db", str(db), "--html", str(tmp_path)]) == 2
    assert capsys.readouterr().err == (
        f"chatgym leaderboard: --html: {tmp_path} is a directory (name the page's file)\n"
    )
    # Regression (fresh-user walk): --html "" wrote the default page and "new/dir/" a file named "dir";
    # a directory as --db read as a missing file.
    for page in ("", " ", str(tmp_path / "new" / "dir") + "/"):
        assert leaderboard_cli.main(["--db", str(db), "--html", page]) == 2
        assert capsys.readouterr().err == (
            f"chatgym leaderboard: --html: {page!r} names no file (give the page's file, e.g. results/leaderboard.html)\n"
        )
    assert not (tmp_path / "new").exists()
    assert leaderboard_cli.main(["--db", str(tmp_path)]) == 2
    assert capsys.readouterr().err == (
        f"chatgym leaderboard: --db: {tmp_path} is a directory (name the results file, e.g. runs/eval/results.sqlite)\n"
    )
    # Regression (fresh-user walk): a page under a file printed every table, then this as an OSError.
    afile = tmp_path / "afile"
    afile.write_text("")
    assert leaderboard_cli.main(["--db", str(db), "--html", str(afile / "x.html")]) == 2
    out, err = capsys.readouterr()
    assert (out, err) == ("", f"chatgym leaderboard: --html: cannot create {afile / 'x.html'} (in {afile}: not a directory)\n")


def test_leaderboard_of_an_empty_store_exits_1(tmp_path, capsys):
    # An empty store is not a usage error (status 1, not 2): nothing to rank yet.
    path = tmp_path / "empty.sqlite"
    with ResultsStore(path):
        pass
    assert leaderboard_cli.main(["--db", str(path), "--html", str(tmp_path / "page.html")]) == 1
    assert capsys.readouterr().err == f"chatgym leaderboard: {path} holds no episodes\n"


def test_grids_differing_only_in_n_count_each_sample_once(tmp_path):
    # Regression: -n 2 and -n 4 runs (two run keys, one leaderboard row) both hold samples 0 and 1
    # of each task — the same episodes — and the cell counted them twice (12 episodes, n=6).
    # Task 0 passes at samples 0, 1; task 1 only at sample 3.
    with ResultsStore(tmp_path / "r.sqlite") as store:
        for key, n in (("n2", 2), ("n4", 4)):
            for t in range(2):
                for s in range(n):
                    ok = int(s < 2 if t == 0 else s == 3)
                    row = store_row(run_key=key, task_index=t, sample_index=s, success=ok, reward=float(ok))
                    store.add_episode(row)
        board = build_leaderboard(store)
    [cell] = board.cells.values()
    m = cell.metrics
    assert (m.episodes, m.samples_per_task, board.k) == (8, 4, 4)
    assert m.pass_at_1 == pytest.approx((2 / 4 + 1 / 4) / 2)  # 5/12 when counted twice
    assert m.pass_at_k == pytest.approx(1.0)


def test_sample_traces_found_from_another_directory(tmp_path, monkeypatch):
    # Regression: trace_path was stored relative to the eval's working directory, so the page said
    # "(trace not found)" unless the leaderboard ran from there.
    run_dir, elsewhere = tmp_path / "run", tmp_path / "elsewhere"
    run_dir.mkdir(), elsewhere.mkdir()
    monkeypatch.chdir(run_dir)
    config = EvalConfig(engine="reference", envs=("Math-v0",), max_tasks=1, db="out/r.sqlite")
    asyncio.run(evaluate(config, progress=False, log=lambda m: None))
    monkeypatch.chdir(elsewhere)
    db = run_dir / "out" / "r.sqlite"
    with ResultsStore(db) as store:
        [row] = store.episodes()
        assert row["trace_path"] == str(run_dir.resolve() / "out" / "traces" / Path(row["trace_path"]).name)
        [cell] = build_leaderboard(store).cells.values()
        assert cell.samples[0]["messages"][0]["role"] == "system"
    # A store written before: the relative path as the eval's directory saw it; found next to --db.
    conn = sqlite3.connect(db)
    relative = os.path.join("out", "traces", Path(row["trace_path"]).name)
    conn.execute("UPDATE episodes SET trace_path = ?", (relative,))
    conn.commit(), conn.close()
    with ResultsStore(db) as store:
        board = build_leaderboard(store)
    [cell] = board.cells.values()
    assert cell.samples[0]["messages"][0]["role"] == "system"
    assert "(trace not found)" not in render_html(board)


def test_task_id_is_escaped_once(tmp_path):
    # Regression: the sample's title escaped task_id, then the <summary> escaped it again.
    with ResultsStore(tmp_path / "r.sqlite") as store:
        store.add_episode(store_row(task_id="t&<b>0</b>"))
        page = render_html(build_leaderboard(store))
    assert f"({html.escape('t&<b>0</b>')})" in page
    assert "t&amp;&lt;b&gt;0&lt;/b&gt;" in page and "&amp;amp;" not in page and "&amp;lt;" not in page


def test_pass_at_k_header_true_for_every_row(tmp_path, capsys):
    # Regression: the header came from the first row (pass@4) while the -n 1 reference row showed
    # its pass@1 under it.
    with ResultsStore(tmp_path / "r.sqlite") as store:
        for s in range(4):
            ok = int(s == 0)
            store.add_episode(store_row(run_key="m", sample_index=s, success=ok, reward=float(ok)))
        store.add_episode(store_row(run_key="ref", model_name="reference", model_hash="h0", sampling="{}"))
        board = build_leaderboard(store)
        page = render_html(board)
    [column] = board.columns
    present = [board.cell(r, column).metrics for r in board.rows]
    headers, texts = metric_table(present)
    assert headers[1] == "pass@k"
    assert [board.row_labels[r] for r in board.rows] == ["m", "reference"]
    assert [row[1] for row in texts] == ["1.000 (k=4)", "1.000 (k=1)"]
    assert [row[0] for row in texts] == ["0.250", "1.000"]
    assert "<th>pass@k</th>" in page and "<th>pass@4</th>" not in page
    assert '<td class="num">1.000 (k=1)</td>' in page
    # One k for every row: the header names it, the values stay bare.
    headers, texts = metric_table(present[:1])
    assert (headers[1], texts[0][1]) == ("pass@4", "1.000")


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


def test_row_labels_are_unique_across_engines_and_unshown_sampling_settings():
    """Regression (fresh-user walk): an hf and a vLLM run of one model with the same settings were
    both labelled "smollm2 (T=1.0 max_tokens=32)"; settings the short form leaves out (top_k) too."""
    import hashlib

    from chatgym.trainer.eval.leaderboard import _row_labels

    same = '{"max_tokens":32,"temperature":1.0,"top_p":1.0}'
    top_k = '{"max_tokens":32,"temperature":1.0,"top_k":5,"top_p":1.0}'
    assert _row_labels([("m", "h1", "vllm", same), ("m", "h1", "hf", same), ("reference", "", "reference", "{}")]) == {
        ("m", "h1", "vllm", same): "m [vllm]",
        ("m", "h1", "hf", same): "m [hf]",
        ("reference", "", "reference", "{}"): "reference",
    }
    rows = [("m", "h1", "vllm", same), ("m", "h1", "hf", same), ("m", "h1", "vllm", top_k)]
    short = {s: hashlib.sha256(s.encode()).hexdigest()[:6] for s in (same, top_k)}
    assert _row_labels(rows) == {
        rows[0]: f"m [vllm] (T=1.0 max_tokens=32) {{{short[same]}}}",
        rows[1]: "m [hf] (T=1.0 max_tokens=32)",
        rows[2]: f"m [vllm] (T=1.0 max_tokens=32) {{{short[top_k]}}}",
    }


def test_a_k_above_a_cells_samples_is_capped_there_with_a_note_naming_it(tmp_path, capsys):
    # Regression: `--k 5` over cells of 4 and 1 samples per task printed pass@4 / pass@1 without a
    # word (the page's footer alone said "capped"). The unbiased estimator takes k <= n, so the cell is
    # still computed at its samples, as with the default k, and a note on stderr names it.
    db = tmp_path / "r.sqlite"
    with ResultsStore(db) as store:
        for model, engine, n in (("m", "vllm", 4), ("reference", "reference", 1)):
            for t in range(2):
                for s in range(n):
                    store.add_episode(store_row(run_key=model, model_name=model, engine=engine, task_index=t,
                                                task_id=f"t{t}", sample_index=s, success=int(s == 0)))
    page = str(tmp_path / "page.html")
    expected = {
        "5": "2 cells (pass@k takes k <= samples): m on Math-v0@d/test at k=4; reference on Math-v0@d/test at k=1",
        "4": "1 cell (pass@k takes k <= samples): reference on Math-v0@d/test at k=1",
    }
    for k, cells in expected.items():
        assert leaderboard_cli.main(["--db", str(db), "--html", page, "--k", k]) == 0
        out, err = capsys.readouterr()
        assert err == f"chatgym leaderboard: note: --k {k} is capped at the samples per task of {cells}\n"
        assert "(k=1)" in out  # the table names each row's own k too
    # --k 1 caps nothing; without --k the default k is the most samples of any cell (documented, and the
    # table names each row's k): no note.
    for args in (["--k", "1"], []):
        assert leaderboard_cli.main(["--db", str(db), "--html", page, *args]) == 0
        assert capsys.readouterr().err == ""
