# Spin forever. Expected: timeout at the wall-clock limit.
while True:
    pass
