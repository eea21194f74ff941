"""The learner role: the policy (+ reference, critic), their optimizers and the update, in one object.

    learner = Learner(cfg, tokenizer, ckpt=None)
    metrics = learner.train_on(trajectories)        # prepare_batch -> update; version += 1
    engine.update_weights(learner.export_weights(torch.bfloat16))
    learner.save(output_dir, steps_done)

The training loop (:mod:`chatgym.trainer.train`) holds one of these in process; a distributed run
holds one per learner process (``trainer/distributed``). It sees trajectories, never the collector or
the engine that made them.
"""

from __future__ import annotations

import dataclasses
import random
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from chatgym.trainer.config.loader import ConfigError
from chatgym.trainer.learner.checkpoint import load_trainer_state, save_checkpoint, set_rng_state
from chatgym.trainer.learner.forward import ForwardPlan, resolve_pack
from chatgym.trainer.learner.lm_head import chunked_head_refusal
from chatgym.trainer.learner.optim import build_optimizer
from chatgym.trainer.learner.policy import (
    autocast_context,
    cpu_threads,
    export_weights,
    load_critic,
    load_policy,
    resolve_compute_dtype,
    resolve_device,
    trainable_parameters,
)
from chatgym.trainer.learner.prepare import prepare_batch
from chatgym.trainer.learner.reference import ReferencePolicy
from chatgym.trainer.learner.update import UpdateState, update
from chatgym.trainer.models.cuda import without_cudnn_attention
from chatgym.trainer.models.packaged import processor_for
from chatgym.trainer.models.vlm import ImagePixels, is_vlm
from chatgym.trainer.rollout.types import Trajectory


