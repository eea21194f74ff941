# Signal the parent, PID 1, the host test process (pid on stdin) and "every process" (-1).
# Expected: each targeted kill is refused (EPERM) or finds no such process (ESRCH); the run and the
# host go on.
import os
import signal
import sys

host_pid = int(sys.stdin.read())
for name, pid in (("parent", os.getppid()), ("init", 1), ("host", host_pid)):
    try:
        os.kill(pid, signal.SIGKILL)
        print(name, "KILLED")
    except OSError as e:
        print(name, type(e).__name__)
os.kill(-1, signal.SIGKILL)  # reaches only this run's own uid (never the caller itself)
print("alive")
