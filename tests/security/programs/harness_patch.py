# A solution that patches the harness: exit functions become no-ops, AssertionError is replaced in
# builtins, and the answer is an object equal to everything. Expected: not_plain_data (no pass).
import builtins
import os
import sys

sys.exit = builtins.exit = builtins.quit = os._exit = lambda *a: None
builtins.AssertionError = type("NotAnError", (Exception,), {})


class Always:
    def __eq__(self, other):
        return True

    def __ne__(self, other):
        return False


def add(a, b):
    return Always()
