#!/bin/bash
# The GPU benchmarks of issues 28 / 31 in one lease of the device machine (no network there), from a
# kit built by ../shared/gpu-kit/build.sh. Every `run` carries at most 64 MiB with the working tree
# (~23 MB with the committed results), so the kit's larger parts are re-split first, here:
#
#   bash ../shared/gpu-kit/build.sh .gpukit all
#   bash benchmarks/gpu_lease.sh split             # .gpukit/smol/a -> a1 + a2, .gpukit/vllm -> vllm3 (38 MB parts)
#
# Then the device calls, back to back (the machine goes back 30 s after a call), each from the
# project root, with the carry named:
#
#   1  [.gpukit/base, .whl]           bash benchmarks/gpu_lease.sh setup [plan2|plan4|plan5|plan7|plan8|plan9|plan10|plan11|plan12|plan13|plan14|plan15|plan18|plan19|plan20|plan21|plan22|plan23|plan24|plan25|plan26|plan27|plan28|plan29|plan30|plan34]   (starts `plan` in the background)
#   2  [.gpukit/smol/a1]              cp .gpukit/smol/a1/* /tmp/kit/smol/
#   3  [.gpukit/smol/a2]              cp .gpukit/smol/a2/* /tmp/kit/smol/
#   4  [.gpukit/smol/b]               bash benchmarks/gpu_lease.sh smol
#   5.. [.gpukit/vllm3/pNN]           mkdir -p /tmp/kit/vllm_parts && cp .gpukit/vllm3/pNN/* /tmp/kit/vllm_parts/
#   last [.gpukit/vllm3/p12, .gpukit/vllm3/meta]  bash benchmarks/gpu_lease.sh vllm   (copies the last part itself)
#   (13 parts of 38 MB: a call carries the working tree, ~23 MB, too, within 64 MiB; `VLLM_KIT=vllm2` takes
#   an older kit of 11 parts of 44 MB)
#   then polls: bash benchmarks/gpu_lease.sh poll 500   (log tail; /tmp/runs packed into $OUT/runs.tgz)
#
# `plan` runs the new GPU tests, then by priority the SmolLM2 step, ours on SmolLM2 (seed 0), the 7B step, ours
# (seed 1), the update's profile, TRL + vLLM, the 7B engine, the GPU tests, the SmolLM2 engine, each waiting for
# its part of the kit (the other plans, `plan2` to `plan30`: their own comments); a poll must follow a poll within 30 s, or the
# machine goes back with the plan unfinished (2026-12-06: lost that way, twice: keep nothing between polls
# but a short look at what came back); `plan`'s vs-TRL run lists are environment variables (RUNS_SMOL_0,
# RUNS_SMOL_1, RUNS_TRL). `.whl` (ignored) holds the test plugins the machine lacks, and py-spy (plan4, plan5, plan7, plan9, plan10,
# installed to /tmp/spy: the SmolLM2 kit's install replaces /tmp/site/bin):
# `pip download --no-deps -d .whl pytest-asyncio pytest-timeout py-spy`. Install steps run from /tmp: from the project root
# `python3 -c "import chatgym"` would import the checkout's partial package instead of the kit's.
set -uo pipefail
O=/tmp/runs

