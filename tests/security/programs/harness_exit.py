# A solution that leaves before the tests with a success exit code. Expected: no pass.
import os

os._exit(0)


def add(a, b):
    return a + b
