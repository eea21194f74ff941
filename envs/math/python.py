"""MathPython-v0: Math-v0's tasks with a ``python`` tool backed by a stateful sandbox session.

The ReTool setting (Feng et al. 2025, "ReTool: Reinforcement Learning for Strategic Tool Use in
LLMs", arXiv:2504.11536): the policy may run Python in a code interpreter, over as many turns as it
likes within ``max_turns``, before it answers; only the final answer is rewarded. The interpreter is
one :meth:`Sandbox.open_session` per episode, opened at the first call and closed with the episode,
so variables defined in one call are there in the next (``x = 41 * 265`` then ``print(x + 1)``).

* ``python(code)`` runs ``code`` in the session and returns ``status: ok|error|timeout|...``, then
  stdout and stderr, each cut to ``max_output_chars`` (the layout of CodeSandbox-v0's ``run_python``,
  :func:`chatgym.envs.code.env.format_run`). As in a REPL, the value of a last bare expression
  is printed. A non-``ok`` status is a tool error (``info["tool_errors"]``) and counts in
  ``python_errors``; a timeout kills the interpreter, and the next call gets a fresh one (with a note).
* The answer is scored exactly as Math-v0 scores it (:meth:`MathEnv.score`).
* ``call_bonus`` (default 0): a format reward added to the final answer's reward when the episode ran
  at least one ``python`` call whose status was ``ok`` — a shaping term for small models that never
  call the tool on their own (ReTool starts from a model fine-tuned on tool-use traces instead).
  ``info["success"]`` stays the answer's correctness alone, so held-out accuracy never includes it.
* ``demo`` (default False): the opening messages hold one worked episode before the task (user
  ``Calculate 17 * 23.``, an assistant ``python`` call ``print(17 * 23)``, its tool result, the answer
  ``<answer>391</answer>``) — a one-shot demonstration, in the prompt (loss mask 0), for models that do
  not call a tool from its description alone.

The final step's ``info`` holds ``python_calls`` (calls made this episode), ``python_ok`` (of which
status ``ok``) and ``python_errors`` (the others), and ``reward_components["call_bonus"]``.
"""

from __future__ import annotations

from typing import Any

from chatgym.envs import messages as M
from chatgym.envs.code.env import default_sandbox, format_run
from chatgym.envs.core import AssistantTurn, StepOutcome, load_prompt
from chatgym.envs.math.env import MathEnv
from chatgym.envs.tools import Tool, ToolResult
from chatgym.sandboxes.base import Sandbox, Session

__all__ = ["MathPythonEnv"]


