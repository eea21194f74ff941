"""Reward sources beyond the env's own: a GenRM judge wrapped around each episode's env."""
