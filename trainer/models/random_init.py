"""Randomly initialised models of a real architecture (from a local config), for tests and throughput
benchmarks that need a model's shapes, not its weights.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from chatgym.trainer.models.dtype import resolve_dtype
from chatgym.trainer.models.packaged import load_model_path
from chatgym.trainer.models.vlm import auto_model_class


def random_model(
    config_name_or_path: str | os.PathLike[str] | Any,
    dtype: Any = "float32",
    device: str | Any = "cpu",
    seed: int = 0,
    **config_overrides: Any,
) -> Any:
    """A randomly initialised causal LM or vision-language model of a given architecture (for
    throughput benchmarks, GPU checks); a VLM shape is e.g. ``random_model("smolvlm-2b-shape")``
    (:data:`chatgym.trainer.models.vlm.VLM_SHAPES`).

    Args:
        config_name_or_path: a ``transformers`` ``PretrainedConfig``, a packaged model name / local model
            directory (its ``config.json`` is used, the weights are not), or a path to a ``config.json``.
        dtype, device: as in :func:`load_model`.
        seed: ``torch.manual_seed`` before initialisation, so two calls give the same weights.
        **config_overrides: config attributes to change, e.g. ``num_hidden_layers=2``,
            ``hidden_size=1536`` (to build a larger shape without any download); a dotted name reaches
            a sub-config, e.g. ``**{"vision_config.num_hidden_layers": 2}`` for a VLM.

    Raises:
        FileNotFoundError: the config cannot be found locally.
        AttributeError: an override names an attribute the config does not have.
    """
    import torch
    from transformers import AutoConfig, PretrainedConfig

    if isinstance(config_name_or_path, PretrainedConfig):
        config = config_name_or_path.__class__.from_dict(config_name_or_path.to_dict())
    else:
        path = Path(str(config_name_or_path)).expanduser()
        if path.is_file():
            config = AutoConfig.from_pretrained(path.parent if path.name == "config.json" else path)
        else:
            config = AutoConfig.from_pretrained(load_model_path(config_name_or_path))
    for key, value in config_overrides.items():
        *parents, leaf = key.split(".")
        target = config
        for part in parents:
            target = getattr(target, part, None)
        if target is None or not hasattr(target, leaf):
            raise AttributeError(f"random_model: config {type(config).__name__} has no field {key!r}")
        setattr(target, leaf, value)
    torch.manual_seed(seed)
    model = auto_model_class(config).from_config(config, dtype=resolve_dtype(dtype))
    return model.to(device).eval()
