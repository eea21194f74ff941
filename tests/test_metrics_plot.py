"""The learning curve is redrawn off the training step (plot_later) and still ends complete."""

from __future__ import annotations

import shutil

from chatgym.trainer.logging.writer import MetricsLogger


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


def test_redraws_are_at_most_one_per_interval(tmp_path):
    throttled = MetricsLogger(tmp_path / "a", tensorboard=False, plot_interval_s=3600)
    eager = MetricsLogger(tmp_path / "b", tensorboard=False, plot_interval_s=0)
    for step in range(1, 4):
        for logger in (throttled, eager):
            logger.log(step, {"reward/mean": 0.1 * step})
            logger.plot_later()
            logger.wait_plotted()
    assert throttled.redraws_requested == 1 and eager.redraws_requested == 3
    for logger in (throttled, eager):
        logger.close()
        assert logger.draw_errors == []


def test_the_background_redraw_runs_in_a_child_process(tmp_path, monkeypatch):
    """Regression: redrawn in a thread, the curve held the GIL the engine's decode thread
    needs; on an H200 the rollout took 1.33 s a step with it and 0.74-0.83 s without."""
    from chatgym.trainer.logging import curves
    from chatgym.trainer.logging import writer as metrics

    def broken(*args, **kwargs):
        raise AssertionError("drawn in the training process")

    monkeypatch.setattr(curves, "draw", broken)
    monkeypatch.setattr(metrics, "draw", broken)
    logger = MetricsLogger(tmp_path, tensorboard=False)
    logger.log(1, {"reward/mean": 0.5, "actor/kl": 0.0})
    path = logger.plot_later()
    logger.close()
    assert logger.draw_errors == [] and png_size(path) == (1260, 300)


def test_the_child_reads_whole_rows_only(tmp_path):
    from chatgym.trainer.logging.curves import read_history

    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1, "reward/mean": 0.5}\n{"step": 2, "rew')  # row 2 still being written
    assert read_history(path) == [{"step": 1, "reward/mean": 0.5}]


def test_a_half_written_last_row_is_dropped_on_resume(tmp_path):
    """Regression: a run stopped while writing a row could not be resumed (json.loads raised on the
    half line)."""
    (tmp_path / "metrics.jsonl").write_text('{"step": 1, "reward/mean": 0.1}\n{"step": 2, "reward/mean": 0.2}\n{"st')
    logger = MetricsLogger(tmp_path, tensorboard=False, resume_step=3)
    assert [r["step"] for r in logger.history] == [1, 2]
    assert (tmp_path / "metrics.jsonl").read_text() == '{"step": 1, "reward/mean": 0.1}\n{"step": 2, "reward/mean": 0.2}\n'
    logger.close()


def test_the_childs_errors_name_the_file_and_line(tmp_path, capsys):
    import pytest

    from chatgym.trainer.logging.curves import main, read_history

    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1}\n{"step": 2, "rew\n{"step": 3}\n')
    with pytest.raises(ValueError, match=r"metrics\.jsonl, line 2: not a JSON row \(Unterminated string"):
        read_history(path)
    missing = tmp_path / "nowhere.jsonl"
    assert main([str(missing), str(tmp_path / "c.png")]) == 1
    assert capsys.readouterr().err == f"FileNotFoundError: [Errno 2] No such file or directory: '{missing}'\n"
    assert main([]) == 2


def test_a_damaged_line_inside_the_log_is_one_config_error(tmp_path):
    # Regression: a resume over such a file ended in a ValueError traceback.
    import pytest

    from chatgym.trainer.config.loader import ConfigError

    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1}\n{"step": 2, "rew\n{"step": 3}\n')
    with pytest.raises(ConfigError) as err:
        MetricsLogger(tmp_path, tensorboard=False, resume_step=3)
    assert str(err.value) == (
        f"train.output_dir: {path}, line 2: not a JSON row (Unterminated string starting at); "
        "move the file away to start its log afresh"
    )
