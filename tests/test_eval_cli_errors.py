"""`chatgym eval` refuses set-ups that would store an outage as a model's score."""

from __future__ import annotations

import errno
import os
import socket
import sqlite3

import pytest
from cli_refusals import (
    assert_chat_template_refusals,
    assert_engine_value_refusal,
    assert_fp8_refusals,
    assert_token_engine_refusals,
    refusal,
)

from chatgym.trainer.eval import cli as eval_cli


@pytest.fixture
def no_openai_env(monkeypatch):
    for name in ("OPENAI_BASE_URL", "OPENAI_API_KEY"):
        monkeypatch.delenv(name, raising=False)


def test_api_engine_needs_a_model_name(tmp_path, no_openai_env, capsys):
    # Regression: --engine openai without --model evaluated "smollm2" on api.openai.com.
    assert eval_cli.main(["--engine", "openai", "--env", "Math-v0", "--db", str(tmp_path / "r.sqlite")]) == 2
    assert capsys.readouterr().err == "chatgym eval: --engine openai needs --model (the served model's name)\n"


def test_openai_engine_needs_a_url_or_key(tmp_path, no_openai_env, capsys):
    argv = ["--engine", "openai", "--model", "m", "--env", "Math-v0", "--db", str(tmp_path / "r.sqlite")]
    assert eval_cli.main(argv) == 2
    assert capsys.readouterr().err == (
        "chatgym eval: --engine openai needs $OPENAI_BASE_URL (an OpenAI-compatible server) or $OPENAI_API_KEY "
        "(api.openai.com), or --engine-arg base_url=...\n"
    )
    assert not (tmp_path / "r.sqlite").exists()


def _unanswered() -> tuple[str, str]:
    """``(http://127.0.0.1:<a port nobody listens on>, the OS's words for a refused connection)``."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}", os.strerror(errno.ECONNREFUSED)


def _api(chat_status: int, models_status: int = 200):
    """A real HTTP server on a free port: ``GET /v1/models`` answers ``models_status``, ``POST
    /v1/chat/completions`` ``chat_status`` (an error not retried). Returns ``(server, base_url)``."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    class Api(BaseHTTPRequestHandler):
        def answer(self, status):
            body = b'{"data": []}' if status == 200 else b'{"error": "no"}'
            self.send_response(status)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self):
            self.answer(models_status if self.path == "/v1/models" else 404)

        def do_POST(self):
            self.rfile.read(int(self.headers.get("Content-Length", 0)))
            self.answer(chat_status)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Api)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}/v1"


def test_a_run_where_every_episode_failed_exits_1(tmp_path, no_openai_env, capsys):
    server, url = _api(chat_status=400)  # the API is up; every chat request is refused
    db = tmp_path / "r.sqlite"
    argv = ["--engine", "openai", "--model", "m", "--env", "Math-v0", "--max-tasks", "2", "--db", str(db),
            "--no-progress", "--engine-arg", f"base_url={url}", "--engine-arg", "retries=0"]  # fmt: skip
    try:
        assert eval_cli.main(argv) == 1
    finally:
        server.shutdown()
        server.server_close()
    assert "every episode failed" in capsys.readouterr().err
    with sqlite3.connect(db) as conn:  # stored as failures (visible, re-run with --retry-failed)
        assert conn.execute("SELECT COUNT(*), SUM(failed) FROM episodes").fetchone() == (2, 2)


def test_an_openai_api_that_does_not_answer_or_refuses_the_key_is_refused_at_start(tmp_path, no_openai_env, capsys,
                                                                                    monkeypatch):
    # Regression (noticed in stop 57): --engine openai with no server stored a failed episode per task.
    nobody, refused = _unanswered()
    nobody += "/v1"
    api = ("--engine", "openai", "--model", "m")
    assert eval_refusal(tmp_path, monkeypatch, capsys, *api, "--engine-arg", f"base_url={nobody}") == (
        f"chatgym eval: --engine-arg base_url: no server answers GET {nobody}/models ({refused})\n"
    )
    monkeypatch.setenv("OPENAI_BASE_URL", nobody)
    assert eval_refusal(tmp_path, monkeypatch, capsys, *api) == (
        f"chatgym eval: $OPENAI_BASE_URL: no server answers GET {nobody}/models ({refused})\n"
    )
    server, url = _api(chat_status=400, models_status=401)  # a key the API refuses
    try:
        assert eval_refusal(tmp_path, monkeypatch, capsys, *api, "--engine-arg", f"base_url={url}") == (
            f'chatgym eval: --engine-arg base_url: GET {url}/models answered HTTP 401: {{"error": "no"}}\n'
        )
    finally:
        server.shutdown()
        server.server_close()