class MathPythonEnv(MathEnv):
    """MathPython-v0 (see the module docstring).

    Args:
        sandbox: a :class:`chatgym.sandboxes.base.Sandbox` with ``open_session``, or None for the
            process-wide default ``LocalSandbox``. The env never closes a sandbox, only its sessions.
        run_timeout_s: wall-clock seconds allowed for one ``python`` call (> 0).
        memory_mb: memory cap of the session's interpreter, in MiB (int >= 16).
        max_output_chars: the observation shows at most this many characters of stdout and of stderr.
        call_bonus: reward added to the final answer's when a ``python`` call ran ok (>= 0).
        max_turns: assistant turns before truncation (default 4: up to 3 calls, then the answer).
        demo: open with the one-shot worked episode (see the module docstring).
        kwargs: :class:`MathEnv`'s (``dataset``, ``dataset_config``, ``split``, ``size``, ``seed``,
            ``parser``, ...); ``calculator`` is refused (one tool, one way to compute).

    Raises:
        ValueError: a bad ``run_timeout_s``, ``memory_mb``, ``max_output_chars`` or ``call_bonus``,
            or ``calculator=True``; MathEnv's errors.
    """

    def __init__(
        self,
        *,
        sandbox: Sandbox | None = None,
        run_timeout_s: float = 5.0,
        memory_mb: int = 512,
        max_output_chars: int = 1000,
        call_bonus: float = 0.0,
        max_turns: int = 4,
        demo: bool = False,
        **kwargs: Any,
    ):
        if kwargs.pop("calculator", False):
            raise ValueError("MathPython-v0: calculator=True is not supported (the python tool computes)")
        if not run_timeout_s > 0:
            raise ValueError(f"MathPython-v0: run_timeout_s must be > 0, got {run_timeout_s!r}")
        if not isinstance(memory_mb, int) or isinstance(memory_mb, bool) or memory_mb < 16:
            raise ValueError(f"MathPython-v0: memory_mb must be an int >= 16 (MiB), got {memory_mb!r}")
        if not isinstance(max_output_chars, int) or max_output_chars < 1:
            raise ValueError(f"MathPython-v0: max_output_chars must be an int >= 1, got {max_output_chars!r}")
        if not call_bonus >= 0:
            raise ValueError(f"MathPython-v0: call_bonus must be >= 0, got {call_bonus!r}")
        kwargs.setdefault("tool_timeout_s", run_timeout_s + 30.0)  # the sandbox's own timeout ends first
        super().__init__(max_turns=max_turns, **kwargs)
        self.tool_map = {
            "python": Tool(
                name="python",
                description="Run Python code in a persistent interpreter (variables are kept between "
                "calls) and return its status, stdout and stderr. Print what you need to see.",
                parameters={
                    "type": "object",
                    "properties": {"code": {"type": "string", "description": "Python source to run"}},
                    "required": ["code"],
                    "additionalProperties": False,
                },
                fn=self._python,
            ),
            **self.tool_map,  # tools from a ``tools_config``, if any
        }
        self._sandbox = sandbox
        self.run_timeout_s = run_timeout_s
        self.memory_mb = memory_mb
        self.max_output_chars = max_output_chars
        self.call_bonus = float(call_bonus)
        self.demo = bool(demo)
        self.system_prompt = load_prompt(__package__, "math_system_python.txt")
        self._session: Session | None = None
        self.python_calls = 0
        self.python_ok = 0

    @property
    def sandbox(self) -> Sandbox:
        if self._sandbox is None:
            self._sandbox = default_sandbox()
        return self._sandbox

    def initial_messages(self, task: dict[str, Any]) -> list[M.Message]:
        opening = super().initial_messages(task)
        if not self.demo:
            return opening
        call = M.make_tool_call("python", {"code": "print(17 * 23)"}, "call_demo")
        shot = [
            M.user("Calculate 17 * 23."),
            M.assistant("", [call]),
            M.tool("status: ok (exit code 0)\nstdout:\n391", "call_demo", "python"),
            M.assistant("<answer>391</answer>"),
        ]
        return [opening[0], *shot, *opening[1:]]

    async def on_reset(self, task: dict[str, Any]) -> None:
        await super().on_reset(task)
        await self._close_session()  # a reused env starts each episode with a fresh interpreter
        self.python_calls = 0
        self.python_ok = 0

    async def _python(self, code: str) -> ToolResult:
        # Opened at the first call, not at reset: most episodes of an untrained policy never call.
        if self._session is None:
            self._session = await self.sandbox.open_session(memory_mb=self.memory_mb)
        self.python_calls += 1
        res = await self._session.run(code, timeout_s=self.run_timeout_s)
        self.python_ok += res.status == "ok"
        text = format_run(res, self.max_output_chars, self.run_timeout_s)
        return ToolResult(content=text, is_error=res.status != "ok", info={"python_status": res.status})

    async def score(self, turn: AssistantTurn) -> StepOutcome:
        out = await super().score(turn)
        bonus = self.call_bonus if self.python_ok else 0.0
        out.reward += bonus
        out.info["reward_components"]["call_bonus"] = bonus
        out.info.update(
            python_calls=self.python_calls,
            python_ok=self.python_ok,
            python_errors=self.python_calls - self.python_ok,
        )
        return out

    async def _close_session(self) -> None:
        session, self._session = self._session, None
        if session is not None:
            await session.close()

    async def aclose(self) -> None:
        await self._close_session()
        await super().aclose()
