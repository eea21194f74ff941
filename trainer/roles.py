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
from .learner.role import Learner
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


def build_learner(cfg: Any, *, tokenizer: Any, ckpt: Path | None = None) -> Learner:
    """The learner of ``trainer.backend: local``: policy, reference, critic and optimizers here."""
    return Learner(cfg, tokenizer, ckpt)


def _generation_config(model_path: str | Path) -> Any:
    # What a model loaded by from_pretrained would carry: its own file, else one derived from config.json.
    from transformers import AutoConfig, GenerationConfig

    path = Path(model_path)
    if (path / "generation_config.json").is_file():
        return GenerationConfig.from_pretrained(path)
    if (path / "config.json").is_file():
        return GenerationConfig.from_model_config(AutoConfig.from_pretrained(path))
    return None
