"""Training on Ray: the roles of one run as Ray actors on one machine or a cluster.

* :mod:`.cluster` — start a private local cluster (bound to 127.0.0.1, token auth, no dashboard) or
  join one (``RAY_ADDRESS`` / ``trainer.ray.address``), and shut down leaving no Ray process behind;
* :mod:`.rollout_worker` — ``RolloutWorker``: one engine replica, its envs and collectors
  (:class:`~chatgym.trainer.rollout.source.LocalRollout`) inside one actor process;
* :mod:`.router` — least-loaded routing of episodes to replicas, with per-replica metrics;
* :mod:`.limiter` — ``ToolLimiter``: one concurrency/rate budget for tool calls, sandbox runs,
  retrieval and API calls shared by every worker (through :mod:`chatgym.envs.tool_gate`);
* :mod:`.ray_rollout` — ``RayRollout``: the ``RolloutSource`` over N workers (routing, versioned
  weight sync through the object store, re-running the episodes of a worker that died).

The fakes for tests and benchmarks (a scripted engine with latency, an env whose tool sleeps and counts
concurrent runs across processes) are in :mod:`chatgym.testing`.

Ray is an optional dependency, imported only when one of these is used: ``pip install 'chatgym[ray]'``.
"""

from __future__ import annotations

from typing import Any


def import_ray() -> Any:
    """``import ray``, or an error that names the extra to install.

    Raises:
        ModuleNotFoundError: Ray is not installed.
    """
    try:
        import ray
    except ModuleNotFoundError as exc:
        raise ModuleNotFoundError(
            "trainer.backend=ray needs Ray: pip install 'chatgym[ray]' (ray==2.60.0)"
        ) from exc
    return ray
