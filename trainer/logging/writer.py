"""Run outputs a user watches: metrics as JSONL (+ TensorBoard, + wandb when installed and asked
for) and a learning-curve PNG redrawn during the run (by a child process: :mod:`.curves`)."""

from __future__ import annotations

import json
import math
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from chatgym.trainer.config.loader import ConfigError
from chatgym.trainer.logging.curves import draw, read_history


class MetricsLogger:
    """Appends one JSON object per step to ``metrics.jsonl`` and mirrors scalars to TensorBoard/wandb.

    Args:
        output_dir: the run's directory.
        tensorboard: write event files under ``output_dir/tensorboard`` (needs the ``tensorboard``
            package; skipped with a warning when missing).
        wandb: log to Weights & Biases when the package is installed (skipped otherwise).
        wandb_project, run_config: passed to ``wandb.init``.
        resume_step: drop lines of steps >= this from an existing ``metrics.jsonl`` (a resumed run
            rewrites them).
        plot_interval_s: seconds between the starts of two background redraws (:meth:`plot_later`);
            calls in between draw nothing (the next redraw, or :meth:`plot`, shows their steps).

    Raises:
        ConfigError: an existing ``metrics.jsonl`` has a damaged line before its last (file and line
            named).
    """

    def __init__(
        self,
        output_dir: str | Path,
        *,
        tensorboard: bool = True,
        wandb: bool = False,
        wandb_project: str = "chatgym",
        run_config: Mapping[str, Any] | None = None,
        resume_step: int | None = None,
        plot_interval_s: float = 30.0,
    ):
        self.dir = Path(output_dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.path = self.dir / "metrics.jsonl"
        self.history: list[dict[str, Any]] = []
        if self.path.is_file():
            # A run stopped while writing a row leaves half a line: it is dropped (read_history).
            try:
                rows = read_history(self.path)
            except ValueError as exc:  # a damaged line inside the file: say which, in one line
                raise ConfigError(f"train.output_dir: {exc}; move the file away to start its log afresh") from exc
            for row in rows:
                if resume_step is None or row.get("step", 0) < resume_step:
                    self.history.append(row)
            self.path.write_text("".join(json.dumps(r) + "\n" for r in self.history))
        self.warnings: list[str] = []
        # Background redraws (plot_later): a redraw takes 0.5-1 s, which a training step should not
        # wait for, in a child process (a thread would hold the GIL the engine's decode thread needs).
        # One waiting thread; requests made while a redraw runs collapse into one more redraw. A child
        # still costs a process start and ~1 s of CPU per redraw: one per plot_interval_s is enough
        # for a curve a person watches, not one per step (GPU steps take ~1 s).
        self._draw_lock = threading.Lock()
        self._draw_wanted = threading.Condition()
        self._draw_pending = False
        self._drawer: threading.Thread | None = None
        self.plot_interval_s = float(plot_interval_s)
        self._last_redraw = -math.inf  # time.monotonic() when the last background redraw was asked for
        self.redraws_requested = 0
        self.draw_errors: list[str] = []
        self._tb = None
        if tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter

                self._tb = SummaryWriter(str(self.dir / "tensorboard"))
            except ImportError:
                self.warnings.append(
                    "tensorboard is not installed: pip install tensorboard (metrics stay in JSONL)"
                )
        self._wandb = None
        if wandb:
            try:
                import wandb as _wandb

                self._wandb = _wandb
                _wandb.init(project=wandb_project, config=dict(run_config or {}), dir=str(self.dir))
            except ImportError:
                self.warnings.append("wandb is not installed: pip install wandb (metrics stay in JSONL)")

    def log(self, step: int, metrics: Mapping[str, Any]) -> None:
        """Record ``metrics`` (flat ``name -> number``) of ``step``; non-finite numbers become null."""
        row: dict[str, Any] = {"step": step}
        for key, value in metrics.items():
            if isinstance(value, float) and not math.isfinite(value):
                value = None
            row[key] = value
        self.history.append(row)
        with self.path.open("a") as fh:
            fh.write(json.dumps(row) + "\n")
        scalars = {
            k: v
            for k, v in row.items()
            if isinstance(v, (int, float)) and not isinstance(v, bool) and k != "step"
        }
        if self._tb is not None:
            for key, value in scalars.items():
                self._tb.add_scalar(key, value, step)
            self._tb.flush()
        if self._wandb is not None:
            self._wandb.log(scalars, step=step)

    def logged(self, step: int) -> dict[str, Any] | None:
        """The metrics last logged at ``step`` (this run's or, resumed, the earlier run's rows kept
        from ``metrics.jsonl``), without ``step``; None when no row has that step."""
        rows = [r for r in self.history if r.get("step") == step]
        return {k: v for k, v in rows[-1].items() if k != "step"} if rows else None

    def plot(self, path: str | Path | None = None) -> Path:
        """Draw the learning curves of :data:`.curves.CURVE_KEYS` that have data into a PNG; returns its path.

        Waits for a redraw :meth:`plot_later` started, so the file it leaves has every logged step.
        """
        self.wait_plotted()
        with self._draw_lock:
            return self._draw(list(self.history), path)

    def plot_later(self) -> Path:
        """Redraw ``learning_curve.png`` from ``metrics.jsonl`` in a child process (``python
        curves.py``); returns its path at once.

        A failed redraw is kept in ``draw_errors`` (the last line the child wrote to stderr; the run
        goes on); :meth:`plot` and :meth:`close` wait for the redraw. Within ``plot_interval_s`` of
        the last redraw asked for, it draws nothing.
        """
        now = time.monotonic()
        if now - self._last_redraw < self.plot_interval_s:
            return self.dir / "learning_curve.png"
        self._last_redraw = now
        self.redraws_requested += 1
        with self._draw_wanted:
            self._draw_pending = True
            if self._drawer is None or not self._drawer.is_alive():
                self._drawer = threading.Thread(target=self._drawing, name="chatgym-plot", daemon=True)
                self._drawer.start()
            self._draw_wanted.notify_all()
        return self.dir / "learning_curve.png"

    def wait_plotted(self) -> None:
        """Block until no background redraw is pending or running."""
        with self._draw_wanted:
            self._draw_wanted.wait_for(lambda: not self._draw_pending and self._drawer is None)

    def _drawing(self) -> None:
        while True:
            with self._draw_wanted:
                if not self._draw_pending:
                    self._drawer = None
                    self._draw_wanted.notify_all()
                    return
                self._draw_pending = False
            try:
                with self._draw_lock:
                    self._draw_in_child()
            except Exception as exc:  # a redraw must never stop training
                self.draw_errors.append(repr(exc))

    def _draw_in_child(self) -> None:
        from chatgym.trainer.logging import curves

        out = self.dir / "learning_curve.png"
        # Its own session: a Ctrl-C at the terminal interrupts training, not a redraw half-way.
        done = subprocess.run(
            [sys.executable, curves.__file__, str(self.path), str(out)],
            capture_output=True,
            text=True,
            start_new_session=True,
        )
        if done.returncode != 0:
            lines = done.stderr.strip().splitlines()
            self.draw_errors.append(lines[-1] if lines else f"curves.py exited with {done.returncode}")

    def _draw(self, history: list[dict[str, Any]], path: str | Path | None) -> Path:
        return draw(history, path if path is not None else self.dir / "learning_curve.png")

    def close(self) -> None:
        self.wait_plotted()
        if self._tb is not None:
            self._tb.close()
        if self._wandb is not None:
            self._wandb.finish()
