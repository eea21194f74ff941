# Fill /tmp with 16 MiB files until something stops it. Expected: ENOSPC (the private /tmp is full).
import errno
import os

chunk = b"\0" * (16 << 20)
n = 0
try:
    while n < 4096:
        with open(os.path.join("/tmp", f"fill{n}"), "wb") as f:
            f.write(chunk)
        n += 1
except OSError as e:
    print(errno.errorcode[e.errno])
