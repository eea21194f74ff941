"""Session fixtures shared by test modules. Docker only: ``docker_engine``.

``docker_engine`` gives the Docker tests a real engine and the offline image
(``chatgym.sandboxes.docker_engine``):

* ``DOCKER_HOST`` set: that engine is used as it is (never stopped here); the image is built on it.
* otherwise, as root with ``dockerd`` installed (``scripts/setup.sh`` installs Debian's ``docker.io``):
  a private daemon is started for this test session in ``$CHATGYM_CACHE/docker/test-<pid>`` (its
  own socket; no bridge, iptables or IP forwarding), started only when a test asks for it, and
  stopped by its PID at the end of the session, whatever happened (it also gets SIGTERM if pytest
  itself dies); its directory is removed and the teardown fails if any of its processes or mounts is
  left.
* otherwise the Docker tests skip, with the reason.

While the fixture is up, ``DOCKER_HOST`` and ``CHATGYM_DOCKER_IMAGE`` are set in ``os.environ`` (child
processes such as ``chatgym serve-sandbox --backend docker`` see them) and restored after.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import pytest


@dataclass
class DockerEngine:
    host: str  # DOCKER_HOST
    image: str  # the offline Python image's tag
    private: bool  # started by this session


def _skip(why: str):
    pytest.skip(f"no Docker engine: {why}")


@pytest.fixture(scope="session")
def docker_engine():
    try:
        import docker
    except ImportError:
        _skip("the docker SDK is not installed (pip install 'chatgym[docker]')")
    from chatgym.sandboxes import docker_engine as de

    saved = {k: os.environ.get(k) for k in ("DOCKER_HOST", "CHATGYM_DOCKER_IMAGE")}
    daemon = None
    if saved["DOCKER_HOST"]:
        host = saved["DOCKER_HOST"]
    else:
        if why := de.why_no_daemon():
            _skip(why)
        root = de.cache_dir() / f"test-{os.getpid()}"
        try:
            daemon = de.start_daemon(root, die_with_parent=True)
        except RuntimeError as e:
            de.stop_daemon(root, remove=True)
            _skip(str(e))
        host = daemon.host
    try:
        client = docker.DockerClient(base_url=host)
        try:
            client.ping()
            image = de.build_image(client)
        finally:
            client.close()
        os.environ["DOCKER_HOST"], os.environ["CHATGYM_DOCKER_IMAGE"] = host, image
        yield DockerEngine(host, image, daemon is not None)
    except docker.errors.DockerException as e:
        _skip(f"{host}: {e}")
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        if daemon is not None:
            found = de.stop_daemon(daemon.root, remove=True)
            left = de.leftovers(daemon.root)
            assert left == {"processes": [], "mounts": []} and not daemon.root.exists(), (
                f"the private dockerd left {left} (cleaned after it exited: {found})"
            )
