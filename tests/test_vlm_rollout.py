"""Image episodes end to end: a run built from a config (``model.path: smolvlm``, ``engine.backend:
hf``, ``env.id: VisualGrid-v0``) collects real multi-turn image episodes with the real smolvlm hf engine,
and they are token-exact against the learner's own forward with the same pixels; a tool whose result
is an image (ChartQA-v0's ``zoom``) reaches the engine; a learner update followed by the weight sync
makes the engine encode its images again.

Expected image runs are written out by hand (``<fake_token_around_image><global-img>`` + 16 x
``<image>`` + ``<fake_token_around_image>``, docs/multimodal.md) and checked against the processor's
own expansion; expected logprobs come from the learner's forward (:func:`batch_logprobs` over
:func:`collate` of the trajectories), a code path the engine does not share (no KV cache, the
trajectory's image store, padded rows).
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import gymnasium as gym
import pytest
import torch

pytest.importorskip("PIL")
pytest.importorskip("matplotlib")

import chatgym  # noqa: F401  (registers the env ids)
from chatgym.trainer.config.run import load_config
from chatgym.trainer.engines.base import Completion
from chatgym.trainer.learner.batch import collate
from chatgym.trainer.learner.forward import batch_logprobs
from chatgym.trainer.models import vlm
from chatgym.trainer.rollout.collector import Collector
from chatgym.trainer.rollout.types import Trajectory
from chatgym.trainer.train import Trainer

GRID = {"board_size": 5, "n_boxes": 1, "min_moves": 2, "max_moves": 3, "max_turns": 2, "num_tasks": 8}
CONFIG = f"""
model: {{path: smolvlm, dtype: float32, compute_dtype: float32}}
engine: {{backend: hf, dtype: float32}}
env:
  id: VisualGrid-v0
  kwargs: {GRID}
  eval_tasks: 0
