# Dump the environment. Expected: only the sandbox's allowlisted variables, no host secret.
import json
import os

print(json.dumps(dict(os.environ)))
