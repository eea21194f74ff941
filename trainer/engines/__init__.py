"""Inference engines behind one contract (see ``base``)."""

from .base import Completion, Engine, SamplingParams

__all__ = ["Completion", "Engine", "SamplingParams"]
