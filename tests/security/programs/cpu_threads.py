# Sixteen threads burning CPU at once. Expected: timeout (wall or CPU limit), nothing left running.
import threading


def burn():
    while True:
        pass


for _ in range(16):
    threading.Thread(target=burn, daemon=False).start()
