#!/usr/bin/env bash
# Reproduce a leaderboard: the scripted reference policies and SmolLM2-135M (vLLM on CPU) on every
# registered env, then the console tables and a static HTML page. Results (SQLite + JSONL traces) go
# to runs/leaderboard/ and are not committed; re-running resumes and skips what is already stored.
#
#   bash examples/leaderboard.sh                 # 16 tasks per env
#   MAX_TASKS=64 N_SAMPLES=4 bash examples/leaderboard.sh
set -euo pipefail
cd "$(dirname "$0")/.."

OUT=${OUT:-runs/leaderboard}
DB="$OUT/results.sqlite"
MAX_TASKS=${MAX_TASKS:-16}
N_SAMPLES=${N_SAMPLES:-1}

# Reference row: each env's scripted policy (envs without one are skipped with a note).
.venv/bin/chatgym eval --engine reference --env all --max-tasks "$MAX_TASKS" -n "$N_SAMPLES" --db "$DB" || true
# SmolLM2-135M-Instruct through vLLM in this process (greedy with -n 1, else temperature 1).
.venv/bin/chatgym eval --engine vllm --model smollm2 --env all --max-tasks "$MAX_TASKS" -n "$N_SAMPLES" \
  --max-tokens 256 --max-response-tokens 768 --max-model-len 8192 \
  --engine-arg kv_cache_gib=2 --db "$DB"   # 8192: UserSim-v0's airline policy prompt alone is ~4,800 tokens
.venv/bin/chatgym leaderboard --db "$DB" --html "$OUT/leaderboard.html"