def eval_refusal(tmp_path, monkeypatch, capsys, *args: str) -> str:
    """What ``chatgym eval --engine hf --env Math-v0 ... ARGS`` prints when it refuses ARGS; no results
    file is made."""
    db = tmp_path / "r.sqlite"
    argv = ["--engine", "hf", "--env", "Math-v0", "--max-tasks", "1", "--db", str(db), "--no-progress"]
    err = refusal(eval_cli.main, [*argv, *args], monkeypatch, capsys)
    assert not db.exists()  # regression: a refused chat template left an empty results.sqlite
    return err


def test_chat_template_and_agent_refusals_are_one_line_before_the_model_loads(tmp_path, monkeypatch, capsys):
    # Regression: each was a traceback (status 1); the refused template and the agent's missing
    # function only once the model had loaded.
    assert_chat_template_refusals("eval", lambda *a: eval_refusal(tmp_path, monkeypatch, capsys, *a), tmp_path)
    agent = tmp_path / "agent.py"
    agent.write_text("def other(base_url, api_key, task):\n    return None\n")
    # Regression: named `agent:` where the other messages name flags.
    assert eval_refusal(tmp_path, monkeypatch, capsys, "--agent", f"{agent}:run") == (
        f"chatgym eval: --agent: '{agent}' has no callable 'run'\n"
    )
    assert eval_refusal(tmp_path, monkeypatch, capsys, "--agent", f"{tmp_path / 'none.py'}:run") == (
        f"chatgym eval: --agent: no such file '{tmp_path / 'none.py'}'\n"
    )
    assert eval_refusal(tmp_path, monkeypatch, capsys, "--engine", "openai", "--model", "m", "--engine-arg",
                        "base_url=http://127.0.0.1:1/v1", "--agent", f"{agent}:run") == (
        "chatgym eval: --agent: a 'module:function' program on a token engine (vllm, vllm-server, sglang, hf), "
        f"got agent '{agent}:run' with engine 'openai'\n"
    )  # fmt: skip


def test_evalconfig_refusals_name_the_flags(tmp_path, monkeypatch, capsys):
    # Regression: EvalConfig's field names (n_samples, max_tasks) where the command's flags are meant.
    def refuse(*args: str) -> str:
        return eval_refusal(tmp_path, monkeypatch, capsys, *args)

    assert refuse("-n", "0") == "chatgym eval: -n/--n-samples must be an int >= 1, got 0\n"
    assert refuse("--max-tasks", "0") == "chatgym eval: --max-tasks must be >= 1, got 0\n"


def test_a_seed_out_of_range_is_refused_at_start_naming_the_flag(tmp_path, monkeypatch, capsys):
    # Regression (fresh-user walk): --seed -5 was gymnasium's traceback; --seed 2**70 ran the episode,
    # then SQLite's OverflowError (a signed 64-bit column) lost it.
    seeds = "must be an int in [0, 4294967295] (2**32 - 1)"
    assert eval_refusal(tmp_path, monkeypatch, capsys, "--seed", "-5") == f"chatgym eval: --seed {seeds}, got -5\n"
    assert eval_refusal(tmp_path, monkeypatch, capsys, "--seed", str(2**70)) == (
        f"chatgym eval: --seed {seeds}, got {2**70}\n"
    )


