#!/usr/bin/env bash
# Per-turn vs trajectory-level advantages on a tool recipe: the cold start once, then every
# (advantage, seed) run of the recipe's GPU config at the same time on one GPU.
#
#   bash examples/recipes/compare_estimators.sh RECIPE OUT_ROOT [override ...]
#
# RECIPE: arith_chain | countdown (the dose of each recipe's README). OUT_ROOT gets RECIPE_sft/ (and
# RECIPE_sft.log) and one run directory per pair, RECIPE_ADV_sSEED/ (metrics.jsonl, eval_traces.jsonl,
# plot_recipe.py's curves.png, ...), plus RECIPE_ADV_sSEED.log and RECIPE_ADV_sSEED.plot.txt.
# Overrides go to every `chatgym train` (e.g. train.max_steps=40).
# ADVANTAGES (default "grpo turn_grpo") and SEEDS (default "0 1") choose the runs; CHATGYM and
# PYTHON the executables, one path or name each (default .venv/bin/chatgym and .venv/bin/python where
# they exist). Exits 2 before anything runs on bad arguments: a missing one, an ADVANTAGES name that
# is no estimator, a name or seed given twice, no CUDA GPU.
# Exits 1 when the cold start, a run or a plot failed, naming its log (a failed run is not
# plotted); an interrupt or TERM stops the runs still going, each with every process it started (its
# engine's subprocesses: each run is a process group of its own).
#
# Why at once: a 135M policy leaves an H200 mostly idle (each step is bound by kernel launches and
# the sandboxes' CPU work), so four runs side by side take far less than four times one run. Their
# step times are then not comparable with a run alone; compare held-out scores at equal steps.
# Memory: each run took 16-29 GB of an H200 (the update's float32 logits); two recipes' four runs
# at once (eight processes) ran out of its 140 GB, six fit (examples/recipes/countdown/results_h200/).
# On an 80 GB H100 with train.micro_batch_size=16, eight ran out too (6.7-13.8 GB a process), four
# to six fit (examples/recipes/countdown/results_h100/).
set -euo pipefail
if [ $# -lt 2 ]; then
  echo "usage: compare_estimators.sh RECIPE OUT_ROOT [override ...]" >&2
  exit 2
fi
recipe=$1
root=$2
shift 2
case $recipe in
  arith_chain) dose=(--examples 16 --batch-size 4 --lr 5e-5) ;;
  countdown) dose=(--examples 16 --batch-size 4 --lr 1e-4) ;;
  *) echo "compare_estimators.sh: RECIPE must be arith_chain or countdown, got '$recipe'" >&2; exit 2 ;;
esac
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
config=$here/$recipe/gpu.yaml
py=${PYTHON:-$([ -x .venv/bin/python ] && echo .venv/bin/python || echo python3)}
cg=${CHATGYM:-$([ -x .venv/bin/chatgym ] && echo .venv/bin/chatgym || echo chatgym)}
# The runs, checked before the cold start (minutes wasted otherwise): estimator names the registry
# knows, no name or seed twice (two runs would share one output directory), and a GPU (gpu.yaml and
# the cold start run on cuda). `read` splits the lists without expanding globs.
read -r -a advantages <<< "${ADVANTAGES:-grpo turn_grpo}"
read -r -a seeds <<< "${SEEDS:-0 1}"
for list in advantages seeds; do
  declare -n items=$list
  if [ ${#items[@]} -eq 0 ]; then
    echo "compare_estimators.sh: ${list^^} names no run" >&2
    exit 2
  fi
  twice=$(printf '%s\n' "${items[@]}" | sort | uniq -d | tr '\n' ' ')
  if [ -n "$twice" ]; then
    echo "compare_estimators.sh: ${list^^} names ${twice% } more than once" >&2
    exit 2
  fi
done
if ! problem=$("$py" - "${advantages[@]}" 2>&1 <<'PY'
import sys

from chatgym.trainer.algos import get_advantage_estimator

for name in sys.argv[1:]:
    try:
        get_advantage_estimator(name)
    except ValueError as e:
        sys.exit(f"ADVANTAGES: {e}")
import torch

if not torch.cuda.is_available():
    sys.exit("no CUDA GPU here: the cold start and gpu.yaml's runs need one")
PY
); then
  echo "compare_estimators.sh: $problem" >&2
  exit 2
fi
mkdir -p "$root"
sft=$root/${recipe}_sft
if [ ! -f "$sft/sft_summary.json" ]; then
  if ! "$py" "$here/sft_warmup.py" --recipe "$recipe" --config "$config" --out "$sft" "${dose[@]}" \
    --device cuda > "$root/${recipe}_sft.log" 2>&1; then
    echo "compare_estimators.sh: the SFT cold start failed; see $root/${recipe}_sft.log" >&2
    exit 1
  fi
fi
runs=()  # runs[i] is the run of background process pids[i]
pids=()  # each the leader of its own process group: the run and every process it starts
# Stop the runs' process groups: killing a run's pid alone left its engine's subprocesses (vLLM's)
# running, holding the GPU.
stop_runs() {
  local pid
  for pid in "${pids[@]}"; do kill -TERM -- "-$pid" 2>/dev/null || true; done
}
# The runs go on in the background: stop them when this script ends early (an error, Ctrl-C, TERM).
# In their own sessions they no longer get the terminal's Ctrl-C themselves: this trap stops them.
trap stop_runs EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
for adv in "${advantages[@]}"; do
  for seed in "${seeds[@]}"; do
    run=${recipe}_${adv}_s$seed
    # A background command of a script (no job control) is not a group leader, so setsid makes it
    # one without forking: $! is the run's pid and its process group's id.
    setsid -w "$cg" train "$config" model.path="$sft" algo.advantage="$adv" train.seed="$seed" \
      train.output_dir="$root/$run" train.progress=false "$@" > "$root/$run.log" 2>&1 &
    pids+=("$!")
    runs+=("$run")
  done
done
rc=0
done_runs=()  # the runs that finished; a failed one has no curves worth drawing
for i in "${!pids[@]}"; do
  if wait "${pids[$i]}"; then
    done_runs+=("${runs[$i]}")
  else
    echo "compare_estimators.sh: run ${runs[$i]} failed; see $root/${runs[$i]}.log" >&2
    rc=1
  fi
done
stop_runs  # every run has ended; a failed one may have left its engine behind
trap - EXIT INT TERM
for run in ${done_runs[@]+"${done_runs[@]}"}; do
  if ! "$py" "$here/plot_recipe.py" "$root/$run" > "$root/$run.plot.txt" 2>&1; then
    echo "compare_estimators.sh: plotting $run failed; see $root/$run.plot.txt" >&2
    rc=1
  fi
done
exit "$rc"
