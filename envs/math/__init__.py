"""Math envs: Math-v0 / MathCalculator-v0 (reasoning-gym tasks, answer checking) and MathPython-v0 (a python tool)."""
