"""BFCL (Berkeley Function-Calling Leaderboard) support for ToolUse-v0.

Data come from the ``bfcl-eval`` package (``pip install --no-deps bfcl-eval==2026.3.23``): the
entries of ``bfcl_eval/data/BFCL_v4_*.json``, their ``possible_answer/`` and, for the multi-turn
categories, the executable Python backends in ``eval_checker/multi_turn_eval/func_source_code/``.
The checker is ours (:mod:`.checker`); nothing of BFCL's own evaluation code is imported.

Modules: :mod:`.data` (loading, BFCL function docs -> OpenAI tool schemas), :mod:`.checker` (the
AST-style call matcher), :mod:`.multi_turn` (backends, ground-truth execution, state comparison).
"""

from .checker import CheckResult, check_calls, normalise_string
from .data import CATEGORIES, load_category, to_openai_tool

__all__ = ["CATEGORIES", "CheckResult", "check_calls", "load_category", "normalise_string", "to_openai_tool"]
