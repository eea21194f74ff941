"""examples/recipes: every recipe config loads, and a 1-step run of each CPU recipe with a scripted
policy (a FAKE engine: ReplayEngine whose script reads the prompt) trains and gives the exact tool
figures that the recipe's plot script reports."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest
from train_helpers import TINY_LLAMA

from chatgym.trainer.config.run import load_config
from chatgym.trainer.engines.replay import ReplayEngine

ROOT = Path(__file__).resolve().parents[1]
RECIPES = ROOT / "examples" / "recipes"
CONFIGS = sorted(p.relative_to(RECIPES).as_posix() for p in RECIPES.glob("*/*.yaml"))
CPU_CONFIGS = [c for c in CONFIGS if "cpu" in c]

sys.path.insert(0, str(RECIPES))
import compare_runs  # noqa: E402
import plot_recipe  # noqa: E402
import sft_warmup  # noqa: E402

sys.path.insert(0, str(RECIPES / "visual"))
import visual_sft  # noqa: E402

sys.path.insert(0, str(RECIPES / "judge_cotrain"))
import compare_cotrain  # noqa: E402


def test_the_recipes_are_there():
    assert CONFIGS == [
        "arith_chain/cpu.yaml",
        "arith_chain/gpu.yaml",
        "countdown/cpu.yaml",
        "countdown/gpu.yaml",
        "retool/cpu.yaml",
        "retool/gpu.yaml",
        "search_r1/tags_cpu.yaml",
        "search_r1/tags_gpu.yaml",
        "search_r1/tool_cpu.yaml",
        "search_r1/tool_gpu.yaml",
        "visual/cpu.yaml",
        "visual/gpu.yaml",
    ]
    for recipe in ("arith_chain", "countdown", "retool", "search_r1", "visual"):
        assert (RECIPES / recipe / "README.md").is_file()


@pytest.mark.parametrize("name", CONFIGS)
def test_config_loads_and_names_its_run(name):
    cfg = load_config(RECIPES / name)
    stem = name.replace("/", "_").removesuffix(".yaml")
    assert cfg.train.output_dir == f"runs/recipes/{stem}"
    assert cfg.train.trace_fraction == 1.0  # the plot script reads every training episode
    assert cfg.env.eval_tasks > 0 and cfg.env.eval_every > 0
    if "gpu" in name:
        assert (cfg.model.device, cfg.engine.backend) == ("cuda", "hf")
    else:  # the visual recipe's images go to the hf engine
        assert (cfg.model.device, cfg.engine.backend) == ("auto", "hf" if name.startswith("visual/") else "vllm")
    # The header comment's command is the one that runs this file.
    assert f"chatgym train examples/recipes/{name}" in (RECIPES / name).read_text()


class ScriptedPolicy(ReplayEngine):
    """A FAKE engine (no model): ReplayEngine that accepts the trainer's weight syncs and ignores them."""

    def update_weights(self, weights):
        for _ in weights:
            pass


@pytest.fixture(scope="module")
def tok():
    try:
        from chatgym.trainer.chat.tokenizer import get_tokenizer

        return get_tokenizer("smollm2")
    except (ModuleNotFoundError, FileNotFoundError, OSError) as exc:
        pytest.skip(str(exc))


def last_user_text(text: str) -> str:
    return text.rsplit("<|im_start|>user\n", 1)[-1].split("<|im_end|>", 1)[0]


def tiny_run(tmp_path, name: str, tok, script) -> dict:
    """One training step of recipe ``name`` with a tiny random model and the scripted policy; 4 held-out tasks."""
    from chatgym.trainer.train import Trainer

    cfg = load_config(
        RECIPES / name,
        [
            "model.path=smollm2",  # the retool recipe's SFT model is made by sft_warmup.py, not here
            "model.random_init=true",
            "model.config_overrides=" + json.dumps(TINY_LLAMA),
            "env.eval_tasks=4",
            "train.max_steps=1",
            "train.prompts_per_step=2",
            "train.group_size=2",
            "train.progress=false",
            "train.tensorboard=false",
            f"train.output_dir={tmp_path}",
        ],
    )
    # Each turn: the script's text, then <|im_end|> (id 2), SmolLM2's end of an assistant turn.
    engine = ScriptedPolicy(lambda ids: [*tok.encode(script(tok.decode(ids)), add_special_tokens=False), 2], tok)
    trainer = Trainer(cfg, engine=engine)
    try:
        summary = trainer.train()
    finally:
        trainer.close()
    return summary


