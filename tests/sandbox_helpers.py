"""Checks shared by the local and bwrap sandbox tests: each run's and each session's own /tmp, and
output cut on a character boundary. Real processes; the host-side paths are read through the
zygote's ``/proc/<pid>/root`` (its private /tmp is invisible otherwise)."""

from __future__ import annotations

import asyncio
import json
import os
import time

# Writes /tmp/shared_name.txt exclusively ('x': fails if another run's file were there), holds it
# long enough for the other run to do the same, reads it back and lists /tmp.
WRITE_TMP = """
import json, os, time
open("/tmp/shared_name.txt", "x").write({tag!r})
start = time.time()
time.sleep(1.0)
print(json.dumps([open("/tmp/shared_name.txt").read(), sorted(os.listdir("/tmp")),
                  os.listdir("/tmp/.chatgym-work") == [os.path.basename(os.getcwd())], start, time.time()]))
"""
EURO = "import sys; n = sys.stdout.write('€' * 30000)"  # 90,000 bytes (n: a session echoes nothing)
INVALID = "import sys; sys.stdout.buffer.write(b'a\\xffb'); sys.stdout.flush()"


def zygote_host_pid(sandbox) -> int:
    """The zygote's pid as this process sees it (under bwrap it is pid 2 of its own PID namespace)."""
    info = sandbox.isolation
    launcher = sandbox._client._proc.pid
    if info.get("bwrap") is not True:
        return info["pid"]
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/status") as f:
                fields = dict(line.split(":\t", 1) for line in f.read().splitlines() if ":\t" in line)
        except OSError:
            continue
        nspid = fields.get("NSpid", "").split()
        if nspid[-1:] == [str(info["pid"])] and len(nspid) > 1 and launcher in ancestors(int(name)):
            return int(name)
    raise AssertionError("the zygote process was not found")


def ancestors(pid: int) -> list[int]:
    out = []
    while pid > 1:
        try:
            with open(f"/proc/{pid}/stat") as f:
                pid = int(f.read().rsplit(")", 1)[1].split()[1])
        except OSError:
            break
        out.append(pid)
    return out


async def check_concurrent_runs_have_their_own_tmp(sandbox) -> None:
    """Two one-shot runs at once write the same /tmp name; each reads its own back; afterwards the
    file is nowhere in the zygote's /tmp, where the runs' scratch dirs lived."""
    a, b = await asyncio.gather(
        sandbox.run(WRITE_TMP.format(tag="A")), sandbox.run(WRITE_TMP.format(tag="B"))
    )
    assert (a.status, b.status) == ("ok", "ok"), (a.stderr, b.stderr)
    (ta, la, own_a, sa, ea), (tb, lb, own_b, sb_, eb) = json.loads(a.stdout), json.loads(b.stdout)
    assert (ta, tb) == ("A", "B")
    # Only its own file and the work base (holding only its own work dir) in each run's /tmp.
    assert la == lb == [".chatgym-work", "shared_name.txt"] and own_a and own_b
    assert max(sa, sb_) < min(ea, eb), "the two runs did not overlap"
    work = f"/proc/{zygote_host_pid(sandbox)}/root/tmp/.chatgym-work"
    deadline = time.monotonic() + 3  # the zygote removes a run's dirs right after its reply
    while (left := files_named(work, "shared_name.txt")) and time.monotonic() < deadline:
        await asyncio.sleep(0.02)
    assert left == []


def files_named(top: str, name: str) -> list[str]:
    return [os.path.join(d, name) for d, _, files in os.walk(top) if name in files]


async def check_concurrent_sessions_have_their_own_tmp(sandbox) -> None:
    """Two sessions open at once write the same /tmp name; each reads its own back; after close,
    the file is gone from where it lived (the session's scratch dir in the zygote's /tmp)."""
    s1, s2 = await sandbox.open_session(), await sandbox.open_session()
    try:
        write = "open('/tmp/shared_name.txt', 'x').write({!r})"
        r1, r2 = await s1.run(write.format("one")), await s2.run(write.format("two"))
        assert (r1.status, r2.status) == ("ok", "ok"), (r1.stderr, r2.stderr)
        read = "open('/tmp/shared_name.txt').read()"
        assert ((await s1.run(read)).stdout, (await s2.run(read)).stdout) == ("'one'\n", "'two'\n")
        work = f"/proc/{zygote_host_pid(sandbox)}/root/tmp/.chatgym-work"
        lived = f"{work}/s{s1._sid}.scratch/tmp/shared_name.txt"
        with open(lived) as f:
            assert f.read() == "one"
    finally:
        await s1.close()
    assert not os.path.exists(lived)
    assert not os.path.exists(f"{work}/s{s1._sid}.scratch") and not os.path.exists(f"{work}/s{s1._sid}")
    assert (await s2.run(read)).stdout == "'two'\n"  # the other session's /tmp is untouched
    await s2.close()


async def check_output_cut_on_a_character_boundary(sandbox) -> None:
    """``sandbox`` has the default 64 KiB cap. 90,000 bytes of '€' (3 bytes each): the first 65,536
    bytes hold 21,845 whole '€' (65,535 bytes) and one byte of the next: that one is dropped."""
    assert sandbox.max_output_bytes == 65536
    for res in (await sandbox.run(EURO), await run_in_session(sandbox, EURO)):
        assert (res.status, res.truncated, res.info["stdout_bytes"]) == ("ok", True, 90000), res
        assert len(res.stdout.encode()) == 65535 and res.stdout == "€" * 21845
    for res in (await sandbox.run(INVALID), await run_in_session(sandbox, INVALID)):
        assert (res.stdout, res.truncated) == ("a\ufffdb", False)  # the byte it did write: replaced


async def run_in_session(sandbox, code: str):
    session = await sandbox.open_session()
    try:
        return await session.run(code)
    finally:
        await session.close()
