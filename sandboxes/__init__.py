"""Backends that run untrusted model-written code with limits.

``LocalSandbox`` (``local.py``), ``BwrapSandbox`` (``bwrap.py``), ``DockerSandbox`` (``container.py``,
extra ``docker``) and ``SandboxFusionSandbox`` (``fusion_client.py``, any SandboxFusion service,
e.g. ``chatgym serve-sandbox``: ``service.py``) share the ``Sandbox`` contract (``base.py``) and the
process-wide limiter (``limits.py``). What each isolates: the table in docs/sandboxes.md.
"""

from .base import ExecResult, Sandbox, Session
from .bwrap import BwrapSandbox
from .limits import Limiter, configure, global_limiter
from .local import LocalSandbox
from .session import LocalSession

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
