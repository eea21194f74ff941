# Fill /tmp with 16 MiB files until something stops it. Expected: ENOSPC (the private /tmp is full),
# then the size of that /tmp in MiB (the sandbox's tmpfs, not the host's /tmp).
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
    st = os.statvfs("/tmp")
    print(errno.errorcode[e.errno], st.f_blocks * st.f_frsize >> 20)
