"""The learning curve is redrawn off the training step (plot_later) and still ends complete."""

from __future__ import annotations

import shutil

from chatgym.trainer.metrics import MetricsLogger


def png_size(path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    return int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")


def test_plot_later_draws_in_the_background_and_close_waits(tmp_path):
    logger = MetricsLogger(tmp_path, tensorboard=False)
    for step in range(1, 4):
        logger.log(step, {"reward/mean": 0.1 * step, "timing/step_s": 1.0})
        path = logger.plot_later()
    assert path == tmp_path / "learning_curve.png"
    logger.close()  # waits for the drawing thread
    assert logger._drawer is None and not logger._draw_pending
    # Two panels (reward, seconds per step) -> one row of three 4.2 x 3.0 inch panels at 100 dpi.
    assert png_size(path) == (1260, 300)
    assert logger.draw_errors == []


def test_a_failed_background_redraw_is_recorded_not_raised(tmp_path):
    out = tmp_path / "run"
    logger = MetricsLogger(out, tensorboard=False)
    logger.log(1, {"reward/mean": 0.5})
    shutil.rmtree(out)  # the run directory vanished: savefig cannot write
    logger.plot_later()
    logger.wait_plotted()
    assert len(logger.draw_errors) == 1 and "FileNotFoundError" in logger.draw_errors[0]


def test_plot_waits_for_a_pending_redraw_and_includes_every_step(tmp_path):
    logger = MetricsLogger(tmp_path, tensorboard=False)
    logger.log(1, {"reward/mean": 0.1})
    logger.plot_later()
    for step in range(2, 8):
        logger.log(step, {"reward/mean": 0.1 * step, "eval/score": 0.2, "actor/entropy": 1.0, "actor/kl": 0.0})
    path = logger.plot()  # synchronous, after the background one
    # Four panels -> two rows of three: 1260 x 600 pixels.
    assert png_size(path) == (1260, 600)
    logger.close()
