"""A test file's Triton kernel tests, run on the CPU in Triton's interpreter.

Triton reads its interpreter switch (``TRITON_INTERPRET``) when it is imported (its own ``tl.max`` /
``tl.argmax`` are jit functions), and other tests import it first: so a file's kernel tests (names
holding "interpreted", taking conftest's ``interpreted`` fixture, which skips them elsewhere) run in a
pytest process of their own, started with the switch on by the file's :func:`run_interpreted` test.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"


def run_interpreted(test_file: str, expected: int) -> None:
    """Run ``test_file``'s interpreted tests in a pytest process with the switch on; exactly ``expected``
    of them must pass (none skipped)."""
    pytest.importorskip("triton")
    if INTERPRETED:
        pytest.skip("this is that process")
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "not gpu",
                          "-k", "interpreted", test_file], env=env, capture_output=True, text=True,
                         timeout=600, cwd=os.path.dirname(test_file))
    summary = out.stdout.strip().splitlines()[-1] if out.stdout.strip() else ""
    assert out.returncode == 0 and re.match(r"\d+ passed", summary), out.stdout[-3000:] + out.stderr[-2000:]
    assert summary.startswith(f"{expected} passed"), summary