@pytest.mark.slow  # ~1 min (trainer set-up, 2 evaluations, the sandbox); 70-120 s at load average 8-17
@pytest.mark.parametrize("name", ["retool/cpu.yaml", "arith_chain/cpu.yaml"])
def test_retool_recipe_one_step_with_a_perfect_tool_user(tmp_path, tok, name):
    pytest.importorskip("reasoning_gym")

    def script(prompt: str) -> str:
        user = last_user_text(prompt)
        if user.startswith("<tool_response>"):  # turn 2: copy the interpreter's stdout as the answer
            value = re.search(r"stdout:\n(\S+)", user).group(1)
            return f"<answer>{value}</answer>"
        expr = re.fullmatch(r"Calculate (.+)\.", user).group(1)  # turn 1: compute with python
        return '<tool_call>{"name": "python", "arguments": {"code": "print(' + expr + ')"}}</tool_call>'

    summary = tiny_run(tmp_path, name, tok, script)
    # Every episode: one ok call, the right answer -> reward 1 (call_bonus is 0 after the SFT cold start).
    assert summary["first_step"]["reward/mean"] == 1.0
    assert summary["first_step"]["reward/accuracy"] == 1.0
    assert summary["eval_before"]["eval/accuracy"] == summary["eval_after"]["eval/accuracy"] == 1.0
    data = plot_recipe.main([str(tmp_path)])
    assert (tmp_path / "curves.png").stat().st_size > 1000
    [train] = data["train"]
    # 2 prompts x 2 samples; 2 turns each (call, answer); 1 call; no tool error.
    assert {k: train[k] for k in ("episodes", "tool_rate", "calls", "turns", "tool_error_rate", "accuracy")} == {
        "episodes": 4.0, "tool_rate": 1.0, "calls": 1.0, "turns": 2.0, "tool_error_rate": 0.0, "accuracy": 1.0,
    }  # fmt: skip
    assert [(e["step"], e["episodes"], e["tool_rate"], e["accuracy"]) for e in data["eval"]] == [
        (0, 4.0, 1.0, 1.0),
        (1, 4.0, 1.0, 1.0),
    ]


@pytest.mark.slow  # ~1 min (trainer set-up, 2 evaluations, the sandbox running the search program)
def test_countdown_recipe_one_step_with_the_scripted_search_program(tmp_path, tok):
    pytest.importorskip("reasoning_gym")

    def script(prompt: str) -> str:
        user = last_user_text(prompt)
        if user.startswith("<tool_response>"):  # turn 2: copy the expression the search printed
            value = re.search(r"stdout:\n(\S+)", user).group(1)
            return f"<answer>{value}</answer>"
        # reasoning-gym's three countdown templates: "... numbers 48, 21, 41, 15, create ... equals 43",
        # "Find a way to make 43 using ... numbers: ...", "Calculate 43 using ... numbers: ...".
        numbers = [int(n) for n in re.search(r"numbers:? ((?:\d+, )*\d+)", user).group(1).split(", ")]
        target = int(re.search(r"(?:equals|make|Calculate) (\d+)", user).group(1))
        code = sft_warmup.countdown_program(numbers, target)
        return "<tool_call>" + json.dumps({"name": "python", "arguments": {"code": code}}) + "</tool_call>"

    summary = tiny_run(tmp_path, "countdown/cpu.yaml", tok, script)
    # The first 4 held-out tasks all have a bracket-free solution: the program finds each one.
    assert summary["eval_before"]["eval/accuracy"] == summary["eval_after"]["eval/accuracy"] == 1.0
    data = plot_recipe.main([str(tmp_path)])
    [train] = data["train"]
    assert {k: train[k] for k in ("episodes", "tool_rate", "calls", "turns", "tool_error_rate")} == {
        "episodes": 4.0, "tool_rate": 1.0, "calls": 1.0, "turns": 2.0, "tool_error_rate": 0.0,
    }  # fmt: skip
    assert [(e["step"], e["tool_rate"], e["turns"], e["accuracy"]) for e in data["eval"]] == [
        (0, 1.0, 2.0, 1.0),
        (1, 1.0, 2.0, 1.0),
    ]


@pytest.mark.slow  # ~1-2 min each (trainer set-up, the WikiQA splits, BM25)
@pytest.mark.parametrize("mode", ["tags", "tool"])
def test_search_recipe_one_step_with_an_oracle_searcher(tmp_path, tok, mode):
    pytest.importorskip("bm25s")
    import gymnasium as gym

    cfg = load_config(RECIPES / f"search_r1/{mode}_cpu.yaml")
    answers = {}
    for split in ("train", "test"):
        try:
            env = gym.make("Search-v0", split=split, **cfg.env.kwargs).unwrapped
            answers.update({t["question"]: t["answers"][0] for t in env.tasks})
        except (ModuleNotFoundError, FileNotFoundError) as exc:
            pytest.skip(str(exc))

    def script(prompt: str) -> str:
        # Turn 1 searches the question; turn 2 answers with the gold answer in tags (an oracle, so EM
        # is 1 by construction and the figures below are exact).
        user = last_user_text(prompt)
        if user.startswith("Question: "):
            q = user.removeprefix("Question: ")
            if mode == "tags":
                return f"<search> {q} </search>"
            return "<tool_call>" + json.dumps({"name": "search", "arguments": {"query": q}}) + "</tool_call>"
        question = re.search(r"<\|im_start\|>user\nQuestion: (.*?)<\|im_end\|>", prompt, re.S).group(1)
        return f"<answer>{answers[question]}</answer>"

    summary = tiny_run(tmp_path, f"search_r1/{mode}_cpu.yaml", tok, script)
    # EM 1 in every episode; the reward is EM alone (search_bonus 0 after the SFT cold start).
    assert summary["first_step"]["reward/mean"] == 1.0
    assert summary["first_step"]["reward/accuracy"] == 1.0
    data = plot_recipe.main([str(tmp_path)])
    [train] = data["train"]
    assert {k: train[k] for k in ("episodes", "tool_rate", "calls", "turns", "tool_error_rate", "em", "f1")} == {
        "episodes": 4.0, "tool_rate": 1.0, "calls": 1.0, "turns": 2.0, "tool_error_rate": 0.0, "em": 1.0, "f1": 1.0,
    }  # fmt: skip
    assert [(e["step"], e["accuracy"], e["f1"]) for e in data["eval"]] == [(0, 1.0, 1.0), (1, 1.0, 1.0)]


