# Write one 1 GiB file. Expected: the file-size limit stops it (EFBIG, errno 27) long before.
import errno

chunk = b"\0" * (1 << 20)
written = 0
try:
    with open("huge.bin", "wb") as f:
        for _ in range(1024):
            f.write(chunk)
            f.flush()
            written += 1
except OSError as e:
    print(errno.errorcode[e.errno], written)
