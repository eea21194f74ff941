"""The gateway: train an agent program written against the OpenAI chat API, unchanged.

:class:`Gateway` serves ``/v1/chat/completions`` on 127.0.0.1 from a chatgym engine and records each
session as token-exact :class:`~chatgym.trainer.rollout.types.Trajectory` objects (the contract is in
``server.py``'s and ``session.py``'s docstrings); :class:`SessionEnded` is raised for an unknown or
collected session id.
"""

from chatgym.trainer.gateway.server import Gateway, SessionEnded

__all__ = ["Gateway", "SessionEnded"]
