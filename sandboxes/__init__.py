"""Backends that run untrusted model-written code with limits.

``LocalSandbox`` (``local.py``), ``BwrapSandbox`` (``bwrap.py``), ``DockerSandbox`` (``container.py``,
extra ``docker``) and ``SandboxFusionSandbox`` (``fusion_client.py``, any SandboxFusion service,
e.g. ``chatgym serve-sandbox``: ``service.py``) share the ``Sandbox`` contract (``base.py``) and the
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