def test_a_server_engine_without_its_server_is_refused_at_start_and_stores_nothing(tmp_path, monkeypatch, capsys):
    # Regression (fresh-user walk): --engine vllm-server with no server stored a failed episode per
    # task and reported pass@1 0.
    from chatgym.trainer.engines import http

    url, refused = _unanswered()
    server = ("--engine", "vllm-server", "--model", "smollm2")
    assert eval_refusal(tmp_path, monkeypatch, capsys, *server, "--engine-arg", f"base_url={url}") == (
        f"chatgym eval: --engine-arg base_url: no server answers GET {url}/v1/models ({refused})\n"
    )
    monkeypatch.delenv("CHATGYM_VLLM_URL", raising=False)
    monkeypatch.setitem(http.SERVER_URLS, "vllm-server", ("CHATGYM_VLLM_URL", url))  # the default URL
    assert eval_refusal(tmp_path, monkeypatch, capsys, *server) == (
        f"chatgym eval: --engine vllm-server: no server answers GET {url}/v1/models ({refused}) "
        "(the default; set --engine-arg base_url=... or $CHATGYM_VLLM_URL)\n"
    )


def test_a_traces_dir_where_no_file_can_be_made_is_refused_before_the_model_loads(tmp_path, monkeypatch, capsys):
    # Regression (fresh-user walk): vLLM loaded, then os.makedirs raised FileExistsError (a traceback)
    # and an empty results file was left.
    afile = tmp_path / "afile"
    afile.write_text("")
    assert eval_refusal(tmp_path, monkeypatch, capsys, "--traces-dir", str(afile / "t")) == (
        f"chatgym eval: --traces-dir: cannot create {afile / 't'} (in {afile}: not a directory)\n"
    )


def test_fp8_where_it_cannot_run_is_refused_before_the_decode_hint(tmp_path, monkeypatch, capsys):
    # Regression (fresh-user walk): on a CPU the first answer was "set --engine-arg decode=static".
    assert_fp8_refusals("eval", lambda *args: eval_refusal(tmp_path, monkeypatch, capsys, *args))


def test_token_engine_arguments_are_one_line_before_the_model_loads(tmp_path, monkeypatch, capsys):
    # Regression: `--chat-template model` on a model without one was a 32-line traceback (status 1), as
    # were an --engine-arg the engine does not take and a missing --model (rollout: one line each);
    # --engine-arg eos_token_ids=[99999] was refused as a fault of --chat-template.
    def refuse(*args: str) -> str:
        return eval_refusal(tmp_path, monkeypatch, capsys, *args)

    assert_token_engine_refusals("eval", refuse, tmp_path)
    assert refuse("--engine", "openai", "--model", "m", "--engine-arg", "base_url=http://127.0.0.1:1/v1",
                  "--engine-arg", "retrys=0") == (
        "chatgym eval: --engine-arg: 'retrys' not taken by the 'openai' engine (OpenAIChatEngine); "
        "did you mean 'retries' for 'retrys'?\n"
    )  # fmt: skip
    err = refuse("--model", str(tmp_path / "nomodel"))
    assert err.startswith(f"chatgym eval: --model: model '{tmp_path / 'nomodel'}' is neither a packaged model")


def test_a_value_the_engine_refuses_as_it_starts_is_one_line_and_leaves_no_results_file(tmp_path, capsys):
    # Regression: the engine's ValueError was a traceback with status 1, after the results file had
    # been made.
    db = tmp_path / "r.sqlite"
    assert_engine_value_refusal("eval", eval_cli.main, ["--env", "Math-v0", "--db", str(db)], capsys)
    assert not db.exists()


MISSPELT = (
    "cannot build the env: TypeError: ChatEnv.__init__() got an unexpected keyword argument 'difficulty_levl' "
    "was raised from the environment creator for Math-v0 with kwargs ({'difficulty_levl': 3})"
)


def env_refusal(tmp_path, capsys, *args: str) -> str:
    """What ``chatgym eval --engine reference ARGS`` prints when it refuses at start (status 2); no
    results file, no traces."""
    db = tmp_path / "r.sqlite"
    argv = ["--engine", "reference", "--max-tasks", "2", "--db", str(db), "--no-progress", *args]
    assert eval_cli.main(argv) == 2
    out = capsys.readouterr()
    assert out.out == ""
    assert list(tmp_path.iterdir()) == []
    return out.err


