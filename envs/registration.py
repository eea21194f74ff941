"""Every chatgym env id, registered with Gymnasium by ``import chatgym``.

Add a row here when adding an env; the tests run Gymnasium's ``check_env`` and
:func:`chatgym.envs.env_checker.check_chat_env` over this table.
"""

from __future__ import annotations

import gymnasium as gym

# id -> (entry point, default kwargs)
ENV_SPECS: dict[str, tuple[str, dict]] = {
    "CodeSandbox-v0": ("chatgym.envs.code.env:CodeSandboxEnv", {}),
    "Math-v0": ("chatgym.envs.math.env:MathEnv", {}),
    "MathCalculator-v0": ("chatgym.envs.math.env:MathEnv", {"calculator": True}),
    "MathPython-v0": ("chatgym.envs.math.python:MathPythonEnv", {}),
    "Search-v0": ("chatgym.envs.search.env:SearchEnv", {}),
    "UserSim-v0": ("chatgym.envs.usersim.env:UserSimEnv", {}),
    "Judge-v0": ("chatgym.envs.judge.env:JudgeEnv", {}),
    "ToolUse-v0": ("chatgym.envs.tool_use.env:ToolUseEnv", {}),
    "VisualGrid-v0": ("chatgym.envs.visual.grid:VisualGridEnv", {}),
    "ChartQA-v0": ("chatgym.envs.visual.chart:ChartQAEnv", {}),
}


def register_envs() -> None:
    for env_id, (entry_point, kwargs) in ENV_SPECS.items():
        if env_id not in gym.registry:
            # No TimeLimit wrapper: ChatEnv truncates by assistant turns itself (max_turns). No
            # PassiveEnvChecker: when the first reset raises (a misspelt option, a task index out of
            # range), Gymnasium 1.4's checker keeps no first observation and every later step raises
            # TypeError, reset or not. tests/test_env_checker.py runs the full checks on every env here.
            gym.register(id=env_id, entry_point=entry_point, kwargs=kwargs, disable_env_checker=True)


def observes_images(env_id: str) -> bool:
    """Whether the registered env ``env_id``'s observations carry images (its class's
    ``ChatEnv.image_observations``), read from the class without building the env; False for an id
    whose entry point is a factory function rather than an env class.

    Raises:
        gymnasium.error.Error: ``env_id`` is not registered.
    """
    from gymnasium.envs.registration import load_env_creator

    point = gym.spec(env_id).entry_point
    creator = load_env_creator(point) if isinstance(point, str) else point
    return bool(getattr(creator, "image_observations", False))


def image_env_refusal(env_id: str, why: str, whose: str = "its") -> str | None:
    """Why ``env_id`` cannot run on a policy that reads no images (``why``: what reads none, e.g.
    ``"--model smollm2 is a text-only model (no image processor)"``), or None when its observations
    carry no images: every episode would fail at its first observation, so the commands refuse (or,
    under ``chatgym eval --env all``, skip) with it before the model loads. ``whose``: ``"their"`` where
    the message names several envs."""
    return f"{whose} observations carry images and {why}" if observes_images(env_id) else None
