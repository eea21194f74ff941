"""A tiny env and model for training-loop tests (no dataset, no real weights)."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import Any

import gymnasium as gym

from chatgym.envs import messages as M
from chatgym.envs.core import AssistantTurn, ChatEnv, StepOutcome

LETTERS_ENV_ID = "ChatgymTestLetters-v0"

# 2 layers, width 64: ~3.2 M parameters (mostly SmolLM2's 49,152-token embedding), fast on CPU.
TINY_LLAMA = {
    "num_hidden_layers": 2,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
}


class LettersEnv(ChatEnv):
    """One turn; reward = share of ASCII letters in the reply, so samples of a random model get
    different rewards (non-zero GRPO advantages) without any dataset."""

    def __init__(self, **kwargs: Any):
        super().__init__(max_turns=1, **kwargs)

    def load_tasks(self, split: str) -> list[dict[str, Any]]:
        count = 6 if split == "train" else 3
        return [{"task_id": f"{split}/{i}", "prompt": f"Write word number {i}."} for i in range(count)]

    def initial_messages(self, task: dict[str, Any]) -> list[M.Message]:
        return [M.user(task["prompt"])]

    async def score(self, turn: AssistantTurn) -> StepOutcome:
        text = turn.raw_text
        share = sum(c.isascii() and c.isalpha() for c in text) / max(len(text), 1)
        return StepOutcome(reward=share, terminated=True, info={"reward_components": {"letters": share}})


OUTCOMES_ENV_ID = "ChatgymTestOutcomes-v0"
# Each task's outcome, whatever the reply: a reward and success on the first turn; or a crash at
# reset; or a reward of 0.25 on the first turn, then a crash on the second (a failed episode that
# had earned reward before it failed).
OUTCOMES = (
    {"reward": 1.0, "success": True},
    {"reward": 0.5, "success": False},
    {"crash": "reset"},
    {"crash": "turn 2"},
)


class OutcomesEnv(ChatEnv):
    """Up to two turns; each task scripts its outcome (:data:`OUTCOMES`), failures included."""

    def __init__(self, **kwargs: Any):
        super().__init__(max_turns=2, **kwargs)

    def load_tasks(self, split: str) -> list[dict[str, Any]]:
        return [{"task_id": f"{split}/{i}", **outcome} for i, outcome in enumerate(OUTCOMES)]

    def initial_messages(self, task: dict[str, Any]) -> list[M.Message]:
        if task.get("crash") == "reset":
            raise RuntimeError("the env crashed at reset")
        return [M.user("Say anything.")]

    async def score(self, turn: AssistantTurn) -> StepOutcome:
        task = self.task or {}
        if "crash" not in task:
            return StepOutcome(reward=task["reward"], terminated=True, info={"success": task["success"]})
        if self.turn == 1:
            return StepOutcome(messages=[M.user("Again.")], reward=0.25)
        raise RuntimeError("the env crashed on turn 2")


def register() -> None:
    if LETTERS_ENV_ID not in gym.registry:
        gym.register(id=LETTERS_ENV_ID, entry_point=LettersEnv, disable_env_checker=True)
    if OUTCOMES_ENV_ID not in gym.registry:
        gym.register(id=OUTCOMES_ENV_ID, entry_point=OutcomesEnv, disable_env_checker=True)


def record_collects(trainer: Any) -> dict[int, list]:
    """Wrap ``trainer.rollout.collect`` so every training request's trajectories land in the returned
    dict, by step (evaluation requests are not recorded)."""
    seen: dict[int, list] = {}
    collect = trainer.rollout.collect

    async def recording(request: Any) -> list:
        trajs = await collect(request)
        if not request.eval:
            seen[request.step] = trajs
        return trajs

    trainer.rollout.collect = recording
    return seen


@contextlib.contextmanager
def file_size_limit(limit: int) -> Iterator[None]:
    """Run the block with this process's files capped at ``limit`` bytes (RLIMIT_FSIZE), SIGXFSZ
    ignored so a write past it fails with EFBIG (as a full disk's fails with ENOSPC) instead of killing
    the process; both restored after. A real refused write, for the disk-full paths."""
    import resource
    import signal

    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    old = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        signal.signal(signal.SIGXFSZ, old)


@contextlib.contextmanager
def fsdp2_one_rank(model: Any, tmp_path: Any) -> Iterator[Any]:
    """``model`` sharded by FSDP2 over one gloo rank as ``trainer.ray.learner_sharding: fsdp`` shards
    it (each decoder layer, then the whole model); the process group is destroyed after."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    dist.init_process_group("gloo", store=dist.FileStore(str(tmp_path / "store"), 1), rank=0, world_size=1)
    try:
        mesh = init_device_mesh("cpu", (1,))
        for layer in model.model.layers:
            fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)
        yield model
    finally:
        dist.destroy_process_group()


@contextlib.contextmanager
def torch_threads(n: int) -> Iterator[None]:
    """Run the block with ``n`` torch CPU threads, in this process and in every process started inside
    it (``OMP_NUM_THREADS``, read by the trainer's ``cpu_threads()``, by Ray workers, by torch in a
    subprocess); both are restored after.

    Why: float32 sums split over a different number of threads round differently, so two runs
    compared to a few ulps must use one thread count. Measured with four AdamW steps (lr 1e-3) of a
    model of TINY_LLAMA's shape: on an AMX Xeon (amx_bf16, torch 2.11) the weights of 2, 4 and 16
    threads were up to 1.3e-6, 2.3e-6 and 1.6e-6 from those of 1 thread, two 1-thread runs 0 apart;
    on an AVX-512 BF16 EPYC (torch 2.13) every count gave the same bits. Ray gives an actor
    ``OMP_NUM_THREADS=floor(num_cpus)`` (1 for a fractional CPU) unless the driver's environment
    sets it; a local ``Learner`` uses every core unless it is set.
    """
    import torch

    saved_env, saved_threads = os.environ.get("OMP_NUM_THREADS"), torch.get_num_threads()
    os.environ["OMP_NUM_THREADS"] = str(n)
    torch.set_num_threads(n)
    try:
        yield
    finally:
        if saved_env is None:
            os.environ.pop("OMP_NUM_THREADS", None)
        else:
            os.environ["OMP_NUM_THREADS"] = saved_env
        torch.set_num_threads(saved_threads)


def interrupt_in_second_step(monkeypatch: Any, interrupt: Any) -> None:
    """Make the training loop call ``interrupt()`` (raise KeyboardInterrupt, send this process a
    signal, ...) as its second step starts, after step 1 has been logged (and checkpointed with
    ``train.save_every=1``)."""
    from chatgym.trainer.pipeline import Pipeline

    sync_step = Pipeline.sync_step

    async def interrupted(self: Any, i: int) -> Any:
        if i == 1:
            interrupt()
        return await sync_step(self, i)

    monkeypatch.setattr(Pipeline, "sync_step", interrupted)
