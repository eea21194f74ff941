"""ToolUse-v0: BFCL function calling, single- and multi-turn, scored by BFCL's rules."""
