"""Graders: turn a model's answer into a reward by running hidden tests in a sandbox."""

from .code import GradeResult, grade_function

__all__ = ["GradeResult", "grade_function"]
