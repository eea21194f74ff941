"""CodeSandbox-v0: HumanEval functions written with a run_python tool and graded by hidden tests in a sandbox."""
