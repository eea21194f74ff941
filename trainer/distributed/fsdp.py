"""FSDP2 for the Ray learners (``trainer.ray.learner_sharding: fsdp``): sharding the policy (and
critic) after it is built, and checkpoints in the one-learner format (``optimizer.state_dict()`` keyed
by parameter index), so a run saved with FSDP resumes locally and the other way round.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch


def sharding(cfg: Any) -> str:
    """``trainer.ray.learner_sharding`` resolved: ``auto`` is ``replicate`` on every device. On two H200s
    with SmolLM2-135M, 2 replicate learners gave 1.80x one learner's training tokens/s and 2 FSDP2
    learners 0.67x (a small model is launch-bound; sharding adds per-layer all-gathers), so FSDP2 is
    for models that do not fit one device, asked for by name."""
    mode = cfg.trainer.ray.learner_sharding
    return "replicate" if mode == "auto" else mode


def shard(learner: Any, ckpt: str | None) -> None:
    """FSDP2 ``fully_shard`` each decoder layer, then the whole model, of the policy (and critic);
    rebuild the optimizers over the sharded parameters and restore a checkpoint's optimizer state.

    Raises:
        ValueError: LoRA (its merged export needs the whole model on every rank; use
            ``trainer.ray.learner_sharding: replicate``).
    """
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import FSDPModule, fully_shard

    if learner.cfg.lora.enabled:
        raise ValueError("trainer.ray.learner_sharding: fsdp does not take lora.enabled; use replicate")
    mesh = init_device_mesh(learner.device.type, (dist.get_world_size(),))
    for model in (learner.policy, learner.critic):
        if model is None:
            continue
        for module in model.modules():
            if type(module).__name__.endswith("DecoderLayer"):
                fully_shard(module, mesh=mesh)
        fully_shard(model, mesh=mesh)
        for module in model.modules():
            if isinstance(module, FSDPModule):
                # Sums, as the one-learner gradient (the default divides by the world size), with
                # plain SUM collectives (gloo has no pre-multiplied sum).
                module.set_gradient_divide_factor(1.0)
                module.set_force_sum_reduction_for_comms(True)
    # The optimizers were built over the unsharded parameters: build them again over the shards.
    learner.state = learner._build_optimizers()
    if ckpt:
        _restore_sharded_optimizer(learner, Path(ckpt))


def save_sharded(
    learner: Any, rank: int, output_dir: str, steps_done: int, config_dict: dict, kwargs: dict
) -> str | None:
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        get_model_state_dict,
        get_optimizer_state_dict,
    )

    from chatgym.trainer.learner.checkpoint import save_checkpoint
    from chatgym.trainer.learner.learner import StateBundle

    full = StateDictOptions(full_state_dict=True, cpu_offload=True)
    parts = {"policy": (learner.policy, learner.state.optimizer)}
    if learner.critic is not None:
        parts["critic"] = (learner.critic, learner.state.critic_optimizer)
    models, optims = {}, {}
    for key, (model, optim) in parts.items():
        models[key] = get_model_state_dict(model, options=full)
        optims[key] = get_optimizer_state_dict(model, optim, options=full)  # rank 0 only: {} elsewhere
    if rank != 0:
        return None
    optims = {key: _by_index(parts[key][0], osd) for key, osd in optims.items()}
    scheduler = StateBundle(policy=learner.state.scheduler, critic=learner.state.critic_scheduler)
    path = save_checkpoint(
        Path(output_dir),
        steps_done,
        policy=_Saved(learner.policy, models["policy"]),
        tokenizer=learner.tokenizer,
        optimizer=_Plain(optims),
        scheduler=scheduler,
        critic=_Saved(learner.critic, models["critic"]) if learner.critic is not None else None,
        config=config_dict,
        keep=learner.cfg.train.keep_checkpoints,
        rng_extra={"update_generator": learner.update_generator.get_state()},
        **kwargs,
    )
    return str(path)


def _restore_sharded_optimizer(learner: Any, ckpt: Path) -> None:
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

    from chatgym.trainer.learner.checkpoint import load_trainer_state

    saved = load_trainer_state(ckpt)
    full = StateDictOptions(full_state_dict=True)
    pairs = [("policy", learner.policy, learner.state.optimizer, learner.state.scheduler)]
    if learner.critic is not None:
        pairs.append(("critic", learner.critic, learner.state.critic_optimizer, learner.state.critic_scheduler))
    for key, model, optim, sched in pairs:
        set_optimizer_state_dict(model, optim, _by_name(model, saved["optimizer"][key]), options=full)
        sched.load_state_dict(saved["scheduler"][key])


def _trainable_names(model: Any) -> list[str]:
    return [n for n, p in model.named_parameters() if p.requires_grad]


def _by_index(model: Any, osd: dict[str, Any]) -> dict[str, Any]:
    """A full optimizer state dict keyed by parameter name -> keyed by index (``Optimizer.state_dict``:
    the order of the trainable parameters); a tied parameter's every name maps to its one index."""
    order = {id(p): i for i, p in enumerate(p for p in model.parameters() if p.requires_grad)}
    index = {n: order[id(p)] for n, p in model.named_parameters(remove_duplicate=False) if id(p) in order}
    return {
        "state": {index[n]: v for n, v in osd["state"].items()},
        "param_groups": [{**g, "params": [index[n] for n in g["params"]]} for g in osd["param_groups"]],
    }


def _by_name(model: Any, osd: dict[str, Any]) -> dict[str, Any]:
    names = _trainable_names(model)
    return {
        "state": {names[i]: v for i, v in osd["state"].items()},
        "param_groups": [{**g, "params": [names[i] for i in g["params"]]} for g in osd["param_groups"]],
    }


class _Saved:
    """``save_pretrained`` of a sharded model from its gathered full state dict."""

    def __init__(self, model: Any, state: dict[str, torch.Tensor]):
        self.model, self.state = model, state

    def save_pretrained(self, path: Any, **kwargs: Any) -> None:
        self.model.save_pretrained(path, state_dict=self.state, **kwargs)


class _Plain:
    def __init__(self, state: dict[str, Any]):
        self.state = state

    def state_dict(self) -> dict[str, Any]:
        return self.state