rollout: {{max_tokens: 5, max_response_tokens: 24, max_model_len: 1024, temperature: 1.0, seed: 3}}
algo: {{kl_coef: 0.0}}
optim: {{lr: 1.0e-3, warmup_steps: 0}}
train: {{max_steps: 1, prompts_per_step: 2, group_size: 2, micro_batch_size: 4, save_every: 0}}
"""
ATOL = 1e-4  # fp32 on the CPU; the differences seen are ~1e-6


@pytest.fixture(scope="module")
def trainer(tmp_path_factory):
    out = tmp_path_factory.mktemp("vlm_run")
    (out / "run.yaml").write_text(CONFIG)
    cfg = load_config(out / "run.yaml", [f"train.output_dir={out / 'run'}"])
    t = Trainer(cfg)
    yield t
    t.close()


def grid_env(**kw: Any) -> Any:
    return gym.make("VisualGrid-v0", **{**GRID, **kw}).unwrapped


def image_run(tok) -> list[int]:
    fake, glob, image = tok.convert_tokens_to_ids([vlm.FAKE_IMAGE_TOKEN, vlm.GLOBAL_IMAGE_TOKEN, vlm.IMAGE_TOKEN])
    return [fake, glob, *[image] * 16, fake]


def image_runs(ids: list[int], tok) -> list[list[int]]:
    """The runs from each opening ``<fake_token_around_image>`` to its closing one, in order."""
    fake = tok.convert_tokens_to_ids(vlm.FAKE_IMAGE_TOKEN)
    at = [i for i, t in enumerate(ids) if t == fake]
    assert len(at) % 2 == 0
    return [ids[a : b + 1] for a, b in zip(at[::2], at[1::2], strict=True)]


def learner_logprobs(trainer, trajs: list[Trajectory]) -> torch.Tensor:
    learner = trainer.learner
    batch = collate(trajs, learner.pad_id, learner.pixels)
    with torch.no_grad():
        return batch_logprobs(learner.policy, batch, learner.plan)


def assert_token_exact(trainer, trajs: list[Trajectory]) -> None:
    got = learner_logprobs(trainer, trajs)
    for i, traj in enumerate(trajs):
        mask = torch.tensor(traj.loss_mask, dtype=torch.bool)
        engine = torch.tensor(traj.engine_logprobs)
        diff = (got[i, : len(traj.token_ids)][mask] - engine[mask]).abs().max()
        assert diff < ATOL, f"trajectory {i}: engine and learner logprobs differ by {float(diff)}"
        assert (engine[~mask] == 0).all()


def test_a_smolvlm_run_collects_token_exact_multi_turn_image_episodes(trainer):
    proc = trainer.collector.renderer.processor  # the roles gave the collectors the model's processor
    tok = trainer.tokenizer
    assert proc is not None and trainer.eval_collector.renderer.processor is proc
    trajs = trainer.loop.run_until_complete(trainer.collector.collect(grid_env, [0, 1]))
    for k, traj in enumerate(trajs):
        assert traj.error is None, traj.error  # was image_error: "the model reads no images"
        assert len(traj.info["turns"]) == 2  # max_tokens 5 never writes a whole move: 2 turns, both kept
        # The loss mask is 1 exactly on the sampled ids.
        mask = [0] * len(traj.token_ids)
        for turn in traj.info["turns"]:
            mask[turn["start"] : turn["start"] + turn["completion_tokens"]] = [1] * turn["completion_tokens"]
        assert traj.loss_mask == mask
        # Each image placeholder is the processor's expansion of that image, in order.
        images = traj.image_list()
        assert len(images) >= 1 and len(traj.images) == len(images)
        want = [list(proc(text=proc.image_token, images=[[im]], add_special_tokens=False)["input_ids"][0]) for im in images]
        assert want == [image_run(tok)] * len(images) == image_runs(traj.token_ids, tok)
        # The prompt is the processor's own tokenization of the env's opening messages.
        env = grid_env()
        opening, _ = env.reset(options={"task_index": k})
        text = tok.apply_chat_template(opening, tokenize=False, add_generation_prompt=True)
        assert traj.token_ids[: traj.prompt_len] == list(proc(text=text, images=[images[0]])["input_ids"][0])
    assert_token_exact(trainer, trajs)


def test_the_weight_sync_after_an_update_makes_the_engine_encode_its_images_again(trainer):
    engine, one_turn = trainer.engine, lambda: grid_env(max_turns=1)
    [first] = trainer.loop.run_until_complete(trainer.collector.collect(one_turn, [2]))
    encoded = engine.vision.encoded
    [again] = trainer.loop.run_until_complete(trainer.collector.collect(one_turn, [2]))
    assert engine.vision.encoded == encoded  # the same board, the same weights: the cached features
    # One real update on a group with a reward spread (the images come from the trajectories' store).
    group = [dataclasses.replace(t, group_id=0, sample_index=i, reward=float(i), rewards=[0.0] * (len(t.rewards) - 1) + [float(i)])
             for i, t in enumerate([first, again])]
    tower = vlm.base_model(trainer.learner.policy).model.connector.modality_projection.proj.weight
    before, version = tower.detach().clone(), trainer.learner.version
    metrics = trainer.learner.train_on(group)
    assert trainer.learner.version == version + 1 and metrics["batch/trajectories_trained"] == 2
    assert not torch.equal(before, tower.detach())  # the connector trained
    trainer.sync_weights()
    [after] = trainer.loop.run_until_complete(trainer.collector.collect(one_turn, [2]))
    assert engine.vision.encoded == encoded + 1  # the board encoded once more, with the new weights
    assert after.images == first.images
    assert_token_exact(trainer, [after])


@dataclasses.dataclass
class ProbeCall:
    prompt_ids: list[int]
    images: list[Any]
    token: int
    logprob: float


class ReferenceTurns:
    """An engine whose turns are the env's reference policy (so the episode moves and shows new
    images), each call also sent to the real engine with the same prompt ids and images for one
    sampled token: that token and its logprob are recorded."""

    def __init__(self, engine: Any, tokenizer: Any, script: Any):
        self.engine, self.tokenizer, self.script = engine, tokenizer, script
        self.eos_token_ids = engine.eos_token_ids
        self.calls: list[ProbeCall] = []

    async def generate(self, prompt_ids, params, *, images=()):
        real = await self.engine.generate(prompt_ids, dataclasses.replace(params, max_tokens=1), images=images)
        self.calls.append(ProbeCall(list(prompt_ids), list(images), real.token_ids[0], real.logprobs[0]))
        text = self.script()  # a move (ends on the stop string) or a turn ending with <|im_end|>
        ids = self.tokenizer.encode(text, add_special_tokens=False)
        stop = ids[-1] if text.endswith("<|im_end|>") else "</move>"
        return Completion(ids, [0.0] * len(ids), "stop", text, stop_reason=stop)


def probe_collector(trainer, probe: ReferenceTurns) -> Collector:
    config = dataclasses.replace(trainer.collector.config, max_tokens=48, max_response_tokens=256, trace_path=None)
    return Collector(probe, trainer.tokenizer, config, processor=trainer.collector.renderer.processor)


def probe_exact(trainer, calls: list[ProbeCall]) -> None:
    rows = [Trajectory(env_id="probe", task_id=0, group_id=0, sample_index=i, token_ids=[*c.prompt_ids, c.token],
                       loss_mask=[0] * len(c.prompt_ids) + [1], engine_logprobs=[0.0] * len(c.prompt_ids) + [c.logprob],
                       prompt_len=len(c.prompt_ids), images=c.images)
            for i, c in enumerate(calls)]
    assert_token_exact(trainer, rows)


def test_each_move_shows_a_new_board_to_the_engine_and_stays_exact(trainer):
    tok, envs = trainer.tokenizer, []

    def make():
        envs.append(grid_env())
        return envs[-1]

    def move():
        return envs[-1].reference_action()

    probe = ReferenceTurns(trainer.engine, tok, move)
    col = probe_collector(trainer, probe)
    [traj] = trainer.loop.run_until_complete(col.collect(make, [3]))
    col.close()
    assert traj.error is None and traj.terminated and traj.success, traj.info
    n = len(probe.calls)
    assert n >= 2 and [len(c.images) for c in probe.calls] == list(range(1, n + 1))
    # Every board the model saw, each a new image (the solved board after the last move ends the episode).
    assert len(traj.images) == n == len(set(traj.images))
    for c in probe.calls:  # the images sent are the trajectory's, the prompt holds each one's run
        assert image_runs(c.prompt_ids, tok) == [image_run(tok)] * len(c.images)
        assert all(a is b for a, b in zip(c.images, traj.image_list(), strict=False))
    probe_exact(trainer, probe.calls)


def test_a_zoom_tool_result_image_reaches_the_engine(trainer):
    tok, envs = trainer.tokenizer, []

    def make():
        envs.append(gym.make("ChartQA-v0", num_tasks=4, image_size=128, max_turns=3).unwrapped)
        return envs[-1]

    def turn():
        action = envs[-1].reference_action()  # a zoom call, then the gold answer
        if isinstance(action, str):
            return action + "<|im_end|>"
        call = action["tool_calls"][0]["function"]
        return f'<tool_call>\n{{"name": "{call["name"]}", "arguments": {call["arguments"]}}}\n</tool_call><|im_end|>'

    probe = ReferenceTurns(trainer.engine, tok, turn)
    col = probe_collector(trainer, probe)
    [traj] = trainer.loop.run_until_complete(col.collect(make, [0]))
    col.close()
    assert traj.error is None and traj.success, traj.info
    assert [len(c.images) for c in probe.calls] == [1, 2]  # the chart, then the chart and the zoom
    assert traj.messages[3]["role"] == "tool" and traj.messages[3]["content"][1] == {"type": "image", "ref": traj.images[1]}
    assert image_runs(probe.calls[1].prompt_ids, tok) == [image_run(tok)] * 2
    probe_exact(trainer, probe.calls)


def test_a_checkpoint_of_the_run_is_a_vlm_directory_with_its_processor(trainer, tmp_path):
    ckpt = trainer.learner.save(tmp_path, 1, {})
    proc = vlm.load_processor(ckpt / "policy")
    assert proc is not None and proc.image_seq_len == 16  # was: the tokenizer alone, no processor_config.json
    assert proc.tokenizer.chat_template == trainer.tokenizer.chat_template


def test_chatgym_rollout_with_smolvlm_collects_image_episodes(tmp_path):
    from chatgym.trainer.rollout import cli as rollout_cli

    out = tmp_path / "t.jsonl"
    code = rollout_cli.main(["--env", "VisualGrid-v0", "--engine", "hf", "--model", "smolvlm", "-n", "1",
                             "--max-tokens", "2", "--out", str(out), "--no-progress",
                             *(f"--env-arg={k}={v}" for k, v in {**GRID, "max_turns": 1}.items())])
    [rec] = [json.loads(line) for line in out.read_text().splitlines()]
    assert code == 0 and rec["error"] is None  # was image_error: the CLI's collector had no processor
    assert len(rec["images"]) == 1 and len(rec["token_ids"]) == rec["prompt_len"] + 2
