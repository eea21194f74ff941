"""The rollout role of a local run (and of each Ray rollout worker): the engine and its collectors.

Split from :mod:`chatgym.trainer.roles.build` so that a rollout worker builds its part without importing the
backend choice (which imports the Ray roles: an import circle).
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path
from typing import Any

from chatgym.trainer.engines import build_engine, engine_dtype
from chatgym.trainer.models.vlm import load_processor
from chatgym.trainer.rewards.genrm import genrm_env_source
from chatgym.trainer.rollout.collector import Collector
from chatgym.trainer.rollout.source import LocalRollout


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
    """The engine (built from ``cfg.engine`` unless given) and the train/eval collectors (with
    ``trainer.rollout_source: gateway``, the agent program's gateways:
    :func:`chatgym.trainer.gateway.source.build_gateway_rollout`).

    Args:
        cfg: the run's :class:`~chatgym.trainer.config.run.Config`.
        engine: an already built engine (tests, custom set-ups), or None to build ``cfg.engine``
            loading ``model_path``.
        tokenizer: the model's tokenizer.
        model_path: the directory the engine loads; a vision-language model's (``smolvlm``) also gives
            the collectors its processor (:func:`~chatgym.trainer.models.vlm.load_processor`, over
            ``tokenizer``), so episodes whose messages hold images expand them into image tokens.
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
        name = cfg.engine.backend if cfg.engine.backend != "auto" else f"auto ({type(engine).__name__})"
        print(f"chatgym: engine {name} in {engine_dtype(cfg.engine)}", file=sys.stderr)
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
    env_source = genrm_env_source(cfg, engine=engine, tokenizer=tokenizer)
    if cfg.trainer.rollout_source == "gateway":
        from chatgym.trainer.gateway.source import build_gateway_rollout

        return build_gateway_rollout(
            cfg, engine, tokenizer, train_rollout=train_cfg, eval_rollout=eval_cfg, env_source=env_source
        )
    processor = load_processor(model_path, tokenizer)
    return LocalRollout(
        engine,
        Collector(engine, tokenizer, train_cfg, generation_config, processor),
        Collector(engine, tokenizer, eval_cfg, generation_config, processor),
        env_source=env_source,
    )


def _generation_config(model_path: str | Path) -> Any:
    # What a model loaded by from_pretrained would carry: its own file, else one derived from config.json.
    from transformers import AutoConfig, GenerationConfig

    path = Path(model_path)
    if (path / "generation_config.json").is_file():
        return GenerationConfig.from_pretrained(path)
    if (path / "config.json").is_file():
        return GenerationConfig.from_model_config(AutoConfig.from_pretrained(path))
    return None
