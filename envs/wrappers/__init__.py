"""Wrappers around any env: GenRM (an LLM judge scores the finished episode)."""
