"""Backends that run untrusted model-written code with limits."""

from .base import ExecResult, Sandbox, Session
from .local import LocalSandbox

__all__ = ["ExecResult", "LocalSandbox", "Sandbox", "Session"]
