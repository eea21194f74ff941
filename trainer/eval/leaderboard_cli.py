"""``chatgym leaderboard``: the models x envs leaderboard of a results store, printed and written as
a static HTML page.

chatgym leaderboard --db results/eval.sqlite --html results/leaderboard.html
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from chatgym.trainer.eval.cli import DEFAULT_DB


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="chatgym leaderboard",
        description="Print the models x envs leaderboard of a results store and write it as a static HTML page.",
    )
    p.add_argument("--db", default=DEFAULT_DB, help=f"SQLite results file (default {DEFAULT_DB})")
    p.add_argument("--html", help="write the page here (default: leaderboard.html next to --db)")
    p.add_argument("--k", type=int, help="pass@k budget (default: the most samples per task of any cell)")
    p.add_argument("--env", nargs="*", default=[], help="only these env ids")
    p.add_argument("--model", nargs="*", default=[], help="only these model names")
    p.add_argument("--title", default="chatgym leaderboard")
    return p


def _unknown_filters(store: Any, args: argparse.Namespace) -> str | None:
    """The ``--env`` / ``--model`` values the store has never seen (a typo, not an empty store), each
    named with the values it does hold; ``None`` when every value is known."""
    unknown = []
    for flag, column, values in (("--env", "env_id", args.env), ("--model", "model_name", args.model)):
        held = store.distinct(column)
        unknown += [f"{flag}: no episode in {args.db} has {v!r} (it holds {', '.join(sorted(held))})"
                    for v in values if v not in held]
    return "; ".join(unknown) or None


def _capped_note(board: Any, k: int) -> str | None:
    """The note for a ``--k`` above some cells' samples per task, whose pass@k is computed at those
    samples (the unbiased estimator takes k <= n): each such cell, as ``row on column at k=N``, in the
    board's order; None when no cell was capped."""
    capped = [
        f"{board.row_labels[r]} on {board.column_labels[c]} at k={cell.metrics.k}"
        for r in board.rows
        for c in board.columns
        if (cell := board.cell(r, c)) is not None and cell.metrics.k < k
    ]
    if not capped:
        return None
    cells = f"{len(capped)} cell{'s' if len(capped) > 1 else ''}"
    return f"note: --k {k} is capped at the samples per task of {cells} (pass@k takes k <= samples): {'; '.join(capped)}"


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``chatgym leaderboard``; 1 when the store holds no episodes (after the filters),
    2 a bad argument (one line naming the flag, as every chatgym command: a ``--db`` that is not a
    results store, an ``--env`` / ``--model`` value it has never seen, an ``--html`` that is a
    directory or cannot be written). A ``--k`` above a cell's samples per task is capped there, as
    the default k is, and said in one note line on stderr naming each capped cell and its k."""
    from chatgym.trainer.config.loader import check_writable
    from chatgym.trainer.eval.leaderboard import build_leaderboard, rich_tables
    from chatgym.trainer.eval.page import render_html
    from chatgym.trainer.eval.store import checked_store

    args = build_parser().parse_args(argv)
    out = Path(args.html) if args.html is not None else Path(args.db).expanduser().parent / "leaderboard.html"
    refusal = store = None
    if args.html is not None and (not args.html.strip() or args.html.endswith(("/", os.sep))):
        # "" wrote the default page; "new/dir/" a file named "dir": neither names a page's file
        refusal = f"--html: {args.html!r} names no file (give the page's file, e.g. results/leaderboard.html)"
    elif Path(args.db).expanduser().is_dir():
        refusal = f"--db: {args.db} is a directory (name the results file, e.g. {DEFAULT_DB})"
    elif not Path(args.db).expanduser().is_file():
        refusal = f"--db: no results file at {args.db} (run chatgym eval first)"
    elif args.k is not None and args.k < 1:
        refusal = f"--k must be >= 1, got {args.k}"
    elif out.is_dir():
        refusal = f"--html: {out} is a directory (name the page's file)"
    else:
        try:  # before the tables print: a page that cannot be written is one line, up front
            check_writable(out.parent, "--html", args.html or out)
            store = checked_store(args.db, "--db")  # not a SQLite file: one line, not a traceback
        except ValueError as exc:  # ConfigError is one
            refusal = str(exc)
    if refusal is not None or store is None:
        print(f"chatgym leaderboard: {refusal}", file=sys.stderr)
        return 2
    with store:
        refusal = _unknown_filters(store, args)
        board = None if refusal else build_leaderboard(store, k=args.k, env_ids=args.env, models=args.model)
    if board is None:
        print(f"chatgym leaderboard: {refusal}", file=sys.stderr)
        return 2
    if not board.cells:
        filtered = " (after filters)" if args.env or args.model else ""
        print(f"chatgym leaderboard: {args.db} holds no episodes{filtered}", file=sys.stderr)
        return 1
    from rich.console import Console

    console = Console(width=200)
    for table in rich_tables(board):
        console.print(table)
    if args.k is not None and (note := _capped_note(board, args.k)) is not None:
        print(f"chatgym leaderboard: {note}", file=sys.stderr)
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(render_html(board, title=args.title, source=str(args.db)), encoding="utf-8")
    except OSError as exc:
        print(f"chatgym leaderboard: --html: cannot write {out}: {exc}", file=sys.stderr)
        return 2
    print(f"wrote {out}")
    return 0
