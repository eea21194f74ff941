"""Building the two roles of a run from its config: the rollout source and the learner.

    rollout = build_local_rollout(cfg, engine=None, tokenizer=tok, model_path=path, out_dir=out)
    learner = build_learner(cfg, tokenizer=tok, ckpt=None)

``trainer.backend`` picks where they run: ``local`` builds them in this process; ``ray`` builds them
as actors (:mod:`chatgym.trainer.distributed`), each actor building its local part with these same
functions, so a one-worker Ray run and a local run construct the same objects.
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path
from typing import Any

from .engines import build_engine, engine_dtype
from .genrm import genrm_env_source
from .rollout.collector import Collector
from .rollout.source import LocalRollout


def build_local_rollout(
    cfg: Any,
    *,
    engine: Any = None,
    tokenizer: Any,
    model_path: str | Path,
    out_dir: str | Path,
    generation_config: Any = None,
    trace_name: str = "traces.jsonl",
) -> LocalRollout:
    """The engine (built from ``cfg.engine`` unless given) and the train/eval collectors.

    Args:
        cfg: the run's :class:`~chatgym.trainer.config.Config`.
        engine: an already built engine (tests, custom set-ups), or None to build ``cfg.engine``
            loading ``model_path``.
        tokenizer: the model's tokenizer.
        model_path: the directory the engine loads.
        out_dir: where ``traces.jsonl`` / ``eval_traces.jsonl`` go.
        generation_config: the model's ``GenerationConfig`` (EOS ids); None reads it from
            ``model_path`` when there is one there.
        trace_name: the training trace file's name (a rollout worker writes its own).
    """
    out = Path(out_dir)
    if engine is None:
        engine = build_engine(
            cfg.engine, Path(model_path), tokenizer, cfg.train.seed, cfg.rollout.max_model_len
        )
        print(f"chatgym: engine {cfg.engine.backend} in {engine_dtype(cfg.engine)}", file=sys.stderr)
    if generation_config is None:
        generation_config = _generation_config(model_path)
    train_cfg = dataclasses.replace(
        cfg.rollout, trace_path=str(out / trace_name), trace_fraction=cfg.train.trace_fraction
    )
    eval_cfg = dataclasses.replace(
        cfg.rollout,
        temperature=cfg.env.eval_temperature,
        trace_path=str(out / ("eval_" + trace_name)),
        trace_fraction=1.0,
    )
    return LocalRollout(
        engine,
        Collector(engine, tokenizer, train_cfg, generation_config),
        Collector(engine, tokenizer, eval_cfg, generation_config),
        env_source=genrm_env_source(cfg, engine=engine, tokenizer=tokenizer),
    )


def build_learner(
    cfg: Any, *, tokenizer: Any, ckpt: Path | None = None, out_dir: str | Path | None = None
) -> Any:
    """The learner: ``trainer.backend: local`` — policy, reference, critic and optimizers here;
    ``ray`` — ``trainer.ray.num_learners`` data-parallel learner actors
    (:class:`~chatgym.trainer.distributed.learner.RayLearnerGroup`, placed per ``trainer.ray.placement``;
    Ray must be initialised: :func:`start_ray`)."""
    if cfg.trainer.backend == "ray":
        from .distributed.learner import RayLearnerGroup
        from .distributed.placement import placement_options

        return RayLearnerGroup(
            cfg, ckpt=ckpt, out_dir=out_dir, scheduling=placement_options(cfg).learners
        )
    from .learner.role import Learner

    return Learner(cfg, tokenizer, ckpt)


def build_rollout(
    cfg: Any,
    *,
    engine: Any = None,
    tokenizer: Any,
    model_path: str | Path,
    out_dir: str | Path,
    generation_config: Any = None,
) -> Any:
    """The rollout source: ``trainer.backend: local`` — :func:`build_local_rollout`; ``ray`` —
    ``trainer.ray.num_rollout_workers`` rollout workers
    (:class:`~chatgym.trainer.distributed.ray_rollout.RayRollout`), each building its engine from
    ``cfg.engine`` in its own process.

    Raises:
        ConfigError: an engine object given with ``trainer.backend: ray`` (workers build their own;
            a custom one goes in ``trainer.ray.engine_factory``).
    """
    if cfg.trainer.backend == "ray":
        from .config import ConfigError

        if engine is not None:
            raise ConfigError(
                "trainer.backend: ray builds each rollout worker's engine in the worker; pass no engine "
                "object (a custom engine: trainer.ray.engine_factory: 'module:function')"
            )
        from .distributed.placement import placement_options
        from .distributed.ray_rollout import RayRollout

        return RayRollout(
            cfg, model_path=model_path, out_dir=out_dir, worker_options=placement_options(cfg).workers
        )
    return build_local_rollout(
        cfg,
        engine=engine,
        tokenizer=tokenizer,
        model_path=model_path,
        out_dir=out_dir,
        generation_config=generation_config,
    )


def start_ray(cfg: Any) -> Any:
    """``trainer.backend: ray``: start a private local cluster or join ``trainer.ray.address`` /
    ``RAY_ADDRESS`` (:func:`~chatgym.trainer.distributed.cluster.start_or_join`); returns the
    :class:`~chatgym.trainer.distributed.cluster.RayCluster` to shut down, or None (local backend, or
    Ray already initialised by the caller, who then owns it). A local cluster counts at least the CPUs
    the roles reserve (logical CPUs: more than the machine has only means the roles share cores)."""
    if cfg.trainer.backend != "ray":
        return None
    import atexit
    import os

    from .distributed import import_ray
    from .distributed.cluster import start_or_join

    if import_ray().is_initialized():
        return None
    rc = cfg.trainer.ray
    demand = rc.num_learners * rc.learner_num_cpus + rc.num_rollout_workers * rc.worker_num_cpus
    num_cpus = rc.num_cpus or max(os.cpu_count() or 1, int(-(-demand // 1)))
    cluster = start_or_join(rc.address, num_cpus=num_cpus)
    atexit.register(cluster.shutdown)  # a run that fails half-built leaves no Ray process behind
    return cluster


def _generation_config(model_path: str | Path) -> Any:
    # What a model loaded by from_pretrained would carry: its own file, else one derived from config.json.
    from transformers import AutoConfig, GenerationConfig

    path = Path(model_path)
    if (path / "generation_config.json").is_file():
        return GenerationConfig.from_pretrained(path)
    if (path / "config.json").is_file():
        return GenerationConfig.from_model_config(AutoConfig.from_pretrained(path))
    return None
