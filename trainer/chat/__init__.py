"""The chat layer below engines and rollout: tokenizers, chat templates and their token-exact deltas."""