def seed_everything(seed: int) -> None:
    """Seed Python's, NumPy's and torch's global generators with ``seed``."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def build_seeded_learner(cfg: Any, tokenizer: Any, ckpt: Path | None = None) -> Learner:
    """The run's :class:`Learner` as every process builds it — the local trainer and each Ray learner
    actor call this one function, so the two cannot drift: the global generators seeded with
    ``train.seed`` right before the construction (the seed fixes the random initial weights), then
    the learner, which resolves everything else the update depends on itself (compute dtype and
    autocast, torch threads on CPU, packing, prompt sharing vs gradient checkpointing, micro-batch
    size; SDPA's cuDNN backend is switched off inside every ``train_on``)."""
    seed_everything(cfg.train.seed)
    return Learner(cfg, tokenizer, ckpt)


class Learner:
    """Policy, reference, critic, optimizers and the update of one training run.

    Args:
        config: the run's :class:`~chatgym.trainer.config.run.Config` (``model``, ``lora``, ``algo``,
            ``optim``, ``train`` and ``rollout.max_response_tokens`` are read).
        tokenizer: the model's tokenizer (its pad id pads batches; saved with checkpoints).
        ckpt: a checkpoint directory to restore (weights, optimizer, scheduler, RNG, step), or None.

    Attributes:
        version: the policy weight version: 0 at start (or the checkpoint's step), +1 per update.
        start_step: the step a restored checkpoint ends at (0 for a fresh run).

    The construction order (policy, reference, critic, optimizers) is the random-init order and must
    not change: a run's seed fixes its initial weights.

    Raises:
        ConfigError: ``model.logprob_chunk_tokens`` set for a policy whose logits the chunked head
            would get wrong (:func:`~chatgym.trainer.learner.lm_head.chunked_head_refusal`).
    """

    def __init__(self, config: Any, tokenizer: Any, ckpt: Path | None = None):
        self.cfg = cfg = config
        self.tokenizer = tokenizer
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
        self.device = resolve_device(cfg.model.device)
        self._set_up_compute()
        self.plan = ForwardPlan(
            micro_batch_size=cfg.train.micro_batch_size,
            device=self.device,
            share_prefix=self.share_prefix,
            pack=self.pack,
            pack_max_tokens=self.pack_max_tokens,
            autocast=self._autocast,
            logprob_chunk_tokens=cfg.model.logprob_chunk_tokens,
        )
        self.policy = self._load_policy(ckpt)
        if cfg.model.logprob_chunk_tokens is not None and (why := chunked_head_refusal(self.policy)):
            raise ConfigError(why)
        # A vision-language policy's images -> pixel values, each distinct image processed once.
        # Its processor is saved into every checkpoint, so a checkpoint's policy is a loadable VLM directory.
        self.processor = processor_for(cfg.model.path, tokenizer) if is_vlm(self.policy) else None
        self.pixels = ImagePixels(self.processor.image_processor) if self.processor is not None else None
        self.reference = (
            ReferencePolicy.load(cfg.model, cfg.lora, self.policy, self.plan)
            if cfg.algo.kl_coef > 0
            else None
        )
        self.critic = self._load_critic(ckpt)
        self.state = self._build_optimizers()
        self.start_step = 0
        self.update_generator = torch.Generator().manual_seed(cfg.train.seed)
        if ckpt is not None:
            self._restore(ckpt)
        self.version = self.start_step

    # ---- the update -----------------------------------------------------------------------------

    def train_on(self, trajs: Sequence[Trajectory]) -> dict[str, float]:
        """Prepare the batch of ``trajs`` (rewards, advantages, reference/old logprobs) and update the
        policy (and critic) on it; ``version`` goes up by one when an update ran (a batch whose groups
        were all filtered out updates nothing). Returns the batch's and the update's metrics."""
        cfg = self.cfg
        # Every batch is padded to its longest row, so most have a length not seen before: no cuDNN
        # attention, which builds a plan per new shape (0.2-1.7 s on an H200; models.without_cudnn_attention).
        with without_cudnn_attention(self.device):
            batch, metrics = self.prepare(trajs)
            if batch is None:
                return metrics
            t_update = time.perf_counter()
            metrics.update(
                update(
                    self.state,
                    batch,
                    cfg.algo,
                    self.plan,
                    max_grad_norm=cfg.optim.max_grad_norm,
                    generator=self.update_generator,
                )
            )
            update_s = time.perf_counter() - t_update
        passes = cfg.algo.ppo_epochs * (2 if self.critic is not None else 1)
        metrics["timing/update_s"] = update_s
        metrics["throughput/train_tokens_per_s"] = (
            float(batch.attention_mask.sum()) * passes / max(update_s, 1e-9)
        )
        self.version += 1
        return metrics

    def prepare(self, trajs: Sequence[Trajectory]) -> tuple[Any, dict[str, float]]:
        """``prepare_batch`` of ``trajs`` with this learner's models and plan: the ``TokenBatch`` (None
        when every group was filtered out) and the batch's metrics."""
        return prepare_batch(
            trajs,
            self.cfg.algo,
            max_response_tokens=self.cfg.rollout.max_response_tokens,
            pad_id=self.pad_id,
            policy=self.policy,
            plan=self.plan,
            reference=self.reference,
            critic=self.critic,
            pixels=self.pixels,
        )

    def use_data_parallel(self, data_parallel: Any) -> None:
        """Make this learner one rank of a data-parallel update: ``data_parallel`` (a
        :class:`~chatgym.trainer.distributed.data_parallel.DataParallel`) goes into the plan of the
        update and of every preparation pass (the reference's included), so each rank prepares and
        trains only its share of the micro-batches."""
        self.plan = dataclasses.replace(self.plan, data_parallel=data_parallel)
        if self.reference is not None:
            self.reference.plan = self.plan

    def export_weights(self, dtype: torch.dtype | None = None) -> Iterator[tuple[str, torch.Tensor]]:
        """The plain model's weights by name (LoRA merged), cast to ``dtype`` on the way (fp32 master
        weights -> an engine's bf16: half the bytes to move, no conversion inside the engine)."""
        for name, tensor in export_weights(self.policy):
            yield name, tensor if dtype is None else tensor.to(dtype)

    def base_model(self) -> Any:
        return self.policy.get_base_model() if hasattr(self.policy, "get_base_model") else self.policy

    # ---- checkpoints ----------------------------------------------------------------------------

    def save(
        self,
        output_dir: str | Path,
        steps_done: int,
        config_dict: dict[str, Any],
        pipeline_state: dict[str, Any] | None = None,
    ) -> Path:
        """Write ``output_dir/checkpoints/step_NNNNNN`` (see :mod:`.checkpoint`); returns its path.
        ``pipeline_state`` (the async pipeline's buffer) goes into the same state file."""
        optimizer = StateBundle(policy=self.state.optimizer, critic=self.state.critic_optimizer)
        scheduler = StateBundle(policy=self.state.scheduler, critic=self.state.critic_scheduler)
        return save_checkpoint(
            Path(output_dir),
            steps_done,
            policy=self.policy,
            tokenizer=self.processor if self.processor is not None else self.tokenizer,
            optimizer=optimizer,
            scheduler=scheduler,
            critic=self.critic,
            config=config_dict,
            keep=self.cfg.train.keep_checkpoints,
            rng_extra={"update_generator": self.update_generator.get_state()},
            pipeline_state=pipeline_state,
        )

    def _restore(self, ckpt: Path) -> None:
        saved = load_trainer_state(ckpt)
        self.state.optimizer.load_state_dict(saved["optimizer"]["policy"])
        self.state.scheduler.load_state_dict(saved["scheduler"]["policy"])
        if self.critic is not None:
            self.state.critic_optimizer.load_state_dict(saved["optimizer"]["critic"])
            self.state.critic_scheduler.load_state_dict(saved["scheduler"]["critic"])
        set_rng_state(saved["rng"])
        self.update_generator.set_state(saved["rng"]["update_generator"])
        self.start_step = int(saved["step"])

    # ---- set-up -------------------------------------------------------------------------------

    def _set_up_compute(self) -> None:
        """Resolve the machine-dependent choices once, at start, and log them in one line (they are not
        written into ``config.yaml``: ``model.compute_dtype: auto`` stays ``auto`` there).

        - ``compute_dtype``: :func:`~chatgym.trainer.learner.policy.resolve_compute_dtype` (bf16 autocast on
          CUDA and native-bf16 CPUs, fp32 on AVX2-only CPUs); used by the update and by the reference
          and old-logprob passes.
        - ``pack``, ``pack_max_tokens``: ``model.pack`` / ``model.pack_max_tokens`` for the device
          (:func:`~chatgym.trainer.learner.forward.resolve_pack`; ``auto``: packed micro-batches
          without padding on CPU, :func:`~chatgym.trainer.learner.forward.forward_logprobs_packed`,
          padded on CUDA).
        - torch threads on CPU: set here once to the cores this process may use.
        - ``model.logprob_chunk_tokens`` (when set) is named in the line too.
        """
        model = self.cfg.model
        self.compute_dtype, reason = resolve_compute_dtype(model.compute_dtype, model.dtype, self.device)
        self.pack, self.pack_max_tokens = resolve_pack(model.pack, model.pack_max_tokens, self.device)
        threads = ""
        if self.device.type == "cpu":
            torch.set_num_threads(cpu_threads())
            threads = f", {torch.get_num_threads()} torch threads"
        mixed = " autocast" if self.compute_dtype != model.dtype else ""
        layout = (
            f"packed micro-batches (<= {self.pack_max_tokens} tokens)"
            if self.pack
            else "padded micro-batches"
        )
        if model.logprob_chunk_tokens is not None:
            layout += f", lm head in chunks of {model.logprob_chunk_tokens} positions"
        print(
            f"chatgym: training compute {self.compute_dtype}{mixed} over {model.dtype} weights on "
            f"{self.device} ({reason}){threads}, {layout}",
            file=sys.stderr,
        )

    @property
    def share_prefix(self) -> bool:
        # Gradient checkpointing makes transformers drop the KV cache the padded shared forward relies
        # on; the packed one lays the prompt down once in the sequence and needs no cache.
        checkpointing = self.cfg.model.gradient_checkpointing and not self.pack
        return self.cfg.train.share_prompt_prefix and not checkpointing

    def _autocast(self) -> Any:
        """Mixed precision per the resolved ``compute_dtype`` (see :meth:`_set_up_compute`)."""
        return autocast_context(self.device, self.compute_dtype, self.cfg.model.dtype)

    def _load_policy(self, ckpt: Path | None) -> Any:
        cfg = self.cfg
        if ckpt is None:
            return load_policy(cfg.model, cfg.lora, self.device)
        if cfg.lora.enabled:
            from peft import PeftModel

            base = load_policy(cfg.model, dataclasses.replace(cfg.lora, enabled=False), self.device)
            return PeftModel.from_pretrained(base, ckpt / "policy", is_trainable=True).train()
        model_cfg = dataclasses.replace(cfg.model, path=str(ckpt / "policy"), random_init=False)
        return load_policy(model_cfg, cfg.lora, self.device)

    def _load_critic(self, ckpt: Path | None) -> Any:
        if not self.cfg.model.value_head:
            return None
        if ckpt is None:
            return load_critic(self.cfg.model, self.device)
        return load_critic(
            dataclasses.replace(self.cfg.model, path=str(ckpt / "critic"), random_init=False), self.device
        )

    def _build_optimizers(self) -> UpdateState:
        cfg = self.cfg
        updates = cfg.train.max_steps * cfg.algo.ppo_epochs * cfg.algo.mini_batches
        optimizer, scheduler = build_optimizer(
            [(trainable_parameters(self.policy), cfg.optim.lr)], cfg.optim, updates
        )
        state = UpdateState(self.policy, optimizer, scheduler)
        if self.critic is not None:
            state.critic = self.critic
            state.critic_optimizer, state.critic_scheduler = build_optimizer(
                [(trainable_parameters(self.critic), cfg.optim.value_lr or cfg.optim.lr)], cfg.optim, updates
            )
        return state


class StateBundle:
    """Several optimizers/schedulers saved and restored as one ``state_dict``."""

    def __init__(self, **parts: Any):
        self.parts = {k: v for k, v in parts.items() if v is not None}

    def state_dict(self) -> dict[str, Any]:
        return {k: v.state_dict() for k, v in self.parts.items()}
