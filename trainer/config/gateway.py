"""The ``trainer.gateway`` section: train an agent program that talks to an OpenAI-compatible API.

    trainer:
      rollout_source: gateway                       # collector (default): the env runs the episodes
      gateway:
        agent: examples/gateway_agent/agent.py:run  # or a module: my_pkg.agent:run
        reward: env                                 # program: what the program reports
        concurrency: 16

Split from :mod:`chatgym.trainer.config.runner` to keep that module small; ``RunnerConfig.gateway``
holds it. What the source does with it: :mod:`chatgym.trainer.gateway.source` and docs/gateway.md.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

# ``pkg.module:function`` or ``path/to/file.py:function`` (a file path may hold any character but ':').
_CALLABLE = re.compile(r"^(?:[A-Za-z_][\w]*(?:\.[A-Za-z_]\w*)*|[^:]+\.py):[A-Za-z_]\w*$")


@dataclass(frozen=True)
class GatewayConfig:
    """The agent program and how its sessions become trajectories (``trainer.rollout_source: gateway``).

    Attributes:
        agent: the program as a Python callable, ``"module:function"`` or ``"path/file.py:function"``,
            called as ``function(base_url, api_key, task) -> reward | None`` (a plain function runs in
            a thread, an ``async def`` on the event loop); ``task`` is a dict (docs/gateway.md).
        command: the program as a command (argv list) instead, run once per episode with
            ``OPENAI_BASE_URL``, ``OPENAI_API_KEY`` and ``CHATGYM_TASK`` (the task as JSON, also on its
            stdin) in its environment; its reward is its last stdout line when that is a number.
            Exactly one of ``agent`` and ``command`` is set.
        reward: ``program`` (what the program returns, prints or POSTs to
            ``/v1/sessions/{id}/reward``; 0.0 and ``info["reward_missing"]`` when it reports none) or
            ``env`` (the session's last assistant reply is scored by the env's own scorer on the same
            task: an unmodified agent is trained on the env's exact reward).
        concurrency: agent programs running at once (each one session).
        tool_parser: the parser that turns the model's text into OpenAI ``tool_calls``
            (:func:`chatgym.envs.parsers.get_parser` names: ``hermes``, ``llama3_json``, ``pythonic``).
        session_timeout_s: a session with no request for this long ends by itself.
        segments: ``all`` (every segment of a session is a trajectory of the session's GRPO group,
            each with the session's reward) or ``last`` (only the session's last segment is: one
            trajectory per session, as the collector gives). Both work with ``trainer.backend: ray``.
    """

    agent: str | None = None
    command: tuple[str, ...] = ()
    reward: Literal["program", "env"] = "program"
    concurrency: int = 32
    tool_parser: str = "hermes"
    session_timeout_s: float = 600.0
    segments: Literal["all", "last"] = "all"

    def __post_init__(self) -> None:
        if self.agent is not None and not _CALLABLE.match(self.agent):
            raise ValueError(
                f"trainer.gateway.agent must be 'module:function' or 'path/file.py:function', got {self.agent!r}"
            )
        if self.agent is not None:
            _check_importable(self.agent)
        if self.agent is not None and self.command:
            raise ValueError("trainer.gateway.command: set either agent or command, not both")
        if isinstance(self.concurrency, bool) or not isinstance(self.concurrency, int) or self.concurrency < 1:
            raise ValueError(f"trainer.gateway.concurrency must be an int >= 1, got {self.concurrency!r}")
        if not self.session_timeout_s > 0:
            raise ValueError(f"trainer.gateway.session_timeout_s must be > 0, got {self.session_timeout_s}")
        from chatgym.envs.parsers import PARSERS

        if self.tool_parser not in PARSERS:
            raise ValueError(
                f"trainer.gateway.tool_parser: unknown {self.tool_parser!r}; choose one of {sorted(PARSERS)}"
            )

    def check_program(self) -> None:
        """Raise ValueError naming the field when no program is set (``rollout_source: gateway``)."""
        if self.agent is None and not self.command:
            raise ValueError(
                "trainer.gateway.agent: rollout_source gateway needs the agent program "
                "(agent: 'module:function', or command: [argv...])"
            )


def _check_importable(spec: str) -> None:
    """Raise ValueError naming ``trainer.gateway.agent`` when its file or module does not exist. The
    function itself is looked up by ``chatgym train`` / ``chatgym eval`` before any model loads, not
    here: importing runs the user's module, which loading a config must not."""
    import importlib.util
    from pathlib import Path

    target = spec.rsplit(":", 1)[0]
    if target.endswith(".py"):
        if not Path(target).is_file():
            raise ValueError(f"trainer.gateway.agent: no such file {target!r}")
        return
    try:
        found = importlib.util.find_spec(target)
    except (ImportError, ValueError):
        found = None
    if found is None:
        raise ValueError(f"trainer.gateway.agent: no module named {target!r}")