@pytest.mark.parametrize(
    ("args", "flags"),
    [
        (("--model", "smollm2"), "--model would be ignored; leave it out"),
        (("--engine-arg", "dtype=float32"), "--engine-arg would be ignored; leave it out"),
        (("--chat-template", "chatml_tools"), "--chat-template would be ignored; leave it out"),
        (("--model", "m", "--engine-arg", "max_batch_size=2"), "--model and --engine-arg would be ignored; leave them out"),
        (("--model", "m", "--engine-arg", "a=1", "--chat-template", "model"),
         "--model, --engine-arg and --chat-template would be ignored; leave them out"),
    ],
)
def test_the_reference_engine_refuses_model_and_engine_flags(tmp_path, capsys, args, flags):
    # Regression (fresh-user walk): the scripted reference policy runs no model, yet --model and
    # --engine-arg were accepted and ignored without a word.
    assert env_refusal(tmp_path, capsys, "--env", "Math-v0", *args) == (
        "chatgym eval: --engine reference plays each env's scripted reference policy, with no model or engine: "
        f"{flags}\n"
    )


@pytest.mark.parametrize(("value", "shown"), [("-1", "-1"), ("4294967296", "4294967296"), ("1.5", "1.5")])
def test_an_env_arg_seed_takes_the_trainers_seed_rule(tmp_path, capsys, value, shown):
    # Regression (fresh-user walk): --env-arg seed=-1 ran and was stored as its own leaderboard column,
    # with Math-v0's tasks of seed 1 (chatgym train refuses env.kwargs.seed=-1 at load).
    assert env_refusal(tmp_path, capsys, "--env", "Math-v0", "--env-arg", f"seed={value}") == (
        f"chatgym eval: --env-arg seed must be an int in [0, 4294967295] (2**32 - 1), got {shown}\n"
    )


def test_an_env_that_cannot_be_built_is_refused_at_start_naming_the_flag(tmp_path, capsys):
    # Regression: each was "skipped" with exit status 1 (as if evaluated and found empty); eval and
    # rollout share the check (build_env): the same words for the same mistake.
    assert env_refusal(tmp_path, capsys, "--env", "Math-v0", "--env-arg", "difficulty_levl=3") == (
        f"chatgym eval: --env-arg: Math-v0: {MISSPELT}\n"
    )
    assert env_refusal(tmp_path, capsys, "--env", "Math-v0", "--split", "nope") == (
        "chatgym eval: --split: Math-v0: cannot build the env: ValueError: Math-v0: split must be one of "
        "['test', 'train'], got 'nope'\n"
    )
    both = ("--split", "nope", "--env-arg", "difficulty_levl=3")
    assert env_refusal(tmp_path, capsys, "--env", "Math-v0", *both) == (
        "chatgym eval: --split and --env-arg: Math-v0: cannot build the env: ValueError: Math-v0: split must "
        "be one of ['test', 'train'], got 'nope'\n"
    )


def test_one_named_env_that_cannot_be_built_refuses_the_others_too(tmp_path, capsys):
    # Math-v0 builds with --split test, Judge-v0 does not: scoring Math-v0 alone would store a part of
    # the requested evaluation as if it were the whole.
    assert env_refusal(tmp_path, capsys, "--env", "Math-v0", "Judge-v0", "--split", "test") == (
        "chatgym eval: --split: Judge-v0: cannot build the env: ValueError: split must be 'all' or 'reference', "
        "got 'test'\n"
    )


@pytest.fixture
def two_envs(monkeypatch):
    """``--env all`` means Math-v0 and ToolUse-v0 (ToolUse-v0 has no train split)."""
    from chatgym.envs import registration

    specs = {k: registration.ENV_SPECS[k] for k in ("Math-v0", "ToolUse-v0")}
    monkeypatch.setattr(registration, "ENV_SPECS", specs)


def test_all_skips_the_envs_that_cannot_be_built_and_refuses_when_none_can(tmp_path, capsys, two_envs):
    assert env_refusal(tmp_path, capsys, "--env", "all", "--env-arg", "difficulty_levl=3") == (
        f"chatgym eval: --env-arg: none of the 2 envs of 'all' can be built; Math-v0: {MISSPELT}\n"
    )
    db = tmp_path / "r.sqlite"
    argv = ["--engine", "reference", "--env", "all", "--split", "train", "--max-tasks", "2", "--db", str(db)]
    assert eval_cli.main([*argv, "--no-progress"]) == 0
    reason = "cannot build the env: ValueError: ToolUse-v0: BFCL has only a 'test' split, got 'train'"
    assert f"chatgym eval: ToolUse-v0: skipped, {reason}\n" in capsys.readouterr().err
    with sqlite3.connect(db) as conn:
        assert conn.execute("SELECT env_id, split, COUNT(*) FROM episodes GROUP BY env_id").fetchall() == [
            ("Math-v0", "train", 2)
        ]