def test_retool_sft_traces_train_only_the_assistant_turns(tok):
    pytest.importorskip("reasoning_gym")

    cfg = load_config(RECIPES / "retool/cpu.yaml")
    env = sft_warmup.make_env("retool", cfg)
    try:
        episode = sft_warmup.retool_episode(env, 4000)
        messages = episode.messages
        task = env.tasks[4000]
        ids, mask = sft_warmup.assistant_mask(tok, messages, env.tools)
    finally:
        env.close()
    expr, answer = task["metadata"]["expression"], task["answer"]
    assert (episode.reward, episode.info["success"]) == (1.0, True)  # call_bonus 0: the answer alone
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "tool", "assistant"]
    assert messages[3]["content"] == f"status: ok (exit code 0)\nstdout:\n{answer}"
    # Trained: exactly the two assistant turns, each up to its <|im_end|> (where generation stops).
    trained = tok.decode([i for i, m in zip(ids, mask, strict=True) if m])
    assert trained == (
        '<tool_call>\n{"name": "python", "arguments": {"code": "print(' + expr + ')"}}\n</tool_call><|im_end|>'
        f"<answer>{answer}</answer><|im_end|>"
    )
    assert tok.decode(ids).endswith(f"<|im_start|>assistant\n<answer>{answer}</answer><|im_end|>\n")


def test_usersim_sft_trace_is_the_users_first_turn_with_its_scenario_opening(tok):
    """The user party's cold start: what its engine sees at the first turn (the user system prompt with
    the scenario, the agent's greeting), answered by the scenario's reason and known info; only that
    answer is trained. Training task 0 of tau2 airline, its text read from the task here."""
    from chatgym.envs.usersim.env import GREETING, UserSimEnv
    from chatgym.trainer.config.cotrain import load_cotrain_config
    from chatgym.trainer.cotrain.party import facts, known_facts

    cfg = load_cotrain_config(ROOT / "examples/configs/cotrain_usersim_gpu.yaml")[0]
    env = sft_warmup.make_env("usersim", cfg)
    assert isinstance(env, UserSimEnv) and env.split == "train"
    episode = sft_warmup.usersim_episode(env, 0)
    opening = (
        "You want to cancel reservation EHGLP3. \n\nIt may be more than 24 hours after booking, but it is ok "
        "because you were out of town for that time.\nYou are Emma Kim.\nYour user id is emma_kim_9957."
    )
    assert episode.messages == [
        {"role": "system", "content": env.user_system_prompt(env.tasks[0])},
        {"role": "user", "content": GREETING},
        {"role": "assistant", "content": opening},
    ]
    assert known_facts(episode.messages) == {"emma_kim_9957"} <= facts(opening)  # coverage 1
    ids, mask = sft_warmup.assistant_mask(tok, episode.messages, None)
    assert tok.decode([i for i, m in zip(ids, mask, strict=True) if m]) == opening + "<|im_end|>"


@pytest.fixture(scope="module")
def search_envs():
    """The search recipe's SFT envs (the CPU configs' kwargs, training split), one per mode."""
    pytest.importorskip("bm25s")
    envs = {}
    try:
        for mode in ("tags", "tool"):
            envs[mode] = sft_warmup.make_env("search", load_config(RECIPES / f"search_r1/{mode}_cpu.yaml"))
            assert len(envs[mode].tasks) == SEARCH_TRAIN_TASKS
    except (ModuleNotFoundError, FileNotFoundError) as exc:
        pytest.skip(str(exc))
    yield envs
    for env in envs.values():
        env.close()


# Pinned from the data (WikiQA describe+define, seed 0): the training split's size and one task near
# its end whose question's key phrase retrieves the gold article, and one whose does not.
SEARCH_TRAIN_TASKS = 13265
SEARCH_TASK = 13082
SEARCH_QUESTION = 'What is "Capital of Iraq"?'
SEARCH_QUERY = "Capital of Iraq"
SEARCH_TITLE = "Baghdad"
SEARCH_GOLD_RANK = 2  # BM25 ranks Mosul first; the policy reads both passages
SEARCH_MISS = 12865  # 'What is "Large, round non-stellar astronomical object"?' (Planet): not in the top 2


def test_search_query_is_the_questions_key_phrase():
    query = sft_warmup.search_query('What is "1968 film by Stanley Kubrick"?')
    assert query == "1968 film by Stanley Kubrick"
    assert sft_warmup.search_query("Who was an English naturalist and biologist?") == (
        "an English naturalist and biologist"
    )
    assert sft_warmup.search_query("Which are ?") == "Which are ?"  # nothing left: the question itself


