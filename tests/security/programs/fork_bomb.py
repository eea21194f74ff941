# Fork without end; every process keeps forking. Expected: the run times out and no process is left.
import os

while True:
    try:
        os.fork()
    except OSError:
        pass
