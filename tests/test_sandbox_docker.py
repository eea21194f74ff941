"""``DockerSandbox``. No Docker engine runs here, so the engine is a FAKE (``FakeDockerClient``): its
"containers" are temp dirs and ``exec_run`` runs the command as a real local process. What is real:
the runner program (limits, uid switch, output caps, status rules) and the pool logic; what the FAKE
cannot show: the container's own isolation (network none, cgroup caps), checked only as the
arguments the engine would get. The security suite runs on the real engine where one exists."""

import asyncio
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time

import pytest

from chatgym.sandboxes.container import REQUEST_PATH, DockerSandbox


class FakeContainer:
    """FAKE docker container: a temp dir standing for the container's root (the request file lands
    there); the runner's work dir is then a real dir in the host's /tmp, removed by the runner."""

    def __init__(self, kwargs: dict) -> None:
        self.kwargs = kwargs
        self.root = tempfile.mkdtemp(prefix="fake-container-")
        os.chmod(self.root, 0o1777)  # like a container's /tmp
        self.removed = False
        self.execs = 0

    def put_archive(self, path: str, data: bytes) -> bool:
        assert path == os.path.dirname(REQUEST_PATH)  # "/": the FAKE's root dir stands for it
        with tarfile.open(fileobj=__import__("io").BytesIO(data)) as tar:
            tar.extractall(self.root, filter="data")
        return True

    def exec_run(self, cmd, user=None, demux=False):
        assert demux and user == "0"
        self.execs += 1
        # An interpreter uid 65534 may run, as the image's python3 would be (this venv's is under /root).
        python = "/usr/bin/python3" if os.access("/usr/bin/python3", os.X_OK) else sys.executable
        local = [
            python if c == "python3" else c.replace(REQUEST_PATH, f"{self.root}{REQUEST_PATH}") for c in cmd
        ]
        r = subprocess.run(local, capture_output=True, timeout=120)
        return r.returncode, (r.stdout or None, r.stderr or None)

    def remove(self, force=False):
        self.removed = True
        shutil.rmtree(self.root, ignore_errors=True)


class FakeDockerClient:
    """FAKE of ``docker.DockerClient``: only ``containers.run`` (detached)."""

    def __init__(self) -> None:
        self.created: list[FakeContainer] = []
        self.containers = self

    def run(self, image, command, **kwargs):
        assert image == "python:3.11-slim" and command == ["sleep", "infinity"]
        c = FakeContainer(kwargs)
        self.created.append(c)
        return c


@pytest.fixture
async def fake():
    client = FakeDockerClient()
    sb = DockerSandbox(max_concurrency=2, pool_size=2, client=client, max_output_bytes=1000)
    await sb.start()
    yield sb, client
    await sb.close()


async def test_pool_and_container_arguments(fake):
    _, client = fake
    assert len(client.created) == 2  # warm pool started before any run
    kw = client.created[0].kwargs
    assert kw["network_mode"] == "none" and kw["mem_limit"] == kw["memswap_limit"] == "2048m"
    assert kw["pids_limit"] == 64 and kw["nano_cpus"] == 1_000_000_000 and kw["cap_drop"] == ["ALL"]
    assert kw["security_opt"] == ["no-new-privileges"] and kw["tmpfs"] == {"/tmp": "size=256m,mode=1777"}


async def test_each_run_gets_a_fresh_container(fake):
    sb, client = fake
    res = await sb.run("import os, sys; print(sys.stdin.read(), open('d/f').read(), os.getuid(), os.getcwd()[:18])",
                       stdin="in", files={"d/f": "file"})  # fmt: skip
    assert (res.status, res.stdout, res.exit_code) == ("ok", "in file 65534 /tmp/chatgym-work-\n", 0), (
        res.stderr
    )
    await sb.run("print(2)")
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and sum(not c.removed for c in client.created) != 2:
        await asyncio.sleep(0.05)
    used = [c for c in client.created if c.execs]
    assert len(used) == 2 and all(c.removed and c.execs == 1 for c in used)  # one run per container
    assert sum(not c.removed for c in client.created) == 2  # the pool was refilled


async def test_statuses_from_the_runner(fake):
    sb, _ = fake
    err, tmo, oom, big, bash = await asyncio.gather(
        sb.run("raise KeyError(1)"),
        sb.run("import time; time.sleep(30)", timeout_s=0.5),
        sb.run("x = bytearray(400 << 20)", memory_mb=100),
        sb.run("print('z' * 5000)"),
        sb.run("echo $((2 + 3)); exit 4", language="bash"),
    )
    assert err.status == "error" and err.stderr.endswith("KeyError: 1\n")
    assert tmo.status == "timeout" and 0.5 <= tmo.duration_s < 5
    assert oom.status == "oom"
    assert big.truncated and big.stdout == "z" * 1000 and big.info["stdout_bytes"] == 5001
    assert (bash.status, bash.stdout, bash.exit_code) == ("error", "5\n", 4)


async def test_runner_failure_is_internal():
    client = FakeDockerClient()
    sb = DockerSandbox(client=client, pool_size=0)
    original = FakeContainer.exec_run
    FakeContainer.exec_run = lambda self, cmd, user=None, demux=False: (1, (None, b"boom"))
    try:
        res = await sb.run("print(1)")
    finally:
        FakeContainer.exec_run = original
        await sb.close()
    assert res.status == "killed" and res.info["internal"] and "boom" in res.stderr


async def test_engine_failure_is_internal():
    client = FakeDockerClient()
    sb = DockerSandbox(client=client, pool_size=0, image="no-such-image")  # the FAKE refuses other images
    res = await sb.run("print(1)")
    assert res.status == "killed" and res.info["internal"] and "no container: AssertionError" in res.stderr


async def test_no_sessions():
    sb = DockerSandbox(client=FakeDockerClient(), pool_size=0)
    with pytest.raises(NotImplementedError):
        await sb.open_session()
