"""Backends that run untrusted model-written code with limits.

``LocalSandbox`` (``local/sandbox.py``), ``BwrapSandbox`` (``local/bwrap.py``), ``DockerSandbox`` (``docker/sandbox.py``,
extra ``docker``) and ``SandboxFusionSandbox`` (``fusion/client.py``, any SandboxFusion service,
e.g. ``chatgym serve-sandbox``: ``fusion/service.py``) share the ``Sandbox`` contract (``base.py``) and the
process-wide limiter (``limits.py``). What each isolates: the table in docs/sandboxes.md.
"""

from chatgym.sandboxes.base import ExecResult, Sandbox, Session
from chatgym.sandboxes.limits import Limiter, configure, global_limiter
from chatgym.sandboxes.local.bwrap import BwrapSandbox
from chatgym.sandboxes.local.sandbox import LocalSandbox
from chatgym.sandboxes.local.session import LocalSession

__all__ = [
    "BwrapSandbox",
    "ExecResult",
    "Limiter",
    "LocalSandbox",
    "LocalSession",
    "Sandbox",
    "Session",
    "configure",
    "global_limiter",
]
