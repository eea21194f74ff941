"""BFCL (Berkeley Function-Calling Leaderboard) support for ToolUse-v0.

Data come from the ``bfcl-eval`` package (``pip install --no-deps bfcl-eval==2026.3.23``): the
entries of ``bfcl_eval/data/BFCL_v4_*.json``, their ``possible_answer/`` and, for the multi-turn
categories, the executable Python backends in ``eval_checker/multi_turn_eval/func_source_code/``.
The checker is ours (:mod:`.checker`) and nothing of BFCL's evaluation code is imported at run
time, but it follows BFCL's AST checker rule for rule: ``scripts/bfcl_fidelity.py`` and
``tests/test_bfcl_fidelity.py`` score ground truths and systematic mutations of every single-turn
entry with BFCL's own functions and with ToolUse-v0 and require the same verdict.

Modules: :mod:`.data` (loading, BFCL function docs -> OpenAI tool schemas), :mod:`.checker` (BFCL's
AST call-matching rules), :mod:`.multi_turn` (backends, ground-truth execution, state comparison).
"""

from chatgym.envs.tool_use.bfcl.checker import CheckResult, check_calls, normalise_string
from chatgym.envs.tool_use.bfcl.data import CATEGORIES, load_category, to_openai_tool

__all__ = ["CATEGORIES", "CheckResult", "check_calls", "load_category", "normalise_string", "to_openai_tool"]
