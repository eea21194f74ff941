"""Inference engines behind one contract (see ``base``), and :func:`make_engine` to pick one by name.

| name          | class               | module             | use                                             |
|---------------|---------------------|--------------------|-------------------------------------------------|
| ``vllm``      | VLLMEngine          | ``vllm_inproc``    | default: vLLM in this process (needs ``vllm``)  |
| ``vllm-server`` | VLLMServerEngine  | ``vllm_server``    | a running vLLM OpenAI server, token ids in/out  |
| ``sglang``    | SGLangServerEngine  | ``sglang_server``  | a running SGLang server (``/generate``)         |
| ``hf``        | TransformersEngine  | ``hf``             | transformers decode loop, continuous batching   |
| ``openai``    | OpenAIChatEngine    | ``openai_chat``    | API chat models, evaluation only (no token ids) |

Backends are imported only when asked for, so ``import chatgym.trainer.engines`` needs neither vLLM
nor torch.
"""

from __future__ import annotations

import importlib
from typing import Any

from .base import Completion, Engine, SamplingParams

ENGINES: dict[str, tuple[str, str]] = {
    "vllm": ("vllm_inproc", "VLLMEngine"),
    "vllm-server": ("vllm_server", "VLLMServerEngine"),
    "sglang": ("sglang_server", "SGLangServerEngine"),
    "hf": ("hf", "TransformersEngine"),
    "openai": ("openai_chat", "OpenAIChatEngine"),
}


def engine_class(name: str) -> type:
    """The engine class registered under ``name``.

    Raises:
        ValueError: an unknown name (the message lists the known ones).
    """
    try:
        module, cls = ENGINES[name]
    except KeyError:
        raise ValueError(f"unknown engine {name!r}; choose one of {sorted(ENGINES)}") from None
    return getattr(importlib.import_module(f".{module}", __name__), cls)


def make_engine(name: str = "vllm", model: Any = "smollm2", **kwargs: Any) -> Any:
    """Build an engine by name: ``make_engine("hf", "smollm2", dtype="bfloat16")``.

    Args:
        name: one of :data:`ENGINES` (``vllm``, ``vllm-server``, ``sglang``, ``hf``, ``openai``).
        model: what the engine serves: a packaged model name or local directory for ``vllm``/``hf``;
            the served model's name for the server/API engines.
        **kwargs: passed to the engine class (see each class for its arguments).

    Raises:
        ValueError: unknown ``name``; ModuleNotFoundError: the backend's extra is not installed.
    """
    return engine_class(name)(model, **kwargs)


__all__ = ["ENGINES", "Completion", "Engine", "SamplingParams", "engine_class", "make_engine"]
