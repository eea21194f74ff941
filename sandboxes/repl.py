"""Stateful Python sessions inside the zygote (placeholder until implemented)."""

from __future__ import annotations


class Sessions:
    def __init__(self, zygote) -> None:
        self.zygote = zygote

    def dispatch(self, msg: dict) -> None:
        raise ValueError(f"unknown op {msg.get('op')!r}")

    def close_all(self) -> None:
        pass
