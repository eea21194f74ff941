"""Backends that run untrusted model-written code with limits."""
