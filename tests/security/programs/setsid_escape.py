# Double fork + setsid: a grandchild in its own session (out of the run's process group), with its
# stdout/stderr closed, that sleeps long; the run itself then outlives its timeout.
# Expected: timeout, and no process of the run is left afterwards (the escaped one included).
import os
import time

if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        os.close(1)
        os.close(2)
        time.sleep(300)
    os._exit(0)
os.wait()
print("escaped", flush=True)
time.sleep(300)
