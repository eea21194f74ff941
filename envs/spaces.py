"""Honest Gymnasium spaces for chat: a list of messages in, a string (or assistant message) out.

``gymnasium.spaces.Text`` is the wrong tool: its default charset rejects spaces and punctuation, so
every real observation would fall outside it. These spaces check structure instead of characters.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from gymnasium import spaces
from gymnasium.vector.utils import create_empty_array

from chatgym.envs.messages import message_errors

_ALPHABET = np.array(list("abcdefghijklmnopqrstuvwxyz ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789.,:;!?()[]{}'\"\n"))


def _random_text(rng: np.random.Generator, max_length: int) -> str:
    n = int(rng.integers(1, max_length + 1))
    return "".join(rng.choice(_ALPHABET, size=n))


class MessagesSpace(spaces.Space[list]):
    """Observations: a list of chat messages (``list[Message]``), possibly empty."""

    def __init__(self, seed: int | np.random.Generator | None = None):
        super().__init__(shape=None, dtype=None, seed=seed)

    @property
    def is_np_flattenable(self) -> bool:
        return False

    def contains(self, x: Any) -> bool:
        return isinstance(x, list) and all(not message_errors(m) for m in x)

    def sample(self, mask: Any = None, probability: Any = None) -> list:
        return [{"role": "user", "content": _random_text(self.np_random, 64)}]

    def __repr__(self) -> str:
        return "MessagesSpace()"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, MessagesSpace)


class ActionSpace(spaces.Space[Any]):
    """Actions: the assistant's turn, as text (``str``) or as an assistant ``Message`` dict."""

    def __init__(self, max_length: int = 256, seed: int | np.random.Generator | None = None):
        self.max_length = max_length
        super().__init__(shape=None, dtype=None, seed=seed)

    @property
    def is_np_flattenable(self) -> bool:
        return False

    def contains(self, x: Any) -> bool:
        if isinstance(x, str):
            return True
        return isinstance(x, dict) and x.get("role") == "assistant" and not message_errors(x)

    def sample(self, mask: Any = None, probability: Any = None) -> str:
        return _random_text(self.np_random, self.max_length)

    def __repr__(self) -> str:
        return "ActionSpace()"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ActionSpace)


# Gymnasium's vector envs (``gym.make_vec``) batch observations through singledispatch helpers.
# Their generic ``Space`` fallbacks already batch our spaces as tuples (one message list / action per
# env) except ``create_empty_array``, which SyncVectorEnv and AsyncVectorEnv call at start-up.
# AsyncVectorEnv also needs ``vector_kwargs={"shared_memory": False}``: message lists have no fixed
# size, so they cannot live in a shared-memory buffer.
@create_empty_array.register(MessagesSpace)
def _empty_messages_batch(space: MessagesSpace, n: int = 1, fn: Any = np.zeros) -> tuple[list, ...]:
    return tuple([] for _ in range(n))
