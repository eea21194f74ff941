# Read files outside the work dir: paths on stdin (a secret in the home dir, one in the checkout).
# Expected: every read fails (absent, or permission denied); no secret text in the output.
import json
import sys

for path in json.loads(sys.stdin.read()):
    try:
        with open(path) as f:
            print(path, "READ", repr(f.read(100)))
    except OSError as e:
        print(path, type(e).__name__)
