# Allocate 50 MiB blocks (touched, so they are real) until the memory limit stops it. Expected: oom.
blocks = []
while True:
    blocks.append(b"x" * (50 << 20))