def test_the_envs_must_be_named(capsys):
    # Regression (fresh-user walk): a bare `chatgym eval` ran every env on its whole split with vLLM
    # (Search-v0 alone: 3,802 tasks, "5:08:50" left on its bar); 'all' is now asked for by name.
    with pytest.raises(SystemExit) as exited:
        eval_cli.build_parser().parse_args([])
    assert exited.value.code == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        "chatgym eval: error: the following arguments are required: --env")
    assert eval_cli.build_parser().parse_args(["--env", "all"]).env == ["all"]


def test_a_text_only_model_is_refused_an_image_env_it_names_and_skips_those_all_brings(tmp_path, monkeypatch, capsys):
    # Regression: every VisualGrid-v0 / ChartQA-v0 episode of a text-only model failed at its first
    # observation, and `--env all` (examples/leaderboard.sh) stored those failures as its scores.
    import chatgym  # noqa: F401  (registers the env ids)
    from chatgym.envs.registration import ENV_SPECS
    from chatgym.trainer.config.loader import ConfigError
    from chatgym.trainer.eval.config import EvalConfig
    from chatgym.trainer.eval.envs import leave_out_image_envs

    db = tmp_path / "r.sqlite"
    argv = ["--engine", "hf", "--model", "smollm2", "--env", "Math-v0", "VisualGrid-v0", "--max-tasks", "1",
            "--db", str(db), "--no-progress"]  # fmt: skip
    assert refusal(eval_cli.main, argv, monkeypatch, capsys) == (
        "chatgym eval: --env: VisualGrid-v0: its observations carry images and --model smollm2 is a text-only "
        "model (no image processor): give a policy that reads images, or leave the env out\n"
    )
    assert not db.exists()
    # Both named at once (fresh-user walk: only the first was named, so the fixed command failed again;
    # then "its observations" of the two).
    argv[5:7] = ["ChartQA-v0", "VisualGrid-v0"]
    assert refusal(eval_cli.main, argv, monkeypatch, capsys) == (
        "chatgym eval: --env: ChartQA-v0, VisualGrid-v0: their observations carry images and --model smollm2 is a "
        "text-only model (no image processor): give a policy that reads images, or leave them out\n"
    )
    blind = "--model smollm2 is a text-only model (no image processor)"
    built = {env_id: ("identity", {}) for env_id in ENV_SPECS}
    leave_out_image_envs(EvalConfig(engine="hf", model="smollm2", envs=("all",)), built, blind)
    assert {e for e, b in built.items() if isinstance(b, str)} == {"VisualGrid-v0", "ChartQA-v0"}
    assert built["ChartQA-v0"] == f"its observations carry images and {blind}" and built["Math-v0"] == ("identity", {})
    kept = {env_id: ("identity", {}) for env_id in ENV_SPECS}
    leave_out_image_envs(EvalConfig(engine="hf", model="smollm2", envs=("all",)), kept, None)
    assert all(not isinstance(b, str) for b in kept.values())
    with pytest.raises(ConfigError) as raised:
        leave_out_image_envs(EvalConfig(engine="hf", model="smollm2", envs=("ChartQA-v0",)),
                             {"ChartQA-v0": ("identity", {})}, blind)  # fmt: skip
    assert str(raised.value) == (f"envs: ChartQA-v0: its observations carry images and {blind}: give a policy "
                                 "that reads images, or leave the env out")
    both = ("ChartQA-v0", "VisualGrid-v0")
    with pytest.raises(ConfigError) as raised:
        leave_out_image_envs(EvalConfig(engine="hf", model="smollm2", envs=both),
                             {env_id: ("identity", {}) for env_id in both}, blind)  # fmt: skip
    assert str(raised.value) == (f"envs: ChartQA-v0, VisualGrid-v0: their observations carry images and {blind}: "
                                 "give a policy that reads images, or leave them out")


