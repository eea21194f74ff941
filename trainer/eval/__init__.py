"""Evaluation: ``chatgym eval`` (run a model or the reference policy on envs, resumable), the SQLite
results store, metrics (pass@k, mean reward with CI, ...) and ``chatgym leaderboard`` (rich table and
a static HTML page)."""

from chatgym.trainer.eval.scores import CellMetrics, cell_metrics, mean_ci, pass_at_k
from chatgym.trainer.eval.store import SCHEMA_VERSION, ResultsStore

__all__ = ["SCHEMA_VERSION", "CellMetrics", "ResultsStore", "cell_metrics", "mean_ci", "pass_at_k"]
