"""Judge-v0: MT-bench questions answered and revised under an LLM judge's rating."""
