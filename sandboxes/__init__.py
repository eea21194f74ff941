"""Backends that run untrusted model-written code with limits."""

from .base import ExecResult, Sandbox, Session
from .local import LocalSandbox
from .session import LocalSession

__all__ = ["ExecResult", "LocalSandbox", "LocalSession", "Sandbox", "Session"]