def test_a_server_engine_is_refused_an_image_env_whatever_the_model(tmp_path, monkeypatch, capsys):
    # Regression (fresh-user walk): vllm-server, even with the VLM, stored one failed episode per task
    # (its completions API takes token prompts only); the engine is named before the model.
    db = tmp_path / "r.sqlite"
    argv = ["--engine", "vllm-server", "--model", "smollm2", "--env", "VisualGrid-v0", "--max-tasks", "1",
            "--db", str(db), "--no-progress", "--engine-arg", "base_url=http://127.0.0.1:1/v1"]  # fmt: skip
    assert refusal(eval_cli.main, argv, monkeypatch, capsys) == (
        "chatgym eval: --env: VisualGrid-v0: its observations carry images and --engine vllm-server sends token "
        "prompts without images (use vllm or hf): give a policy that reads images, or leave the env out\n"
    )
    assert not db.exists()


@pytest.mark.parametrize(("env_id", "images"), [("VisualGrid-v0", True), ("ChartQA-v0", True), ("Math-v0", False)])
def test_image_observations_says_whether_the_first_observation_has_an_image(env_id, images):
    import gymnasium as gym

    import chatgym  # noqa: F401

    env = gym.make(env_id)
    try:
        obs, _ = env.reset(seed=0)
        parts = [p for m in obs for p in (m["content"] if isinstance(m["content"], list) else [])]
        assert any("image" in p.get("type", "") for p in parts) is images
        assert env.unwrapped.image_observations is images
    finally:
        env.close()


def test_an_evaluation_where_every_env_is_skipped_exits_2_saying_so(tmp_path, monkeypatch, capsys):
    # Regression (fresh-user walk): every env of `all` skipped, for different reasons (one cannot be
    # built with --split train, the other's images a text-only model cannot read): exit 1, no last word.
    from chatgym.envs import registration
    from chatgym.trainer import engines

    specs = {k: registration.ENV_SPECS[k] for k in ("ToolUse-v0", "VisualGrid-v0")}
    monkeypatch.setattr(registration, "ENV_SPECS", specs)
    monkeypatch.setattr(engines, "make_engine", lambda *a, **k: pytest.fail("the model loaded"))
    db = tmp_path / "r.sqlite"
    argv = ["--engine", "hf", "--model", "smollm2", "--env", "all", "--split", "train", "--max-tasks", "1",
            "--db", str(db), "--no-progress"]  # fmt: skip
    assert eval_cli.main(argv) == 2
    err = capsys.readouterr().err.splitlines()
    assert err[-1] == "chatgym eval: nothing evaluated: every env was skipped (the reasons above)"
    assert [line.split(", ")[0] for line in err[:-1] if "skipped" in line] == [
        "chatgym eval: ToolUse-v0: skipped", "chatgym eval: VisualGrid-v0: skipped"]
    assert not db.exists()


def test_help_gives_evals_own_temperature_default_and_what_model_means_for_a_server():
    # Regression (fresh-user walk): the help said "(default 1.0)" where -n 1 samples greedily, and that
    # --model is "the served model's name" where vllm-server / sglang read a local model's tokenizer.
    text = " ".join(eval_cli.build_parser().format_help().split())
    assert "rollout.temperature (default 0, greedy, with -n 1; else 1.0)" in text
    assert "or the tokenizer of the model a vllm-server / sglang serves (required;" in text
    assert rollout_help_default() == "rollout.temperature (default 1.0)"  # rollout's own default is unchanged


def rollout_help_default() -> str:
    from chatgym.trainer.rollout.cli import build_parser

    text = " ".join(build_parser().format_help().split())
    return text[text.index("rollout.temperature") :].split(")")[0] + ")"


def test_stdout_is_the_json_report_alone(tmp_path, capsys):
    # Regression (fresh-user walk): the rich tables followed the JSON on stdout, so `| jq` failed
    # ("Extra data"); they go to stderr.
    import json

    argv = ["--engine", "reference", "--env", "Math-v0", "--max-tasks", "2", "--db", str(tmp_path / "r.sqlite"),
            "--no-progress"]  # fmt: skip
    assert eval_cli.main(argv) == 0
    out, err = capsys.readouterr()
    report = json.loads(out)
    assert [(r["env_id"], r["grid"], r["ran"], r["failed"]) for r in report] == [("Math-v0", 2, 2, 0)]
    assert "Math-v0" in err and "pass@1" in err  # the table, on stderr
