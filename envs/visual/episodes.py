"""Reference episodes as conversations: what a cold-start SFT set is made of (the scripted policy's
turns with the env's image observations between them)."""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

from chatgym.envs.core import ChatEnv
from chatgym.envs.messages import Message


@dataclass
class ReferenceEpisode:
    """One reference episode: the whole conversation (``env.messages``: system, user with the first
    image, then assistant turns and the env's replies), its return and whether it succeeded."""

    messages: list[Message]
    tools: list[dict[str, Any]]
    total_reward: float
    success: bool | None
    turns: int


def reference_episode(env: ChatEnv, *, seed: int | None = None, options: dict[str, Any] | None = None) -> ReferenceEpisode:
    """Reset ``env`` (``seed``, ``options`` as for ``reset``) and play its ``reference_action`` to the
    end of the episode.

    Raises:
        NotImplementedError: the env has no reference policy. RuntimeError: the reference cannot go on.
    """
    env.reset(seed=seed, options=options)
    total, turns = 0.0, 0
    while True:
        _, reward, terminated, truncated, info = env.step(env.reference_action())
        total, turns = total + reward, turns + 1
        if terminated or truncated:
            return ReferenceEpisode(copy.deepcopy(env.messages), env.tools, total, info.get("success"), turns)
