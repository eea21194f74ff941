"""Fixtures shared by test modules (``tiny_model``; the session's ``docker_engine``; ``interpreted``: the Triton
kernel tests' process, :mod:`triton_helpers`), and a time limit per GPU
test: every ``gpu``-marked test without its own ``timeout`` mark gets ``timeout(300, method="thread")``
(pytest-timeout, the ``dev`` extra): a hang fails that test and dumps every thread's stack instead
of blocking the session.

``docker_engine`` gives the Docker tests a real engine and the offline image, through
``chatgym.sandboxes.docker.engine.provide``:

* ``DOCKER_HOST`` set: that engine is used as it is (never stopped here); the image is built on it.
* otherwise, as root with ``dockerd`` installed (``scripts/setup.sh`` installs Debian's ``docker.io``):
  a private daemon is started for this test session in ``$CHATGYM_CACHE/docker/test-<pid>`` (its
  own socket; no bridge, iptables or IP forwarding), only when a test asks for it, and stopped by
  its PID at the end of the session, whatever happened (it also gets SIGTERM if pytest itself
  dies); its directory is removed, and the teardown fails if any of its processes or mounts is left.
* otherwise the Docker tests skip, with the reason.

While the fixture is up, ``DOCKER_HOST`` and ``CHATGYM_DOCKER_IMAGE`` are set in ``os.environ`` (child
processes such as ``chatgym serve-sandbox --backend docker`` see them) and restored after.
"""

from __future__ import annotations

import os

import pytest
from hypothesis import settings

GPU_TEST_TIMEOUT_S = 300

# Property tests (hypothesis, the dev extra) draw the same examples every run unless
# HYPOTHESIS_PROFILE=explore: a bug they find fails every run and gets a regression test, rather than
# failing one CI run in N (a random draw found '0/-1' in one rehearsal: tests/test_math_answers.py).
settings.register_profile("fixed", derandomize=True)
settings.register_profile("explore", derandomize=False)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "fixed"))


def pytest_configure(config):
    if not config.pluginmanager.hasplugin("timeout"):  # without pytest-timeout the mark is inert
        config.addinivalue_line("markers", "timeout(seconds, method): pytest-timeout's limit (not installed)")


def pytest_collection_modifyitems(config, items):
    for item in items:
        if item.get_closest_marker("gpu") is not None and item.get_closest_marker("timeout") is None:
            item.add_marker(pytest.mark.timeout(GPU_TEST_TIMEOUT_S, method="thread"))


@pytest.fixture
def interpreted():
    """Skip unless this pytest process runs Triton in its interpreter (:func:`triton_helpers.run_interpreted`
    starts one for a file's tests named "interpreted")."""
    from triton_helpers import INTERPRETED

    if not INTERPRETED:
        pytest.skip("not skipped, moved: run in Triton's interpreter by this file's "
                    "test_the_kernel_tests_pass_in_tritons_interpreter (one process of its own)")


@pytest.fixture(scope="session")
def docker_engine():
    """``chatgym.sandboxes.docker.engine.Engine`` (``host``, ``image``, ``daemon``), or a skip."""
    try:
        import docker
    except ImportError:
        pytest.skip("no Docker engine: the docker SDK is not installed (pip install 'chatgym[docker]')")
    from chatgym.sandboxes.docker.engine import provide

    manager = provide("test")
    try:
        engine = manager.__enter__()
    except (RuntimeError, docker.errors.DockerException) as e:
        pytest.skip(f"no Docker engine: {e}")
    try:
        yield engine
    finally:
        manager.__exit__(None, None, None)


@pytest.fixture(scope="module")
def tiny_model():
    """A random model of SmolLM2's architecture at ``train_helpers.TINY_LLAMA``'s size (seed 0, train
    mode), one per test module; skips where the packaged SmolLM2 (its config) is not installed."""
    from train_helpers import TINY_LLAMA

    from chatgym.trainer.models.packaged import load_model_path
    from chatgym.trainer.models.random_init import random_model

    try:
        load_model_path("smollm2")
    except ModuleNotFoundError as exc:
        pytest.skip(str(exc))
    return random_model("smollm2", seed=0, **TINY_LLAMA).train()