@pytest.mark.parametrize("mode", ["tags", "tool"])
def test_search_sft_episode_is_a_real_successful_episode(tok, search_envs, mode):
    env = search_envs[mode]
    task = env.tasks[SEARCH_TASK]
    assert (task["question"], task["answers"][0]) == (SEARCH_QUESTION, SEARCH_TITLE)
    ep = sft_warmup.search_episode(env, SEARCH_TASK)
    assert ep is not None and ep.query == SEARCH_QUERY
    # The env's own verdict: EM 1, success, reward = EM (search_bonus 0 in the recipe configs).
    assert (ep.reward, ep.info["success"], ep.info["em"], ep.info["searches"]) == (1.0, True, 1.0, 1)
    # Real BM25: the gold article is among the 2 retrieved ones, at the pinned rank, and its title line
    # is in the passages the policy read.
    assert len(ep.retrieved) == 2 and ep.retrieved[SEARCH_GOLD_RANK - 1] == SEARCH_TITLE
    assert ep.gold_rank == SEARCH_GOLD_RANK
    assert f"Doc {SEARCH_GOLD_RANK} (Title: {SEARCH_TITLE}) " in ep.observation
    assert ep.observation.startswith("<information>Doc 1 (Title: " if mode == "tags" else "Doc 1 (Title: ")

    # The assistant turns as the policy generates them, each closed by <|im_end|> (id 2).
    if mode == "tags":
        roles = ["system", "user", "assistant", "user", "assistant"]
        turns = [f"<search> {SEARCH_QUERY} </search>", f"<answer> {SEARCH_TITLE} </answer>"]
    else:
        roles = ["system", "user", "assistant", "tool", "assistant"]
        call = json.dumps({"name": "search", "arguments": {"query": SEARCH_QUERY}})
        turns = [f"<tool_call>\n{call}\n</tool_call>", f"<answer>{SEARCH_TITLE}</answer>"]
    assert [m["role"] for m in ep.messages] == roles
    ids, mask = sft_warmup.assistant_mask(tok, ep.messages, env.tools)
    assert len(ids) == len(mask) and set(mask) == {0, 1}
    # Independent count: each turn's text + <|im_end|> encoded on its own.
    assert sum(mask) == sum(len(tok.encode(t + "<|im_end|>", add_special_tokens=False)) for t in turns)
    # ... and the trained tokens are exactly those turns: no system, question or passage token.
    trained = tok.decode([i for i, m in zip(ids, mask, strict=True) if m])
    assert trained == "".join(t + "<|im_end|>" for t in turns)


@pytest.mark.parametrize("mode", ["tags", "tool"])
def test_search_sft_skips_an_episode_whose_search_misses(search_envs, mode):
    env = search_envs[mode]
    assert sft_warmup.search_episode(env, SEARCH_MISS) is None
    # collect_episodes scans on from a negative offset (from the end) and fails clearly when the
    # split runs out: only the last task is left after offset -1.
    with pytest.raises(ValueError, match="episodes kept from tasks"):
        sft_warmup.collect_episodes("search", env, 2, offset=-1)


def test_visual_sft_rows_are_the_reference_episodes_as_the_collector_writes_them():
    pytest.importorskip("PIL")
    from chatgym.envs.visual.episodes import reference_episode
    from chatgym.trainer.chat.tokenizer import get_tokenizer
    from chatgym.trainer.models import vlm
    from chatgym.trainer.models.packaged import load_model_path

    try:
        path = load_model_path("smolvlm")
    except (ModuleNotFoundError, FileNotFoundError) as exc:
        pytest.skip(str(exc))
    cfg = load_config(RECIPES / "visual/cpu.yaml")
    tok = get_tokenizer(path)
    proc = vlm.load_processor(path, tok)
    trajs = visual_sft.reference_trajectories(cfg, tok, proc, 3, 1000)
    run = tok.convert_tokens_to_ids([vlm.FAKE_IMAGE_TOKEN, vlm.GLOBAL_IMAGE_TOKEN, *[vlm.IMAGE_TOKEN] * 16, vlm.FAKE_IMAGE_TOKEN])
    for k, traj in enumerate(trajs):
        ref = reference_episode(visual_sft.make_env(cfg), options={"task_index": 1000 + k})
        moves = [m["content"] for m in ref.messages if m["role"] == "assistant"]
        assert traj.success is True and ref.success is True and 1 <= len(moves) <= 3
        # Trained: exactly each move's ids (up to its </move>), never the closing <|im_end|> or a board.
        trained = [tok.decode(traj.token_ids[r["start"] : r["start"] + r["completion_tokens"]]) for r in traj.info["turns"]]
        assert trained == moves and all(m.startswith("<move>") and m.endswith("</move>") for m in moves)
        assert sum(traj.loss_mask) == sum(r["completion_tokens"] for r in traj.info["turns"])
        assert all(traj.loss_mask[r["start"] : r["start"] + r["completion_tokens"]] == [1] * r["completion_tokens"]
                   for r in traj.info["turns"])
        # One board image before each move (the solved board ends the episode), each a processor run.
        assert len(traj.images) == len(moves)
        assert sum(traj.token_ids[i : i + len(run)] == run for i in range(len(traj.token_ids))) == len(moves)


