"""``scripts/setup.sh``'s re-run check: the venv's ``chatgym.trainer`` must be this checkout's. An editable
install made from another clone maps ``chatgym.trainer`` to that clone, and a clone reusing such a venv ran
the other clone's code silently (a fresh-user walk's finding)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def venv_check() -> str:
    """The Python code setup.sh runs to decide that the venv's chatgym is this checkout's."""
    script = (ROOT / "scripts" / "setup.sh").read_text()
    match = re.search(r'\.venv/bin/python -c "(import os, sys, chatgym\.trainer.*?)" 2>/dev/null; then', script, re.S)
    assert match, "setup.sh's re-run check not found"
    return match.group(1)


def test_the_check_accepts_this_checkout_and_refuses_another(tmp_path):
    code = venv_check()
    here = subprocess.run([sys.executable, "-c", code], cwd=ROOT)
    (tmp_path / "trainer").mkdir()
    (tmp_path / "chatgym").mkdir()  # a clone's root: its own chatgym/ and trainer/, chatgym.trainer mapped elsewhere
    (tmp_path / "chatgym" / "__init__.py").write_text("")
    other = subprocess.run([sys.executable, "-c", code], cwd=tmp_path)
    assert (here.returncode, other.returncode) == (0, 1)
