"""chatgym: Gymnasium environments for LLM agents, a token-exact rollout collector, PPO/GRPO training.

``import chatgym`` registers every env id with Gymnasium, so ``gym.make("CodeSandbox-v0")`` works.
"""

import os

# No hub downloads, ever: models and data come from installed packages (see README).
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

from chatgym.envs.registration import register_envs

__version__ = "0.1.0"

register_envs()