split() {
  set -e
  cd .gpukit
  mkdir -p smol/a1 smol/a2 vllm3
  if [ -f smol/a/smol.part0 ]; then
    head -c 28000000 smol/a/smol.part0 > smol/a1/p0piece0
    tail -c +28000001 smol/a/smol.part0 > smol/a2/p0piece1
    rm -rf smol/a
  fi
  if [ -d vllm ]; then
    rm -rf vllm3 && mkdir vllm3  # a kit split before leaves no stale part or meta behind
    cat vllm/p*/vllm_kit.tar.part* | (cd vllm3 && command split -b 38000000 -d -a 2 - vllm_kit.tar.part)
    for f in vllm3/vllm_kit.tar.part*; do mkdir -p "vllm3/p${f##*part}" && mv "$f" "vllm3/p${f##*part}/"; done
    cp -r vllm/meta vllm3/meta && ls vllm3/p*/vllm_kit.tar.part* | wc -l > vllm3/meta/nparts && rm -rf vllm
  fi
  ls smol/* vllm3
}

setup() {
  set -e
  local root=$PWD
  mkdir -p /tmp/kit/base /tmp/kit/smol $O && cp -r .gpukit/base/. /tmp/kit/base/
  (cd /tmp && bash /tmp/kit/base/install.sh)
  if ls .whl/*.whl > /dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl
  fi
  nvidia-smi --query-gpu=name,memory.total --format=csv
  setsid nohup bash "$root/benchmarks/gpu_lease.sh" "${1:-plan}" "$root" > $O/plan.log 2>&1 < /dev/null &
  echo "plan started: $O/plan.log"
}

smol() {
  set -e
  cp .gpukit/smol/b/* /tmp/kit/smol/
  cat /tmp/kit/smol/p0piece* > /tmp/kit/smol/smol.part0  # the pieces of a1 and a2, in name order
  (cd /tmp && bash /tmp/kit/smol/join.sh)
}

vllm() {
  local kit=.gpukit/${VLLM_KIT:-vllm3} last
  last=$(ls -d "$kit"/p[0-9]* 2>/dev/null | tail -n 1)
  [ -n "$last" ] && [ -d "$kit/meta" ] || { echo "vllm: no parts or no meta in $kit (carry its last part and meta)"; return 2; }
  mkdir -p /tmp/kit/vllm_parts && cp "$last"/* /tmp/kit/vllm_parts/ 2>/dev/null
  rm -rf /tmp/kit/vllm_meta && cp -r "$kit"/meta /tmp/kit/vllm_meta
  (cd /tmp && bash /tmp/kit/vllm_meta/join_install.sh > $O/vllm_install.log 2>&1 && touch /tmp/kit/vllm_ok)
  tail -n 3 $O/vllm_install.log
}

wait_for() { for _ in $(seq 1 120); do [ -f "$1" ] && return 0; sleep 5; done; return 1; }
mark() { echo "== $(date +%T) $*"; }

# A plan's start: the project root, the kit's environment, the tests copied where pytest reads
# pyproject.toml's settings but not the checkout's partial package.
begin() {
  cd "$1"
  source /tmp/kit/base/env.sh
  export VLLM_USE_FLASHINFER_SAMPLER=0
  rm -rf /tmp/t && mkdir -p /tmp/t && cp -r tests pyproject.toml /tmp/t/
}

update_profile() {
  mark "the update under the profiler (ours_px's: padded, checkpointing, compiled layers)"
  timeout 240 python3 benchmarks/train_step_gpu.py --only padded --checkpointing on --compile --profile --repeats 5 \
    --json $O/train_step_profile.json > $O/train_step_profile.txt 2>&1
  grep -A14 "^padded" $O/train_step_profile.txt | cut -c1-200
}

# ours' runs $1 (seed 0) and $2 (seed 1) against TRL + vLLM fp32 seeds 0 and 1, in one results folder
# (vs_smol); $3: an environment assignment for ours' seed-0 runs, or nothing.
vs_trl_pairs() {
  local vs="python3 benchmarks/vs_trl_gpu.py --run-timeout 300 --shape smollm2 --out $O/vs_smol"
  mark "vs TRL, SmolLM2: ours seed 0"
  env ${3:-} $vs --runs $1 > $O/vs_smol_ours0.txt 2>&1
  python3 benchmarks/vs_trl_gpu.py --report $O/vs_smol > $O/report_smol.txt 2>&1; head -n 9 $O/report_smol.txt
  wait_for /tmp/kit/vllm_ok || mark "no vLLM"
  mark "vs TRL, SmolLM2: TRL + vLLM seeds 0 and 1, ours seed 1"
  $vs --runs trl_vllm_fp32:0 > $O/vs_smol_trl0.txt 2>&1
  $vs --runs $2 > $O/vs_smol_ours1.txt 2>&1
  $vs --runs trl_vllm_fp32:1 > $O/vs_smol_trl1.txt 2>&1
  python3 benchmarks/vs_trl_gpu.py --report $O/vs_smol > $O/report_smol.txt 2>&1; head -n 30 $O/report_smol.txt
}

update_ckpt() {  # the update with checkpointing off and on, $1 steps each (hf engine, micro-batches of 64)
  mark "the update, checkpointing on and off ($1 steps each)"
  timeout 300 python3 benchmarks/update_checkpointing_gpu.py --steps "$1" --micro 64 > $O/update_ckpt.txt 2>&1
  tail -n 4 $O/update_ckpt.txt
}

plan() {
  begin "$1"
  mark "GPU tests: the decode attention kernel, the engine's stream"
  (cd /tmp/t && timeout 300 python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_engines_hf_attention.py \
    tests/test_engines_hf_stream.py > $O/gpu_tests_new.txt 2>&1)
  tail -n 3 $O/gpu_tests_new.txt
  wait_for /tmp/site/.smol_ok || mark "no SmolLM2"
  mark "decode step, SmolLM2: the attention kernel vs SDPA"
  timeout 200 python3 benchmarks/decode_step_gpu.py --rows 64 256 --shape smollm2 --modes fused_c fused_c_sdpa \
    --iters 200 --profile > $O/step_smol.txt 2>&1
  grep -E "replay|attention|sampl" $O/step_smol.txt | cut -c1-200
  local runs0=${RUNS_SMOL_0:-ours_px:0 ours_1off_px:0 ours_1off_px_gil:0} runs1=${RUNS_SMOL_1:-ours_px:1 ours_1off_px:1}
  local vs="python3 benchmarks/vs_trl_gpu.py --run-timeout 420"
  mark "vs TRL, SmolLM2, ours seed 0"
  $vs --shape smollm2 --out $O/vs_smol --runs $runs0 > $O/vs_smol_0.txt 2>&1
  python3 benchmarks/vs_trl_gpu.py --report $O/vs_smol > $O/report_smol.txt 2>&1; head -n 24 $O/report_smol.txt
  mark "decode step, Qwen2.5-7B shape"
  timeout 300 python3 benchmarks/decode_step_gpu.py --rows 64 256 --shape qwen2.5-7b --modes fused_c fused_c_sdpa fp8_c \
    fp8_c_sdpa --iters 50 --profile > $O/step_7b.txt 2>&1
  grep -E "bandwidth|replay|attention" $O/step_7b.txt | cut -c1-200
  mark "vs TRL, SmolLM2, ours seed 1"
  $vs --shape smollm2 --out $O/vs_smol --runs $runs1 > $O/vs_smol_1.txt 2>&1
  python3 benchmarks/vs_trl_gpu.py --report $O/vs_smol > $O/report_smol.txt 2>&1; head -n 24 $O/report_smol.txt
  update_profile
  wait_for /tmp/kit/vllm_ok || mark "no vLLM"
  mark "vs TRL, SmolLM2, TRL + vLLM seed 0"
  $vs --shape smollm2 --out $O/vs_smol --runs ${RUNS_TRL:-trl_vllm_fp32:0} > $O/vs_smol_trl.txt 2>&1
  python3 benchmarks/vs_trl_gpu.py --report $O/vs_smol > $O/report_smol.txt 2>&1; head -n 40 $O/report_smol.txt
  mark "engine tokens/s, Qwen2.5-7B shape"
  timeout 360 python3 benchmarks/hf_decode_gpu.py --shape qwen2.5-7b --batch 64 256 --skip-generate --repeats 3 \
    --modes "static all" "static fp8 all" > $O/decode_7b.txt 2>&1
  grep -E "tok/s|FP8/bf16" $O/decode_7b.txt | cut -c1-160
  mark "GPU tests of the compiled step"
  (cd /tmp/t && timeout 300 python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_engines_hf_elementwise.py \
    tests/test_engines_hf_static.py tests/test_engines_hf_draw.py > $O/gpu_tests.txt 2>&1)
  tail -n 3 $O/gpu_tests.txt
  mark "engine tokens/s, SmolLM2 (seeded)"
  timeout 200 python3 benchmarks/hf_decode_gpu.py --real-weights --seeded --batch 64 256 --skip-generate --repeats 3 \
    --modes "static all" > $O/decode_smol_seeded.txt 2>&1
  grep -E "tok/s" $O/decode_smol_seeded.txt | cut -c1-160
  mark "done"
}

# A second lease's plan (`setup plan2`): the update after the one-write logits gradient, then ours and
# TRL + vLLM on SmolLM2, two seeds, in one lease.
plan2() {
  begin "$1"
  local vs="python3 benchmarks/vs_trl_gpu.py --run-timeout 420"
  wait_for /tmp/site/.smol_ok || mark "no SmolLM2"
  update_profile
  mark "vs TRL, SmolLM2, ours seed 0"
  $vs --shape smollm2 --out $O/vs_smol --runs ours_px:0 ours_1off_px_gil:0 > $O/vs_smol_0.txt 2>&1
  python3 benchmarks/vs_trl_gpu.py --report $O/vs_smol > $O/report_smol.txt 2>&1; head -n 12 $O/report_smol.txt
  wait_for /tmp/kit/vllm_ok || mark "no vLLM"
  mark "vs TRL, SmolLM2, TRL + vLLM seed 0"
  $vs --shape smollm2 --out $O/vs_smol --runs trl_vllm_fp32:0 > $O/vs_smol_trl0.txt 2>&1
  mark "vs TRL, SmolLM2, ours seed 1"
  $vs --shape smollm2 --out $O/vs_smol --runs ours_px:1 ours_1off_px_gil:1 > $O/vs_smol_1.txt 2>&1
  python3 benchmarks/vs_trl_gpu.py --report $O/vs_smol > $O/report_smol.txt 2>&1; head -n 40 $O/report_smol.txt
  mark "vs TRL, SmolLM2, TRL + vLLM seed 1"
  $vs --shape smollm2 --out $O/vs_smol --runs trl_vllm_fp32:1 > $O/vs_smol_trl1.txt 2>&1
  python3 benchmarks/vs_trl_gpu.py --report $O/vs_smol > $O/report_smol.txt 2>&1; head -n 40 $O/report_smol.txt
  mark "done"
}

# Pieces of plans 4-6.
spy_install() { python3 -m pip install -q --no-index --no-deps --target /tmp/spy .whl/py_spy*.whl; }

stream_tests() {  # the engine's stream tests alone, $1 times
  mark "GPU test of the engine's stream, $1 times"
  for i in $(seq 1 "$1"); do
    (cd /tmp/t && timeout 200 python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_engines_hf_stream.py \
      > $O/gpu_tests_stream_$i.txt 2>&1)
    tail -n 1 $O/gpu_tests_stream_$i.txt
  done
}

spy() {  # vs_trl_gpu.py's run $1 (seed 0) under py-spy; the rest: vs_trl_gpu.py's other arguments
  local run=$1; shift
  mark "$run under py-spy ($*)"
  timeout 400 /tmp/spy/bin/py-spy record -r 250 --threads --idle --subprocesses --nonblocking -f raw \
    -o $O/pyspy_$run.txt -- python3 benchmarks/vs_trl_gpu.py --shape smollm2 "$@" --out $O/vs_spy \
    --runs $run:0 > $O/pyspy_$run.log 2>&1
  tail -n 2 $O/pyspy_$run.log
}

against_vllm() {  # the engine's tokens/s beside vLLM's at shape $1; the rest: the engine's modes
  local shape=$1; shift
  mark "engine tokens/s against vLLM, $shape"
  timeout 480 python3 benchmarks/hf_decode_gpu.py --shape $shape --vllm --batch 64 256 --skip-generate --repeats 3 \
    --modes "$@" > $O/decode_vllm_$shape.txt 2>&1
  grep -E "tok/s" $O/decode_vllm_$shape.txt | cut -c1-160
}

# plan4 from its py-spy run on (plan5 ran it after plan4's first lease ended there).
plan4_rest() {
  local vs="python3 benchmarks/vs_trl_gpu.py --run-timeout 420"
  spy ours_px --steps 8
  mark "vs TRL, SmolLM2, ours"
  $vs --shape smollm2 --out $O/vs_smol --runs ours_1off_px_gil:0 ours_1off_px_gil:1 ours_px:0 > $O/vs_smol_ours.txt 2>&1
  python3 benchmarks/vs_trl_gpu.py --report $O/vs_smol > $O/report_smol.txt 2>&1; head -n 12 $O/report_smol.txt
  wait_for /tmp/kit/vllm_ok || mark "no vLLM"
  against_vllm qwen2.5-7b "static all" "static fp8 all"
  mark "vs TRL, SmolLM2, TRL + vLLM, two seeds"
  $vs --shape smollm2 --out $O/vs_smol --runs trl_vllm_fp32:0 trl_vllm_fp32:1 > $O/vs_smol_trl.txt 2>&1
  python3 benchmarks/vs_trl_gpu.py --report $O/vs_smol > $O/report_smol.txt 2>&1; head -n 40 $O/report_smol.txt
  against_vllm qwen2.5-1.5b "static all"
  against_vllm smollm2 "static all"
  mark "GPU tests: vLLM on CUDA, FP8"
  (cd /tmp/t && timeout 500 python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_engines_vllm_gpu.py \
    tests/test_fp8_gpu.py > $O/gpu_tests_vllm.txt 2>&1)
  tail -n 3 $O/gpu_tests_vllm.txt
  mark "vs TRL, Qwen2.5-1.5B shape"
  $vs --shape qwen2.5-1.5b --steps 10 --out $O/vs_qwen15 --runs ours_px:0 ours_1off_px_gil:0 trl_vllm_bf16:0 \
    trl_vllm_fp32:0 > $O/vs_qwen15.txt 2>&1
  python3 benchmarks/vs_trl_gpu.py --report $O/vs_qwen15 > $O/report_qwen15.txt 2>&1; head -n 30 $O/report_qwen15.txt
  mark "done"
}

# 2026-12-06's lease (`setup plan4`), by priority: the GPU tests of what changed (the packed prefill,
# the in-place residual adds, Inductor's RMSNorm, hf_silu_quant's kernels); the decode step at both
# shapes against the step before (fused_c_aten, fp8_c_inductor); then plan4_rest: ours_px under py-spy
# (where the rollout's host time goes); ours on SmolLM2; the engine against vLLM at 7B; TRL + vLLM, two
# seeds; the engine against vLLM at 1.5B and SmolLM2; vLLM's GPU tests; the Qwen2.5-1.5B shape against
# TRL + vLLM.
plan4() {
  begin "$1"
  spy_install
  mark "GPU tests: packed prefill, in-place adds, compiled RMSNorm, the FP8 MLP's quantization kernels"
  (cd /tmp/t && timeout 400 python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_engines_hf_silu_quant.py \
    tests/test_engines_hf_fused.py tests/test_engines_hf_elementwise.py tests/test_engines_hf_static.py \
    tests/test_engines_hf_fp8.py tests/test_engines_hf_attention.py tests/test_engines_hf_draw.py \
    tests/test_engines_hf_stream.py > $O/gpu_tests.txt 2>&1)
  tail -n 3 $O/gpu_tests.txt
  mark "decode step, Qwen2.5-7B shape"
  timeout 300 python3 benchmarks/decode_step_gpu.py --rows 64 256 --shape qwen2.5-7b --modes fused_c fused_c_aten \
    fp8_c fp8_c_inductor --iters 50 --profile > $O/step_7b.txt 2>&1
  grep -E "bandwidth|replay|fp8 quant|norm  " $O/step_7b.txt | cut -c1-200
  wait_for /tmp/site/.smol_ok || mark "no SmolLM2"
  mark "decode step, SmolLM2"
  timeout 200 python3 benchmarks/decode_step_gpu.py --rows 64 256 --shape smollm2 --modes fused_c fused_c_aten \
    --iters 200 --profile > $O/step_smol.txt 2>&1
  grep -E "replay|norm  " $O/step_smol.txt | cut -c1-200
  plan4_rest
}

# plan4 after its first lease ended at its py-spy step (`setup plan5`): the stream test that failed there,
# three times (py-spy now from its own folder: the SmolLM2 kit's install replaces /tmp/site/bin); the rest.
plan5() {
  begin "$1"
  spy_install
  stream_tests 3
  wait_for /tmp/site/.smol_ok || mark "no SmolLM2"
  plan4_rest
}

# Lease A of 2026-12-06 (2): the engine's captures without torch.cuda.graph's synchronize and cache
# emptying (hf_static.capture) against with them (--torch-graph-capture), ours_1off_px_gil's steady state
# under py-spy, the update with checkpointing on and off.
plan7() {
  begin "$1"
  spy_install
  mark "GPU tests: static slots (the capture)"
  (cd /tmp/t && timeout 200 python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_engines_hf_static.py \
    > $O/gpu_tests_static.txt 2>&1)
  tail -n 3 $O/gpu_tests_static.txt
  wait_for /tmp/site/.smol_ok || mark "no SmolLM2"
  local vs="python3 benchmarks/vs_trl_gpu.py --run-timeout 300 --shape smollm2"
  mark "ours_px, captures by hf_static.capture, then by torch.cuda.graph"
  $vs --out $O/vs_smol --runs ours_px:0 ours_1off_px_gil:0 > $O/vs_smol.txt 2>&1
  $vs --out $O/vs_smol_torchcap --torch-graph-capture --runs ours_px:0 > $O/vs_smol_torchcap.txt 2>&1
  for d in vs_smol vs_smol_torchcap; do
    python3 benchmarks/vs_trl_gpu.py --report $O/$d > $O/report_$d.txt 2>&1; head -n 6 $O/report_$d.txt
  done
  spy ours_1off_px_gil --eval-every 100
  update_ckpt 5
  mark "done"
}

# Lease B of 2026-12-06 (2), after the burst admission and the retired rows (hf_rows.py): the GPU tests of
# the engine, ours and TRL + vLLM on SmolLM2 in pairs (two seeds), ours on FP8 weights (two seeds), the
# 7B engine against vLLM (bf16 and FP8 on both), the 1.5B shape, ours with the vLLM engine (its update).
plan8() {
  begin "$1"
  wait_for /tmp/site/.smol_ok || mark "no SmolLM2"
  mark "GPU tests of the engine"
  (cd /tmp/t && timeout 300 python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_engines_hf_static.py \
    tests/test_engines_hf_stream.py tests/test_engines_hf_continuous.py tests/test_engines_hf.py \
    tests/test_engines_hf_draw.py > $O/gpu_tests.txt 2>&1)
  tail -n 3 $O/gpu_tests.txt
  local vs="python3 benchmarks/vs_trl_gpu.py --run-timeout 300 --shape smollm2 --out $O/vs_smol"
  mark "vs TRL, SmolLM2: ours seed 0"
  $vs --runs ours_px:0 ours_1off_px_gil:0 > $O/vs_smol_ours0.txt 2>&1
  python3 benchmarks/vs_trl_gpu.py --report $O/vs_smol > $O/report_smol.txt 2>&1; head -n 5 $O/report_smol.txt
  wait_for /tmp/kit/vllm_ok || mark "no vLLM"
  for seed in 0 1; do
    mark "vs TRL, SmolLM2: TRL + vLLM seed $seed"
    $vs --runs trl_vllm_fp32:$seed > $O/vs_smol_trl$seed.txt 2>&1
    if [ $seed = 0 ]; then
      mark "vs TRL, SmolLM2: ours seed 1"
      $vs --runs ours_px:1 ours_1off_px_gil:1 > $O/vs_smol_ours1.txt 2>&1
    fi
    python3 benchmarks/vs_trl_gpu.py --report $O/vs_smol > $O/report_smol.txt 2>&1; head -n 12 $O/report_smol.txt
  done
  mark "ours on FP8 weights, SmolLM2, two seeds"
  $vs --runs ours_px_fp8:0 ours_px_fp8:1 > $O/vs_smol_fp8.txt 2>&1
  python3 benchmarks/vs_trl_gpu.py --report $O/vs_smol > $O/report_smol.txt 2>&1; head -n 40 $O/report_smol.txt
  mark "engine tokens/s against vLLM, Qwen2.5-7B shape, bf16 and FP8"
  timeout 540 python3 benchmarks/hf_decode_gpu.py --shape qwen2.5-7b --vllm --fp8 --batch 64 256 --skip-generate \
    --repeats 3 --modes "static all" "static fp8 all" > $O/decode_vllm_qwen2.5-7b.txt 2>&1
  grep -E "tok/s|FP8" $O/decode_vllm_qwen2.5-7b.txt | cut -c1-160
  mark "vs TRL, Qwen2.5-1.5B shape"
  python3 benchmarks/vs_trl_gpu.py --run-timeout 300 --shape qwen2.5-1.5b --steps 10 --out $O/vs_qwen15 \
    --runs ours_px:0 trl_vllm_fp32:0 > $O/vs_qwen15.txt 2>&1
  python3 benchmarks/vs_trl_gpu.py --report $O/vs_qwen15 > $O/report_qwen15.txt 2>&1; head -n 8 $O/report_qwen15.txt
  mark "ours with the vLLM engine, SmolLM2 (its update against the hf engine's)"
  $vs --runs ours_vllm:0 > $O/vs_smol_vllm.txt 2>&1
  python3 benchmarks/vs_trl_gpu.py --report $O/vs_smol > $O/report_smol.txt 2>&1; head -n 14 $O/report_smol.txt
  mark "done"
}

# Lease of 2026-12-06 (3), run: benchmarks/results/precapture_h100_2026-12-06/. Where lease B's rollout time goes (py-spy of ours_px_pc's
# steady state), the collector's prompt memo and Math-v0's cheaper scoring (d0ab916, 91db26f), multi_step
# 4 and precapture (every graph captured at the first join), each paired with TRL + vLLM in the lease.
plan9() {
  begin "$1"
  spy_install
  wait_for /tmp/site/.smol_ok || mark "no SmolLM2"
  mark "GPU tests: multi_step, precapture, static slots, rows"
  (cd /tmp/t && timeout 300 python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_engines_hf_multi_step.py \
    tests/test_engines_hf_precapture.py tests/test_engines_hf_static.py tests/test_engines_hf_stream.py \
    > $O/gpu_tests.txt 2>&1)
  tail -n 3 $O/gpu_tests.txt
  spy ours_px_pc --eval-every 100
  vs_trl_pairs "ours_px:0 ours_px_pc:0 ours_px_ms4:0 ours_1off_px_gil_pc:0 ours_1off_px_gil_ms4_pc:0" \
    "ours_px_pc:1 ours_1off_px_gil_ms4_pc:1 ours_1off_px_gil_pc:1"
  local vs="python3 benchmarks/vs_trl_gpu.py --run-timeout 300 --shape smollm2 --out $O/vs_smol"
  mark "the update with each engine in one lease (ours: hf, ours_vllm: vLLM; the same learner)"
  $vs --runs ours:0 ours_vllm:0 > $O/vs_smol_engines.txt 2>&1
  python3 benchmarks/vs_trl_gpu.py --report $O/vs_smol > $O/report_smol.txt 2>&1; head -n 40 $O/report_smol.txt
  mark "engine tokens/s against vLLM, Qwen2.5-7B shape"
  timeout 480 python3 benchmarks/hf_decode_gpu.py --shape qwen2.5-7b --vllm --batch 64 256 --skip-generate \
    --repeats 3 --modes "static all" "static all ms4" > $O/decode_vllm_qwen2.5-7b.txt 2>&1
  grep -E "tok/s" $O/decode_vllm_qwen2.5-7b.txt | cut -c1-160
  update_ckpt 10
  mark "done"
}

# The next lease (written 2026-12-06 after plan9's, not run): plan9 found the overlapped rollout
# (one_step_off) at 0.31-0.34 s a step against 0.19-0.22 alone, about the update's GPU work added to
# it; the _nc runs drop the recomputed forward of gradient checkpointing from that work. Each ours run
# is paired with TRL + vLLM in the lease; then the update's profile (checkpointing on and off), the
# GPU tests one file a process (one process for all of them died in plan9's lease; see the results).
plan10() {
  begin "$1"
  spy_install
  wait_for /tmp/site/.smol_ok || mark "no SmolLM2"
  # Without checkpointing (_nc) and with it; TORCH_LOGS=recompiles: which guard recompiles the learner's
  # layers at a new padded length (on the CPU, Inductor's C++ codegen guards 65 <= length).
  vs_trl_pairs "ours_1off_px_gil_ms4_pc_nc:0 ours_px_pc_nc:0 ours_1off_px_gil_ms4_pc:0 ours_1off_px_gil_pc_nc:0" \
    "ours_1off_px_gil_ms4_pc_nc:1 ours_px_pc_nc:1 ours_1off_px_gil_ms4_pc:1" TORCH_LOGS=recompiles
  mark "the update under the profiler, checkpointing on and off"
  timeout 300 python3 benchmarks/train_step_gpu.py --only padded --checkpointing both --compile --profile --repeats 5 \
    --json $O/train_step_profile.json > $O/train_step_profile.txt 2>&1
  grep -A14 "^padded" $O/train_step_profile.txt | cut -c1-200
  mark "the update's host work under py-spy (on-CPU samples only: the GPU is idle ~70% of an update)"
  timeout 300 /tmp/spy/bin/py-spy record -r 1000 --nonblocking -f raw -o $O/pyspy_update.txt -- python3 \
    benchmarks/train_step_gpu.py --only padded --checkpointing on --compile --repeats 30 > $O/pyspy_update.log 2>&1
  tail -n 2 $O/pyspy_update.log
  mark "7B tokens/s: the hf engine, chatgym's vLLM engine (auto's pick) and vLLM's own LLM.generate"
  timeout 420 python3 benchmarks/hf_decode_gpu.py --shape qwen2.5-7b --vllm --batch 64 256 --skip-generate \
    --repeats 3 --modes "static all" > $O/decode_vllm_qwen2.5-7b.txt 2>&1
  grep -E "tok/s|LLM.generate" $O/decode_vllm_qwen2.5-7b.txt | cut -c1-160
  mark "GPU tests, one file a process"
  for f in $(cd /tmp/t && grep -l "mark.gpu" tests/*.py); do
    (cd /tmp/t && timeout 240 python3 -m pytest -q -p no:cacheprovider -m gpu "$f" > "$O/gpu_$(basename "$f" .py).txt" 2>&1)
    echo "$f rc=$? $(tail -n 1 "$O/gpu_$(basename "$f" .py).txt")"
  done
  mark "done"
}

# The next lease (2026-12-06, session after plan9): issue 28's tables in one lease, by priority. The
# precapture GPU test (fixed after plan9's failure); the SmolLM2 pairs against TRL + vLLM with the _nc
# runs (no checkpointing: less GPU work beside the overlapped rollout); each shape's tokens/s against
# vLLM (the hf engine, chatgym's vLLM engine and vLLM's own LLM.generate), one process a shape; the
# update with each engine; the update with checkpointing on and off.
plan11() {
  begin "$1"
  wait_for /tmp/site/.smol_ok || mark "no SmolLM2"
  mark "GPU test: precapture"
  (cd /tmp/t && timeout 200 python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_engines_hf_precapture.py \
    > $O/gpu_precapture.txt 2>&1)
  tail -n 1 $O/gpu_precapture.txt
  vs_trl_pairs "ours_1off_px_gil_ms4_pc_nc:0 ours_1off_px_gil_pc_nc:0 ours_px_pc_nc:0 ours_px_pc:0" \
    "ours_1off_px_gil_ms4_pc_nc:1 ours_1off_px_gil_pc_nc:1 ours_px_pc_nc:1 ours_px_pc:1" TORCH_LOGS=recompiles
  for shape in qwen2.5-7b smollm2 qwen2.5-1.5b; do
    mark "tokens/s, $shape: the hf engine, chatgym's vLLM engine and vLLM's own LLM.generate"
    timeout 300 python3 benchmarks/hf_decode_gpu.py --shape $shape --vllm --batch 64 256 --skip-generate \
      --repeats 3 --modes "static all" > $O/decode_vllm_$shape.txt 2>&1
    grep -E "tok/s|LLM.generate" $O/decode_vllm_$shape.txt | cut -c1-160
  done
  mark "the update with each engine (ours: hf, ours_vllm: vLLM; the same learner)"
  python3 benchmarks/vs_trl_gpu.py --run-timeout 300 --shape smollm2 --out $O/vs_smol --runs ours:0 ours_vllm:0 \
    > $O/vs_smol_engines.txt 2>&1
  python3 benchmarks/vs_trl_gpu.py --report $O/vs_smol > $O/report_smol.txt 2>&1; head -n 40 $O/report_smol.txt
  update_ckpt 10
  mark "done"
}

# plan11's second half, started in the same lease after its 7B decode (plan11 stopped there): TRL + vLLM
# with bf16 weights (issue 28's anchor is TRL's faster of bf16 / fp32 masters), then the rest of plan11.
plan11b() {
  begin "$1"
  local vs="python3 benchmarks/vs_trl_gpu.py --run-timeout 300 --shape smollm2 --out $O/vs_smol"
  mark "vs TRL, SmolLM2: TRL + vLLM bf16 seeds 0 and 1"
  $vs --runs trl_vllm_bf16:0 > $O/vs_smol_trlbf0.txt 2>&1
  $vs --runs trl_vllm_bf16:1 > $O/vs_smol_trlbf1.txt 2>&1
  python3 benchmarks/vs_trl_gpu.py --report $O/vs_smol > $O/report_smol.txt 2>&1; head -n 40 $O/report_smol.txt
  for shape in smollm2 qwen2.5-1.5b; do
    mark "tokens/s, $shape: the hf engine, chatgym's vLLM engine and vLLM's own LLM.generate"
    timeout 300 python3 benchmarks/hf_decode_gpu.py --shape $shape --vllm --batch 64 256 --skip-generate \
      --repeats 3 --modes "static all" > $O/decode_vllm_$shape.txt 2>&1
    grep -E "tok/s|LLM.generate" $O/decode_vllm_$shape.txt | cut -c1-160
  done
  update_ckpt 10
  mark "done"
}

# The next lease (written 2026-12-06 after plan11, not run): the vLLM engine's GPU tests after its logprobs
# came flat (flat_logprobs), the 7B tokens/s against LLM.generate again (0.993x / 0.985x before), the
# update with checkpointing the only difference (--share-prefix off), the 1.5B shape's s/step against
# TRL + vLLM in the same lease as the SmolLM2 pairs (issue 28's "one lease").
plan12() {
  begin "$1"
  wait_for /tmp/site/.smol_ok || mark "no SmolLM2"
  mark "the update, checkpointing the only difference (prefix not shared in either)"
  timeout 300 python3 benchmarks/update_checkpointing_gpu.py --steps 20 --micro 64 --share-prefix off \
    > $O/update_ckpt_noshare.txt 2>&1
  tail -n 3 $O/update_ckpt_noshare.txt
  vs_trl_pairs "ours_px_pc_nc:0 ours_1off_px_gil_pc_nc:0" "ours_px_pc_nc:1 ours_1off_px_gil_pc_nc:1"
  local vs="python3 benchmarks/vs_trl_gpu.py --run-timeout 300 --shape smollm2 --out $O/vs_smol"
  $vs --runs trl_vllm_bf16:0 trl_vllm_bf16:1 > $O/vs_smol_trlbf.txt 2>&1
  python3 benchmarks/vs_trl_gpu.py --report $O/vs_smol > $O/report_smol.txt 2>&1; head -n 30 $O/report_smol.txt
  mark "GPU tests: the vLLM engine and FP8"
  for f in tests/test_engines_vllm_gpu.py tests/test_fp8_gpu.py; do
    (cd /tmp/t && timeout 240 python3 -m pytest -q -p no:cacheprovider -m gpu "$f" > "$O/gpu_$(basename "$f" .py).txt" 2>&1)
    echo "$f rc=$? $(tail -n 1 "$O/gpu_$(basename "$f" .py).txt")"
  done
  mark "tokens/s, qwen2.5-7b"
  timeout 300 python3 benchmarks/hf_decode_gpu.py --shape qwen2.5-7b --vllm --batch 64 256 --skip-generate \
    --repeats 3 --modes "static all" > $O/decode_vllm_qwen2.5-7b.txt 2>&1
  grep -E "tok/s|LLM.generate" $O/decode_vllm_qwen2.5-7b.txt | cut -c1-160
  mark "vs TRL, Qwen2.5-1.5B shape (10 steps, one seed)"
  python3 benchmarks/vs_trl_gpu.py --run-timeout 400 --shape qwen2.5-1.5b --steps 10 --out $O/vs_q15 \
    --runs ours_px_pc_nc:0 trl_vllm_bf16:0 trl_vllm_fp32:0 > $O/vs_q15.txt 2>&1
  python3 benchmarks/vs_trl_gpu.py --report $O/vs_q15 2>&1 | head -n 12
  mark "done"
}

# The next lease (2026-12-06, late session): the 7B tokens/s against LLM.generate after the engine's
# requests were staged per event-loop iteration (0.993x / 0.985x before), with each round's step timeline
# (ours and LLM.generate alternating); the SmolLM2 pairs against TRL + vLLM bf16 and fp32; the vLLM
# engine's GPU tests; the 1.5B shape against TRL + vLLM; the other shapes' tokens/s; the update with
# checkpointing the only difference; the other GPU test files last.
plan13() {
  begin "$1"
  local vs="python3 benchmarks/vs_trl_gpu.py --run-timeout 300 --shape smollm2 --out $O/vs_smol"
  wait_for /tmp/site/.smol_ok || mark "no SmolLM2"
  mark "vs TRL, SmolLM2: ours seeds 0 and 1"
  $vs --runs ours_px_pc_nc:0 ours_px_pc_nc:1 > $O/vs_smol_ours.txt 2>&1
  python3 benchmarks/vs_trl_gpu.py --report $O/vs_smol > $O/report_smol.txt 2>&1; head -n 9 $O/report_smol.txt
  wait_for /tmp/kit/vllm_ok || mark "no vLLM"
  decode_shape qwen2.5-7b
  gpu_test_files tests/test_engines_vllm_gpu.py tests/test_fp8_gpu.py
  mark "vs TRL, SmolLM2: TRL + vLLM bf16 and fp32, seeds 0 and 1"
  $vs --runs trl_vllm_bf16:0 trl_vllm_bf16:1 > $O/vs_smol_trl.txt 2>&1
  python3 benchmarks/vs_trl_gpu.py --report $O/vs_smol > $O/report_smol.txt 2>&1; head -n 30 $O/report_smol.txt
  $vs --runs trl_vllm_fp32:0 trl_vllm_fp32:1 > $O/vs_smol_trl32.txt 2>&1
  python3 benchmarks/vs_trl_gpu.py --report $O/vs_smol > $O/report_smol.txt 2>&1; head -n 30 $O/report_smol.txt
  mark "vs TRL, Qwen2.5-1.5B shape (10 steps, one seed)"
  python3 benchmarks/vs_trl_gpu.py --run-timeout 400 --shape qwen2.5-1.5b --steps 10 --out $O/vs_q15 \
    --runs ours_px_pc_nc:0 trl_vllm_bf16:0 trl_vllm_fp32:0 > $O/vs_q15.txt 2>&1
  python3 benchmarks/vs_trl_gpu.py --report $O/vs_q15 > $O/report_q15.txt 2>&1; head -n 12 $O/report_q15.txt
  decode_shape smollm2
  decode_shape qwen2.5-1.5b
  mark "the update, checkpointing the only difference (prefix not shared in either)"
  timeout 300 python3 benchmarks/update_checkpointing_gpu.py --steps 20 --micro 64 --share-prefix off \
    > $O/update_ckpt_noshare.txt 2>&1
  tail -n 3 $O/update_ckpt_noshare.txt
  gpu_test_files $(cd /tmp/t && grep -l "mark.gpu" tests/*.py | grep -v "test_engines_vllm_gpu\|test_fp8_gpu")
  mark "done"
}

# plan13 cut to what a short lease holds (no SmolLM2 kit: calls 2-4 skipped): the 7B tokens/s of
# chatgym's vLLM engine against LLM.generate with the step timeline (vLLM only: no hf column), then
# the vLLM engine's GPU tests if the SmolLM2 kit came after all.
plan13m() {
  begin "$1"
  wait_for /tmp/kit/vllm_ok || mark "no vLLM"
  mark "tokens/s, qwen2.5-7b: chatgym's vLLM engine and vLLM's own LLM.generate (5 rounds each, alternating)"
  timeout 420 python3 -c "import sys; sys.path.insert(0, 'benchmarks'); import hf_decode_gpu as h; per = {}
h.add_vllm_results(per, 'qwen2.5-7b', [64, 256], 5, False, None)
for b, res in per.items(): h.report('qwen2.5-7b', b, res)" > $O/decode_vllm_qwen2.5-7b.txt 2>&1
  grep -E "tok/s|LLM.generate|timeline" $O/decode_vllm_qwen2.5-7b.txt | cut -c1-170
  [ -f /tmp/site/.smol_ok ] && gpu_test_files tests/test_engines_vllm_gpu.py
  mark "done"
}

# Issue 31 first, then what plan13's lease (2026-12-07) left: FP8 / bf16 tokens/s of the vLLM engine at
# the 7B shape with the KV cache in FP8 too (vLLM's async scheduling is on by default in 0.26 for both),
# SmolLM2 training with the vLLM engine in bf16 and FP8 + FP8 KV (accuracy at equal wall clock, the
# mismatch), the update with the hf engine beside (ours:0: the vLLM engine's update within 10% of it),
# the GPU test files plan13 did not reach.
plan14() {
  begin "$1"
  local vs="python3 benchmarks/vs_trl_gpu.py --run-timeout 300 --shape smollm2 --out $O/vs_smol"
  wait_for /tmp/kit/vllm_ok || mark "no vLLM"
  mark "FP8 / bf16 tokens/s, qwen2.5-7b, chatgym's vLLM engine: weights, weights + KV cache"
  timeout 900 python3 benchmarks/hf_decode_gpu.py --shape qwen2.5-7b --batch 64 256 --repeats 5 --vllm-variants \
    'bf16={}' 'fp8={"quantization": "fp8"}' 'fp8kv={"quantization": "fp8", "kv_cache_dtype": "fp8"}' \
    'fp8pckv={"quantization": "fp8_per_channel", "kv_cache_dtype": "fp8"}' \
    --vllm-ratios fp8kv/bf16 fp8pckv/bf16 > $O/fp8_vllm_qwen2.5-7b.txt 2>&1
  grep -E "tok/s|x[0-9]" $O/fp8_vllm_qwen2.5-7b.txt | grep -v timeline | cut -c1-170
  wait_for /tmp/site/.smol_ok || mark "no SmolLM2"
  gpu_test_files tests/test_fp8_gpu.py
  mark "SmolLM2: the vLLM engine bf16 and FP8 weights + KV cache, seeds 0 and 1; ours (hf) seed 0"
  $vs --runs ours_vllm:0 ours_vllm_fp8kv:0 ours_vllm:1 ours_vllm_fp8kv:1 ours:0 > $O/vs_smol_vllm.txt 2>&1
  python3 benchmarks/vs_trl_gpu.py --report $O/vs_smol > $O/report_smol.txt 2>&1; head -n 40 $O/report_smol.txt
  gpu_test_files $(cd /tmp/t && grep -l "mark.gpu" tests/*.py | grep -v "test_engines_vllm_gpu\|test_fp8_gpu\|test_engines_hf_attention\|test_engines_hf_continuous")
  mark "done"
}

attention_sweep() {  # the decode attention kernel on an e4m3 cache, every launch, 64 / 256 rows, into $O/$1.txt; $2 names the form, the rest go to attention_gpu.py
  local out=$1 form=$2; shift 2
  mark "the decode attention kernel on an e4m3 cache, $form, every launch, qwen2.5-7b, positions 145-248"
  timeout 300 python3 benchmarks/attention_gpu.py --shape qwen2.5-7b --rows 64 256 --caches fp8 "$@" > "$O/$out.txt" 2>&1
  grep -a "best\|CHATGYM\|Error" "$O/$out.txt" | cut -c1-200
}

step_7b() {  # the 7B decode step of each mode given (decode_step_gpu.py, profiled), into $O/$1.txt
  local out=$1; shift
  mark "decode step, qwen2.5-7b: $*"
  timeout 300 python3 benchmarks/decode_step_gpu.py --shape qwen2.5-7b --rows 64 256 --iters 50 --profile \
    --modes "$@" > "$O/$out.txt" 2>&1
  grep -E "replay|kernels|gemm |fp8 quant|element|attention|norm " "$O/$out.txt" | cut -c1-170
}

engine_7b() {  # the hf engine's tokens/s and decode-only tokens/s at 7B, each mode given, into $O/$1.txt
  local out=$1; shift
  mark "engine tokens/s (and decode only), qwen2.5-7b: $*"
  timeout 600 python3 benchmarks/hf_decode_gpu.py --shape qwen2.5-7b --batch 64 256 --skip-generate --repeats 3 \
    --decode-only --modes "$@" > "$O/$out.txt" 2>&1
  grep -E "tok/s|x[0-9]" "$O/$out.txt" | cut -c1-190
}

plan15() {  # issue 31: the FP8 step's GEMM (cuBLASLt unit / vLLM's CUTLASS), LM head, e4m3 KV cache, decode-only tokens/s
  begin "$1"
  local vs="python3 benchmarks/vs_trl_gpu.py --run-timeout 300 --shape smollm2 --out $O/vs_smol"
  wait_for /tmp/site/.smol_ok || mark "no SmolLM2"
  step_7b step_7b fused_c fp8_c fp8_c_head fp8_c_head_kv8 fused_c_kv8
  engine_7b decode_7b "static all" "static fp8 all" "static fp8+head all" "static fp8+head all kv8" "static all kv8"
  wait_for /tmp/kit/vllm_ok || mark "no vLLM"
  mark "FP8 GEMMs alone with vLLM's CUTLASS kernel; the step and the engine on it"
  timeout 200 python3 benchmarks/fp8_gemm_gpu.py --shape qwen2.5-7b --rows 64 256 > $O/gemm_7b.txt 2>&1
  grep "all projections" $O/gemm_7b.txt | cut -c1-220
  step_7b step_7b_cutlass fused_c fp8_c_cutlass fp8_c_cutlass_head fp8_c_cutlass_head_kv8
  engine_7b decode_7b_cutlass "static all" "static fp8+head all cutlass" "static fp8+head all cutlass kv8"
  gpu_test_files tests/test_fp8_gpu.py tests/test_engines_hf_attention.py tests/test_engines_hf_fused.py \
    tests/test_engines_hf_elementwise.py tests/test_engines_hf_silu_quant.py tests/test_engines_hf_static.py
  mark "SmolLM2: ours bf16 and FP8 rollout (token_tis), seeds 0 and 1"
  $vs --runs ours_px_pc_nc:0 ours_px_pc_nc_fp8:0 ours_px_pc_nc:1 ours_px_pc_nc_fp8:1 > $O/vs_smol_fp8.txt 2>&1
  python3 benchmarks/vs_trl_gpu.py --report $O/vs_smol > $O/report_smol.txt 2>&1; head -n 40 $O/report_smol.txt
  mark "FP8 / bf16 tokens/s (and decode only), qwen2.5-7b, chatgym's vLLM engine: weights, weights + KV cache"
  timeout 600 python3 benchmarks/hf_decode_gpu.py --shape qwen2.5-7b --batch 64 256 --repeats 3 --decode-only \
    --vllm-variants 'bf16={}' 'fp8={"quantization": "fp8"}' 'fp8kv={"quantization": "fp8", "kv_cache_dtype": "fp8"}' \
    --vllm-ratios fp8kv/bf16 > $O/fp8_vllm_qwen2.5-7b.txt 2>&1
  grep -E "tok/s|x[0-9]" $O/fp8_vllm_qwen2.5-7b.txt | grep -v timeline | cut -c1-190
  gpu_test_files tests/test_engines_vllm_gpu.py
  mark "done"
}

plan18() {  # plan15 without vLLM (a short lease: no vLLM kit carried), the target first: the hf engine's FP8 tokens/s at 7B, then its step, then its tests
  begin "$1"
  wait_for /tmp/site/.smol_ok || mark "no SmolLM2"
  engine_7b decode_7b "static all" "static fp8+head all" "static fp8+head all kv8"
  step_7b step_7b fused_c fp8_c_head fp8_c_head_kv8 fused_c_kv8
  gpu_test_files tests/test_fp8_gpu.py tests/test_engines_hf_attention.py tests/test_engines_hf_static.py \
    tests/test_engines_hf_fused.py
  engine_7b decode_7b_more "static all" "static fp8 all" "static all kv8"
  mark "done"
}

plan19() {  # the shortest lease, the target first: bf16 / FP8 + e4m3 cache tokens/s at 7B, the step, two test files
  begin "$1"
  wait_for /tmp/site/.smol_ok || mark "no SmolLM2"
  engine_7b decode_7b "static all" "static fp8+head all kv8"
  step_7b step_7b fused_c fp8_c_head_kv8 fp8_c_head
  gpu_test_files tests/test_fp8_gpu.py tests/test_engines_hf_attention.py
  engine_7b decode_7b_more "static fp8+head all" "static all kv8"
  mark "done"
}

plan20() {  # the shortest lease after the sampler's split and the attention kernel's RoPE/scales: the target, the step, the changed kernels' tests, the GEMMs autotuned
  begin "$1"
  wait_for /tmp/site/.smol_ok || mark "no SmolLM2"
  engine_7b decode_7b "static all" "static fp8+head all kv8"
  step_7b step_7b fused_c fp8_c_head_kv8
  gpu_test_files tests/test_engines_hf_attention.py tests/test_engines_hf_draw.py tests/test_fp8_gpu.py \
    tests/test_engines_hf_fused.py tests/test_engines_hf_static.py
  engine_7b decode_7b_more "static fp8+head all" "static all kv8"
  mark "FP8 GEMMs alone: cuBLASLt, and Inductor's max-autotune templates for the row-wise product"
  timeout 420 python3 benchmarks/fp8_gemm_gpu.py --shape qwen2.5-7b --rows 64 256 --autotune > $O/gemm_7b.txt 2>&1
  grep "rows" $O/gemm_7b.txt | cut -c1-220
  mark "done"
}

plan21() {  # the attention kernel's launches measured, the target with the best of them and with the default, the step, the changed kernels' GPU tests
  begin "$1"
  wait_for /tmp/site/.smol_ok || mark "no SmolLM2"
  mark "the decode attention kernel's launches, qwen2.5-7b, positions 145-248"
  timeout 300 python3 benchmarks/attention_gpu.py --shape qwen2.5-7b --rows 64 256 --write $O/attention_config \
    > $O/attention_7b.txt 2>&1
  grep -a "best\|CHATGYM\|Error" $O/attention_7b.txt | cut -c1-200
  export CHATGYM_DECODE_ATTENTION_CONFIG; CHATGYM_DECODE_ATTENTION_CONFIG=$(cat $O/attention_config 2>/dev/null)
  engine_7b decode_7b_tuned "static all" "static fp8+head all kv8"
  step_7b step_7b_tuned fused_c fp8_c_head_kv8
  unset CHATGYM_DECODE_ATTENTION_CONFIG
  engine_7b decode_7b "static all" "static fp8+head all kv8"
  gpu_test_files tests/test_engines_hf_silu_quant.py tests/test_engines_hf_attention.py tests/test_fp8_gpu.py
  mark "done"
}

plan22() {  # e4m3 cache attended in fp16 products; the unit GEMM with fast accumulation (unit_fast): the target with each, the step, the tests
  begin "$1"
  wait_for /tmp/site/.smol_ok || mark "no SmolLM2"
  engine_7b decode_7b "static all" "static fp8+head all kv8"
  export CHATGYM_FP8_GEMM=unit_fast
  engine_7b decode_7b_fast "static all" "static fp8+head all kv8"
  step_7b step_7b_fast fused_c fp8_c_head_kv8
  unset CHATGYM_FP8_GEMM
  step_7b step_7b fp8_c_head_kv8
  gpu_test_files tests/test_fp8_gpu.py tests/test_engines_hf_attention.py
  (cd /tmp/t && timeout 120 python3 -m pytest -q -s -p no:cacheprovider -m gpu tests/test_fp8_gpu.py -k "fast_accumulation" \
    2>&1 | grep -a "error\|passed\|failed")
  mark "done"
}

plan23() {  # the MLP's quantization with approximate divisions: the target, the step, its GPU tests
  begin "$1"
  wait_for /tmp/site/.smol_ok || mark "no SmolLM2"
  engine_7b decode_7b "static all" "static fp8+head all kv8"
  step_7b step_7b fused_c fp8_c_head_kv8
  gpu_test_files tests/test_engines_hf_silu_quant.py
  mark "done"
}

plan24() {  # one kernel for the row quantization with its add and norm, the sampler's lanes apart: tests, target, step, GEMMs
  begin "$1"
  wait_for /tmp/site/.smol_ok || mark "no SmolLM2"
  gpu_test_files tests/test_engines_hf_norm_quant.py tests/test_engines_hf_draw.py
  engine_7b decode_7b "static all" "static fp8+head all kv8"
  step_7b step_7b fused_c fp8_c_head_kv8
  gpu_test_files tests/test_fp8_gpu.py tests/test_engines_hf_fused.py tests/test_engines_hf_static.py \
    tests/test_engines_hf_attention.py tests/test_engines_hf_silu_quant.py
  mark "FP8 GEMMs alone: cuBLASLt either way round"
  timeout 200 python3 benchmarks/fp8_gemm_gpu.py --shape qwen2.5-7b --rows 256 64 > $O/gemm_7b.txt 2>&1
  grep "rows" $O/gemm_7b.txt | cut -c1-260
  mark "FP8 GEMMs: Inductor's max-autotune unit product"
  timeout 400 python3 benchmarks/fp8_gemm_gpu.py --shape qwen2.5-7b --rows 256 --autotune > $O/gemm_7b_autotune.txt 2>&1
  grep "^rows" $O/gemm_7b_autotune.txt | cut -c1-260
  mark "done"
}

plan25() {  # the MLP's quantization in one pass, the sampler's fast log2: tests, the target twice, with unit_fast, the step
  begin "$1"
  wait_for /tmp/site/.smol_ok || mark "no SmolLM2"
  gpu_test_files tests/test_engines_hf_silu_quant.py tests/test_engines_hf_norm_quant.py tests/test_engines_hf_draw.py
  engine_7b decode_7b "static all" "static fp8+head all kv8"
  step_7b step_7b fused_c fp8_c_head_kv8
  export CHATGYM_FP8_GEMM=unit_fast
  engine_7b decode_7b_fast "static all" "static fp8+head all kv8"
  unset CHATGYM_FP8_GEMM
  gpu_test_files tests/test_fp8_gpu.py tests/test_engines_hf_fused.py tests/test_engines_hf_static.py
  engine_7b decode_7b_again "static all" "static fp8+head all kv8"
  mark "done"
}

plan26() {  # the e4m3 cache's values read a block ahead: the kernel's GPU tests, both forms' launches, the target (default, tuned), the step; plan25's untested changes
  begin "$1"
  wait_for /tmp/site/.smol_ok || mark "no SmolLM2"
  gpu_test_files tests/test_engines_hf_attention.py
  attention_sweep attention_7b "both forms" --write $O/attention_config
  engine_7b decode_7b "static all" "static fp8+head all kv8"
  export CHATGYM_DECODE_ATTENTION_CONFIG; CHATGYM_DECODE_ATTENTION_CONFIG=$(cat $O/attention_config 2>/dev/null)
  engine_7b decode_7b_tuned "static all" "static fp8+head all kv8"
  step_7b step_7b_tuned fused_c fp8_c_head_kv8
  unset CHATGYM_DECODE_ATTENTION_CONFIG
  step_7b step_7b fused_c fp8_c_head_kv8
  gpu_test_files tests/test_engines_hf_silu_quant.py tests/test_engines_hf_norm_quant.py tests/test_engines_hf_draw.py
  engine_7b decode_7b_again "static all" "static fp8+head all kv8"
  gpu_test_files tests/test_fp8_gpu.py tests/test_engines_hf_fused.py tests/test_engines_hf_static.py
  mark "done"
}

plan27() {  # where the engine's decode time goes at 256 rows (device idle, kernels outside the step), multi_step 4
  begin "$1"
  wait_for /tmp/site/.smol_ok || mark "no SmolLM2"
  mark "the engine's decode on the device, qwen2.5-7b, 256 rows: bf16, FP8 + e4m3 cache"
  timeout 400 python3 benchmarks/engine_gaps_gpu.py --shape qwen2.5-7b --rows 256 \
    --modes "static all" "static fp8+head all kv8" > $O/gaps_7b.txt 2>&1
  grep -a "rows\|window\|Error" $O/gaps_7b.txt | cut -c1-220
  engine_7b decode_7b_ms4 "static all ms4" "static fp8+head all ms4 kv8"
  engine_7b decode_7b "static all" "static fp8+head all kv8"
  mark "the same, FP8, with the host's ops"
  timeout 300 python3 benchmarks/engine_gaps_gpu.py --shape qwen2.5-7b --rows 256 --host \
    --modes "static fp8+head all kv8" > $O/gaps_7b_host.txt 2>&1
  grep -a "rows\|window\|Error" $O/gaps_7b_host.txt | cut -c1-220
  mark "done"
}

plan28() {  # vLLM's CUTLASS FP8 GEMM (its GPU tests, the GEMMs alone, the step, the engine) beside cuBLASLt's unit GEMM
  begin "$1"
  wait_for /tmp/site/.smol_ok || mark "no SmolLM2"
  wait_for /tmp/kit/vllm_ok || wait_for /tmp/kit/vllm_ok || mark "no vLLM"
  gpu_test_files tests/test_fp8_gpu.py
  mark "FP8 GEMMs alone: cuBLASLt unit and vLLM's CUTLASS"
  timeout 200 python3 benchmarks/fp8_gemm_gpu.py --shape qwen2.5-7b --rows 256 64 > $O/gemm_7b.txt 2>&1
  grep "rows" $O/gemm_7b.txt | cut -c1-260
  engine_7b decode_7b_cutlass "static all" "static fp8+head all cutlass kv8" "static fp8+head all kv8"
  step_7b step_7b_cutlass fused_c fp8_c_cutlass_head_kv8 fp8_c_head_kv8
  gpu_test_files tests/test_engines_hf_attention.py
  mark "done"
}

# plan29 ran on 7e990b2, where CHATGYM_PAIRS=0 chose the byte form (gone since: the pairs form is the only one).
plan29() {  # the e4m3 cache's values read as 16-bit pairs (ldmatrix.trans): GPU tests, launches of both forms, the target (default, tuned, bytes), the step
  begin "$1"
  wait_for /tmp/site/.smol_ok || mark "no SmolLM2"
  gpu_test_files tests/test_engines_hf_attention.py
  attention_sweep attention_7b "values as pairs" --write $O/attention_config
  engine_7b decode_7b "static all" "static fp8+head all kv8"
  CHATGYM_PAIRS=0 attention_sweep attention_7b_bytes "values as bytes (the form before)"
  export CHATGYM_DECODE_ATTENTION_CONFIG; CHATGYM_DECODE_ATTENTION_CONFIG=$(cat $O/attention_config 2>/dev/null)
  engine_7b decode_7b_tuned "static all" "static fp8+head all kv8"
  unset CHATGYM_DECODE_ATTENTION_CONFIG
  step_7b step_7b fused_c fp8_c_head_kv8
  export CHATGYM_PAIRS=0
  engine_7b decode_7b_bytes "static all" "static fp8+head all kv8"
  unset CHATGYM_PAIRS
  engine_7b decode_7b_again "static all" "static fp8+head all kv8"
  gpu_test_files tests/test_fp8_gpu.py tests/test_engines_hf_fused.py tests/test_engines_hf_static.py
  mark "done"
}

plan30() {  # the e4m3 values as pairs, kept: decode tokens/s with the modes interleaved round by round, the engine's steps on the device, its GPU tests, the step
  begin "$1"
  wait_for /tmp/site/.smol_ok || mark "no SmolLM2"
  interleaved_7b decode_7b_interleaved
  mark "the engine's decode steps on the device, qwen2.5-7b, 256 and 64 rows"
  timeout 400 python3 benchmarks/engine_gaps_gpu.py --shape qwen2.5-7b --rows 256 64 \
    --modes "static all" "static fp8+head all kv8" > $O/gaps_7b.txt 2>&1
  grep -a "rows\|window\|Error" $O/gaps_7b.txt | cut -c1-220
  gpu_test_files tests/test_engines_hf_attention.py
  engine_7b decode_7b "static all" "static fp8+head all kv8"
  step_7b step_7b fused_c fp8_c_head_kv8
  interleaved_7b decode_7b_interleaved2
  mark "done"
}

plan34() {  # the target at 256 rows again (an H200 where one comes): decode tokens/s, bf16 and FP8 interleaved, 9 rounds; the engine's steps (~3 min)
  begin "$1"
  wait_for /tmp/site/.smol_ok || mark "no SmolLM2"
  mark "engine decode tokens/s, qwen2.5-7b, 256 rows, bf16 and FP8 interleaved round by round, 9 rounds"
  timeout 300 python3 benchmarks/hf_decode_gpu.py --shape qwen2.5-7b --batch 256 --skip-generate --repeats 9 \
    --decode-only --interleave --modes "static all" "static fp8+head all kv8" > $O/decode_7b_256.txt 2>&1
  grep -E "x[0-9]|rounds|Error" $O/decode_7b_256.txt | cut -c1-190
  ROWS=256 gaps_7b gaps_7b "static all" "static fp8+head all kv8"
  mark "done"
}

gaps_7b() {  # the engine's decode steps 65-127 on the device (engine_gaps_gpu.py), $ROWS (256 and 64) rows, each mode given, into $O/$1.txt
  local out=$1; shift
  mark "the engine's decode steps on the device, qwen2.5-7b, ${ROWS:-256 64} rows: $* (CHATGYM_FP8_GEMM=${CHATGYM_FP8_GEMM:-})"
  # shellcheck disable=SC2086  # ROWS: one or more row counts
  timeout 400 python3 benchmarks/engine_gaps_gpu.py --shape qwen2.5-7b --rows ${ROWS:-256 64} --modes "$@" > "$O/$out.txt" 2>&1
  grep -a "rows\|window\|Error" "$O/$out.txt" | cut -c1-220
}

interleaved_7b() {  # bf16 and FP8 + LM head + e4m3 cache decode tokens/s at 7B, round by round, 9 rounds, into $O/$1.txt
  mark "engine decode tokens/s, qwen2.5-7b, bf16 and FP8 interleaved round by round, 9 rounds"
  timeout 500 python3 benchmarks/hf_decode_gpu.py --shape qwen2.5-7b --batch 256 64 --skip-generate --repeats 9 \
    --decode-only --interleave --modes "static all" "static fp8+head all kv8" > "$O/$1.txt" 2>&1
  grep -E "x[0-9]|rounds|Error" "$O/$1.txt" | cut -c1-190
}

decode_shape() {  # tokens/s at $1: the hf engine, chatgym's vLLM engine and vLLM's own LLM.generate
  mark "tokens/s, $1: the hf engine, chatgym's vLLM engine and vLLM's own LLM.generate"
  timeout 360 python3 benchmarks/hf_decode_gpu.py --shape "$1" --vllm --batch 64 256 --skip-generate \
    --repeats 5 --modes "static all" > "$O/decode_vllm_$1.txt" 2>&1
  grep -E "tok/s|LLM.generate|timeline" "$O/decode_vllm_$1.txt" | cut -c1-170
}

gpu_test_files() {  # the -m gpu tests of each file named, one process a file
  mark "GPU tests: $*"
  for f in "$@"; do
    (cd /tmp/t && timeout 240 python3 -m pytest -q -p no:cacheprovider -m gpu "$f" > "$O/gpu_$(basename "$f" .py).txt" 2>&1)
    echo "$f rc=$? $(tail -n 1 "$O/gpu_$(basename "$f" .py).txt")"
  done
}

poll() {
  sleep "${1:-0}"
  tail -n 40 $O/plan.log | cut -c1-200
  tar -czf "$OUT/runs.tgz" -C /tmp runs && ls -la "$OUT"
}

"$@"
