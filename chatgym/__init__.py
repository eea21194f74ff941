"""chatgym: Gymnasium environments for LLM agents, a token-exact rollout collector, PPO/GRPO training.

``import chatgym`` registers every env id with Gymnasium, so ``gym.make("CodeSandbox-v0")`` works.
The entry points a user reaches for are attributes of the package, imported on first use (so
``import chatgym`` itself needs neither torch nor an engine)::

    import chatgym

    cfg = chatgym.load_config("examples/configs/math_grpo.yaml", ["train.max_steps=1"])
    trainer = chatgym.Trainer(cfg)       # imports torch now, not at ``import chatgym``

| name               | what                                                  | module                                |
|--------------------|-------------------------------------------------------|---------------------------------------|
| ``make_engine``    | build an inference engine by name (``vllm``, ``hf``)  | ``chatgym.trainer.engines``           |
| ``Collector``      | run many env episodes against an engine at once       | ``chatgym.trainer.rollout.collector`` |
| ``Trainer``        | the training loop of a run config                     | ``chatgym.trainer.train``             |
| ``load_config``    | a run config from YAML + ``key.sub=value`` overrides  | ``chatgym.trainer.config.run``        |
| ``check_chat_env`` | check an env against chatgym's env contract           | ``chatgym.envs.env_checker``          |
"""

import importlib as _importlib
import os as _os
from typing import Any as _Any

# No hub downloads, ever: models and data come from installed packages (see README).
_os.environ.setdefault("HF_HUB_OFFLINE", "1")
_os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

from chatgym.envs.registration import register_envs

__version__ = "0.1.0"

# Public name -> the module that defines it; resolved by __getattr__ on first access, so that the
# heavy ones (torch, transformers) load only when a user asks for them.
_LAZY: dict[str, str] = {
    "make_engine": "chatgym.trainer.engines",
    "Collector": "chatgym.trainer.rollout.collector",
    "Trainer": "chatgym.trainer.train",
    "load_config": "chatgym.trainer.config.run",
    "check_chat_env": "chatgym.envs.env_checker",
}

__all__ = ["__version__", *_LAZY]


def __getattr__(name: str) -> _Any:
    """The entry point ``name`` of :data:`_LAZY`, imported now and cached in the package's namespace.

    Raises:
        AttributeError: ``name`` is not a public name of ``chatgym``.
    """
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'chatgym' has no attribute {name!r}")
    value = getattr(_importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


register_envs()
