"""Engines, the rollout collector, RL algorithms, the training loop and evaluation."""