def _run_dir(root: Path, name: str, advantage: str, seed: int, rows: list[dict]) -> Path:
    d = root / name
    d.mkdir()
    (d / "config.yaml").write_text(f"algo:\n  advantage: {advantage}\ntrain:\n  seed: {seed}\n")
    (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return d


def _eval_row(step: int, acc: float, **extra: float) -> dict:
    tools = {"eval/tools/episodes_with_call_frac": 1.0, "eval/tools/calls_per_episode": 1.0,
             "eval/episode/turns_mean": 2.0, "eval/tools/error_rate": 0.25}
    return {"step": step, "eval/accuracy": acc, "timing/eval_s": 2.0, **tools, **extra}


def test_compare_runs_means_seeds_at_the_steps_all_of_them_reached(tmp_path, capsys):
    """Seed means only where every seed of the estimator was evaluated (a run cut short at step 10
    leaves step 20 out of its estimator's mean); wall clock sums step and eval seconds."""
    a0 = _run_dir(tmp_path, "r_grpo_s0", "grpo", 0, [
        _eval_row(0, 0.5), {"step": 1, "timing/step_s": 3.0}, _eval_row(10, 0.75, **{"timing/step_s": 4.0}),
        _eval_row(20, 0.875)])
    a1 = _run_dir(tmp_path, "r_grpo_s1", "grpo", 1, [_eval_row(0, 0.5), _eval_row(10, 0.625)])
    b0 = _run_dir(tmp_path, "r_turn_grpo_s0", "turn_grpo", 0, [_eval_row(0, 0.25), _eval_row(20, 1.0)])
    runs = [compare_runs.load_run(d) for d in (a0, a1, b0)]
    assert [(s, w) for s, w, _ in runs[0]["evals"]] == [(0, 2.0), (10, 11.0), (20, 13.0)]  # 2; +3; +4+2; +2
    assert compare_runs.seed_means(runs) == {"grpo": {0: 0.5, 10: 0.6875}, "turn_grpo": {0: 0.25, 20: 1.0}}
    text = compare_runs.main([str(a1), str(b0), str(a0)])
    lines = text.splitlines()
    assert lines[0] == "| step | r_grpo_s0 | r_grpo_s1 | r_turn_grpo_s0 | mean grpo | mean turn_grpo |"
    assert lines[2:5] == [
        "| 0 | 0.500 | 0.500 | 0.250 | 0.5000 | 0.2500 |",
        "| 10 | 0.750 | 0.625 |  | 0.6875 |  |",
        "| 20 | 0.875 |  | 1.000 |  | 1.0000 |",
    ]
    assert "| r_grpo_s0 | 20 | 1.000 | 1.000 | 2.000 | 0.250 |" in lines
    assert capsys.readouterr().out.rstrip("\n") == text


def test_compare_runs_skips_non_runs_and_unevaluated_runs_and_flags_failed_evaluations(tmp_path, capsys):
    """A glob's .log file and a directory without config.yaml are skipped (one note each on stderr);
    runs with no evaluation row (only a training row; no metrics.jsonl at all) are left out of the
    tables and named under them; a missing tool key reads nan; evaluations with eval/failed > 0 are
    marked, an all-failed one (no eval/accuracy) reads nan and makes its estimator's mean nan."""
    a0 = _run_dir(
        tmp_path, "r_grpo_s0", "grpo", 0, [_eval_row(0, 0.5), _eval_row(10, 0.75, **{"eval/failed": 2})]
    )
    all_failed = {"step": 10, "eval/failed": 200, "eval/tasks": 200, "timing/eval_s": 1.0}
    a1 = _run_dir(tmp_path, "r_grpo_s1", "grpo", 1, [_eval_row(0, 0.25), all_failed])
    no_tools = {"step": 10, "eval/accuracy": 0.625, "eval/failed": 0, "eval/episode/turns_mean": 1.5}
    b0 = _run_dir(tmp_path, "r_turn_grpo_s0", "turn_grpo", 0, [_eval_row(0, 0.5), no_tools])
    b1 = _run_dir(tmp_path, "r_turn_grpo_s1", "turn_grpo", 1, [{"step": 1, "timing/step_s": 3.0}])
    b2 = _run_dir(tmp_path, "r_turn_grpo_s2", "turn_grpo", 2, [])
    (b2 / "metrics.jsonl").unlink()  # died before its first row
    log = tmp_path / "r_grpo_s0.log"
    log.write_text("a run's log\n")
    sft = tmp_path / "r_sft"
    sft.mkdir()
    out = tmp_path / "compare.png"
    text = compare_runs.main([str(p) for p in (sft, b2, a1, log, b1, b0, a0)] + ["--out", str(out)])
    assert text.splitlines() == [
        "| step | r_grpo_s0 | r_grpo_s1 | r_turn_grpo_s0 | mean grpo | mean turn_grpo |",
        "|---|---|---|---|---|---|",
        # grpo at 0: (0.5 + 0.25) / 2; at 10: (0.75 + nan) / 2. turn_grpo: its one evaluated run.
        "| 0 | 0.500 | 0.250 | 0.500 | 0.3750 | 0.5000 |",
        "| 10 | 0.750 (2 failed) | nan (200 failed) | 0.625 | nan | 0.6250 |",
        "",
        "| run | step | tool_rate | calls | turns | tool_error_rate |",
        "|---|---|---|---|---|---|",
        "| r_grpo_s0 | 0 | 1.000 | 1.000 | 2.000 | 0.250 |",
        "| r_grpo_s0 | 10 (2 failed) | 1.000 | 1.000 | 2.000 | 0.250 |",
        "| r_grpo_s1 | 0 | 1.000 | 1.000 | 2.000 | 0.250 |",
        "| r_grpo_s1 | 10 (200 failed) | nan | nan | nan | nan |",
        "| r_turn_grpo_s0 | 0 | 1.000 | 1.000 | 2.000 | 0.250 |",
        "| r_turn_grpo_s0 | 10 | nan | nan | 1.500 | nan |",
        "",
        "(N failed): eval/failed > 0, N held-out episodes failed (misses in the accuracy).",
        "",
        "No evaluation row (not in the tables): r_turn_grpo_s1, r_turn_grpo_s2.",
    ]
    captured = capsys.readouterr()
    assert captured.out == text + "\n"  # the markdown alone: `> compare.md` keeps nothing else
    assert captured.err.splitlines() == [
        f"compare_runs.py: skipped {sft}: not a run directory (no config.yaml)",
        f"compare_runs.py: skipped {log}: not a run directory (no config.yaml)",
        f"wrote {out}",
    ]
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    runs = [compare_runs.load_run(d) for d in (b1, b2)]
    assert [r["evals"] for r in runs] == [[], []]
    assert compare_runs.seed_means(runs) == {}
    with pytest.raises(SystemExit) as stop:  # nothing to compare: argparse's one-line error
        compare_runs.main([str(log), str(sft)])
    assert stop.value.code == 2
    assert capsys.readouterr().err.endswith(
        "error: no run directory (a directory with a config.yaml) among the arguments\n"
    )



def test_compare_cotrain_tables_the_evaluations_and_the_ratings_given(tmp_path, capsys):
    run = tmp_path / "lr_s0"
    run.mkdir()
    rows = [
        {"step": 0, "eval/score": 0.25, "eval/judge/calibration/reward_mean": 0.5, "timing/eval_s": 20.4,
         "eval/judge/calibration/best_constant_agreement": 0.75, "eval/judge/calibration/rating_distinct": 2.0},
        {"step": 1, "reward/mean": 0.1, "timing/step_s": 6.5},  # a training row: not in the table
        {"step": 10, "eval/score": 0.5, "eval/judge/calibration/reward_mean": 0.625, "timing/step_s": 7.0,
         "timing/eval_s": 11.2, "eval/judge/calibration/best_constant_agreement": 0.75,
         "eval/judge/calibration/rating_distinct": 1.0, "eval/judge/calibration/order_accuracy": 0.25},
    ]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    samples = [(0, 5.0), (0, 5.0), (0, None), (0, 1.0), (10, 5.0)]
    (run / "eval_calibration.jsonl").write_text(
        "".join(json.dumps({"judge_version": v, "rating": r}) + "\n" for v, r in samples)
    )
    empty = tmp_path / "empty"
    empty.mkdir()
    assert compare_cotrain.rating_counts(run) == {0: {5.0: 2, None: 1, 1.0: 1}, 10: {5.0: 1}}
    assert compare_cotrain.main([str(run), str(empty)]) == 0
    out, err = capsys.readouterr()
    lines = out.splitlines()
    assert len(lines) == 4  # header, rule, the two evaluations
    dash = " | ".join(["–"] * 4)  # policy-answer agreement, its constant, parse rate, reference reward
    assert lines[0].startswith("| run | step | wall clock (s) | calibration agreement |")
    # wall clock: 20.4 s (step-0 evaluation); then + 6.5 (step 1) + 7.0 + 11.2 (step 10, its evaluation) = 45.1
    assert lines[2] == f"| lr_s0 | 0 | 20 | 0.5000 | 0.7500 | 2.0000 | – | {dash} | 0.2500 | 1: 1, 5: 2, none: 1 |"
    assert lines[3] == f"| lr_s0 | 10 | 45 | 0.6250 | 0.7500 | 1.0000 | 0.2500 | {dash} | 0.5000 | 5: 1 |"
    assert [r["wall_s"] for r in compare_cotrain.eval_rows(run)] == pytest.approx([20.4, 45.1])
    assert err == f"compare_cotrain.py: {empty} has no metrics.jsonl; skipped\n"
    assert compare_cotrain.main([str(empty)]) == 2
    capsys.readouterr()
    compare_cotrain.plot([run], tmp_path / "judge.png")  # five panels, one against wall clock
    assert (tmp_path / "judge.png").stat().st_size > 0
    # A run killed mid-write: its cut last row is skipped with a note; a run with no evaluation is named.
    cut, fresh = tmp_path / "cut", tmp_path / "fresh"
    cut.mkdir()
    fresh.mkdir()
    (cut / "metrics.jsonl").write_text(json.dumps({**rows[0], "eval/judge/parse_rate": None}) + "\n" + '{"step": 11, "eval/sco')
    (cut / "eval_calibration.jsonl").write_text(json.dumps({"judge_version": 0, "rating": 9.0}) + '\n{"judge_vers')
    (fresh / "metrics.jsonl").write_text(json.dumps(rows[1]) + "\n")
    assert compare_cotrain.main([str(cut), str(fresh), "--out", str(tmp_path / "new" / "c.png")]) == 0
    out, err = capsys.readouterr()
    # a metric logged as null (non-finite) reads "–"
    assert out.splitlines()[2] == f"| cut | 0 | 20 | 0.5000 | 0.7500 | 2.0000 | – | {dash} | 0.2500 | 9: 1 |"
    assert len(out.splitlines()) == 3
    assert err.splitlines() == [
        f"compare_cotrain.py: {cut}: the last line of metrics.jsonl is cut short; that line left out",
        f"compare_cotrain.py: {cut}: the last line of eval_calibration.jsonl is cut short; that line left out",
        f"compare_cotrain.py: {fresh} has no evaluation row (eval/score) yet",
        f"wrote {tmp_path / 'new' / 'c.png'}",
    ]
    (fresh / "metrics.jsonl").write_text('{"step": 1, "tim\n' + json.dumps(rows[0]) + "\n")  # damaged mid-file
    assert compare_cotrain.main([str(fresh)]) == 2
    assert capsys.readouterr().err == (
        f"compare_cotrain.py: {fresh / 'metrics.jsonl'}: line 1 is not JSON (Unterminated string starting at)\n"
    )
    # Rows another tool wrote without the keys the table reads: one line naming the file, not a KeyError.
    (fresh / "metrics.jsonl").write_text(json.dumps({k: v for k, v in rows[0].items() if k != "step"}) + "\n")
    assert compare_cotrain.main([str(fresh)]) == 2
    assert capsys.readouterr().err == f"compare_cotrain.py: {fresh / 'metrics.jsonl'}: an evaluation row has no 'step'\n"
    (fresh / "metrics.jsonl").write_text(json.dumps(rows[0]) + "\n")
    (fresh / "eval_calibration.jsonl").write_text(json.dumps({"judge_version": 0, "rating": 5.0}) + "\n{}\n")
    assert compare_cotrain.main([str(fresh)]) == 2
    assert capsys.readouterr().err == (
        f"compare_cotrain.py: {fresh / 'eval_calibration.jsonl'}: row 2 lacks 'judge_version' or 'rating'\n"
    )


def test_compare_cotrain_tables_a_user_run_by_its_faithfulness(tmp_path, capsys):
    run = tmp_path / "user_s0"
    run.mkdir()
    rows = [
        {"step": 0, "eval/score": 0.0, "eval/user/reward_mean": 0.5, "eval/user/blind_faithfulness": 0.5,
         "eval/user/faithfulness_over_blind": 0.0, "eval/user/coverage": 0.0, "eval/user/grounded": 1.0,
         "eval/user/opening_distinct": 0.95},
        {"step": 1, "user/reward_mean": 0.6},  # a training row: not in the table
        {"step": 5, "eval/score": 0.05, "eval/user/reward_mean": 0.625, "eval/user/blind_faithfulness": 0.5,
         "eval/user/faithfulness_over_blind": 0.125, "eval/user/coverage": 0.25, "eval/user/grounded": 1.0,
         "eval/user/opening_distinct": 1.0},
    ]  # fmt: skip
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert compare_cotrain.party_of([run]) == "user"
    assert compare_cotrain.main([str(run), "--out", str(tmp_path / "c.png")]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == (
        "| run | step | wall clock (s) | faithfulness | blind user's | over blind | coverage | grounded |"
        " distinct openings | policy score |"
    )
    assert lines[2:] == [  # no timing/* keys in these rows: wall clock 0
        "| user_s0 | 0 | 0 | 0.5000 | 0.5000 | 0.0000 | 0.0000 | 1.0000 | 0.9500 | 0.0000 |",
        "| user_s0 | 5 | 0 | 0.6250 | 0.5000 | 0.1250 | 0.2500 | 1.0000 | 1.0000 | 0.0500 |",
    ]
    assert (tmp_path / "c.png").stat().st_size > 0


# ---- compare_estimators.sh, with stand-ins for chatgym and python ----------------------------------

# A stand-in for `chatgym train`: writes "<its pid> <its child's pid>" to <output_dir>/pids, where the
# child stands for an engine subprocess (vLLM's), then waits for it; the run of FAIL_ADVANTAGE fails
# at once, the others end when END is set ("ok": at once).
FAKE_CHATGYM = """#!/usr/bin/env bash
for arg; do
  case $arg in
    algo.advantage=*) adv=${arg#*=} ;;
    train.output_dir=*) out=${arg#*=} ;;
  esac
done
mkdir -p "$out"
[ "$adv" = "${FAIL_ADVANTAGE:-}" ] && exit 1
[ "${END:-}" = ok ] && exit 0
sleep 600 &
echo "$$ $!" > "$out/pids"
wait
"""
# A stand-in for python running plot_recipe.py RUN_DIR: records the run it was asked to plot; the
# script's check of its runs (python reading its program from stdin) passes.
FAKE_PYTHON = """#!/usr/bin/env bash
[ "$1" = - ] && exit 0
basename "$2" >> "$PLOTTED"
"""


def _compare_estimators(tmp_path: Path, **env: str) -> tuple[list[str], Path, dict[str, str]]:
    """The command, its OUT_ROOT (the cold start already made) and environment, runs grpo and
    turn_grpo with seed 0."""
    import os

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, text in (("chatgym", FAKE_CHATGYM), ("python", FAKE_PYTHON)):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    root = tmp_path / "out"
    (root / "arith_chain_sft").mkdir(parents=True)
    (root / "arith_chain_sft" / "sft_summary.json").write_text("{}")
    env = {**os.environ, "CHATGYM": str(bin_dir / "chatgym"), "PYTHON": str(bin_dir / "python"),
           "ADVANTAGES": "grpo turn_grpo", "SEEDS": "0", "PLOTTED": str(tmp_path / "plotted"), **env}  # fmt: skip
    return ["bash", str(RECIPES / "compare_estimators.sh"), "arith_chain", str(root)], root, env


def _running(pid: int) -> bool:
    """``pid`` is a live process (a zombie nobody has reaped yet counts as gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


@pytest.mark.parametrize("sig", ["SIGTERM", "SIGINT"])
def test_compare_estimators_stops_every_process_of_its_runs_when_stopped(tmp_path, sig):
    """Regression: the script killed its runs' pids only, so a run's engine subprocesses went on
    (holding the GPU); each run now is a process group of its own, killed whole."""
    import os
    import signal
    import subprocess
    import time

    cmd, root, env = _compare_estimators(tmp_path)
    # SIGINT at its default in the script: a test run started in the background inherits it ignored,
    # and bash cannot trap a signal ignored on entry.
    script = subprocess.Popen(
        cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    pid_files = [root / f"arith_chain_{adv}_s0" / "pids" for adv in ("grpo", "turn_grpo")]
    deadline = time.monotonic() + 60
    while not all(f.is_file() and f.read_text().endswith("\n") for f in pid_files):
        assert time.monotonic() < deadline and script.poll() is None, script.communicate()
        time.sleep(0.05)
    pids = [int(p) for f in pid_files for p in f.read_text().split()]
    try:
        assert all(_running(p) for p in pids)
        script.send_signal(getattr(signal, sig))
        _, err = script.communicate(timeout=30)
        assert script.returncode == {"SIGTERM": 143, "SIGINT": 130}[sig], err
        deadline = time.monotonic() + 10
        while any(_running(p) for p in pids) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert [p for p in pids if _running(p)] == []  # the runs and their children
        assert not (tmp_path / "plotted").exists()
    finally:  # a failed check leaves no stand-in behind
        for p in filter(_running, pids):
            os.kill(p, signal.SIGKILL)


def test_compare_estimators_plots_only_the_runs_that_finished(tmp_path):
    import subprocess

    cmd, root, env = _compare_estimators(tmp_path, FAIL_ADVANTAGE="turn_grpo", END="ok")
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 1
    assert done.stderr == (
        f"compare_estimators.sh: run arith_chain_turn_grpo_s0 failed; see {root}/arith_chain_turn_grpo_s0.log\n"
    )
    assert (tmp_path / "plotted").read_text() == "arith_chain_grpo_s0\n"  # not the failed run


@pytest.mark.parametrize(
    ("args", "env", "message"),
    [
        ([], {}, "usage: compare_estimators.sh RECIPE OUT_ROOT [override ...]"),
        (["retool", "OUT"], {}, "compare_estimators.sh: RECIPE must be arith_chain or countdown, got 'retool'"),
        (None, {"ADVANTAGES": " "}, "compare_estimators.sh: ADVANTAGES names no run"),
        (None, {"ADVANTAGES": "grpo gigpo grpo"}, "compare_estimators.sh: ADVANTAGES names grpo more than once"),
        (None, {"SEEDS": "0 1 1"}, "compare_estimators.sh: SEEDS names 1 more than once"),
        (None, {"ADVANTAGES": "grpo bogus", "PYTHON": sys.executable},
         "compare_estimators.sh: ADVANTAGES: unknown advantage estimator 'bogus'; known: dr_grpo, gae, gigpo, grpo, "
         "reinforce_plus_plus, reinforce_plus_plus_baseline, rloo, tppo, turn_grpo, turn_rloo"),
    ],
)  # fmt: skip
def test_compare_estimators_refuses_bad_runs_before_the_cold_start(tmp_path, args, env, message):
    """Regression (fresh-user walk): an unknown estimator was found only after the cold start, by
    each run's log; a repeated one ran two runs into one directory; ADVANTAGES="*" was a glob."""
    import subprocess

    cmd, root, full_env = _compare_estimators(tmp_path, **env)
    if args is not None:
        cmd = cmd[:2] + args
    done = subprocess.run(cmd, env=full_env, capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert (done.returncode, done.stderr) == (2, message + "\n")
    assert sorted(p.name for p in root.iterdir()) == ["arith_chain_sft"]  # no run started


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="checks the refusal without a GPU")
def test_compare_estimators_says_it_needs_a_gpu_before_the_cold_start(tmp_path):
    import subprocess

    cmd, root, env = _compare_estimators(tmp_path, PYTHON=sys.executable)
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
    assert (done.returncode, done.stderr) == (
        2,
        "compare_estimators.sh: no CUDA GPU here: the cold start and gpu.yaml's runs need one\n",
    )
    assert sorted(p.name for p in root.iterdir()) == ["arith_chain_sft"]
