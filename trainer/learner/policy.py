"""Loading the networks a run trains: the policy (optionally with LoRA) and a critic (value model);
the weights the engine receives after each update; the training device and compute dtype.
(The KL reference is :class:`chatgym.trainer.learner.reference.ReferencePolicy`; model files — packaged
models, local directories, random init — are :mod:`chatgym.trainer.models`.)
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import Any

import torch

from chatgym.trainer.config.loader import ConfigError
from chatgym.trainer.config.run import LoraConfig, ModelConfig
from chatgym.trainer.models.dtype import (
    NATIVE_BF16_FLAGS,
    choose_compute_dtype,
    cpu_bf16_time_ratio,
    cpu_flags,
    resolve_dtype,
)
from chatgym.trainer.models.packaged import load_model_path
from chatgym.trainer.models.random_init import random_model
from chatgym.trainer.models.vlm import auto_model_class, is_vision_config, is_vlm, vision_modules


def resolve_device(device: str) -> torch.device:
    """``auto`` -> ``cuda`` when available, else ``cpu``; anything else as given.

    Raises:
        ConfigError: (a ValueError) ``cuda`` asked for on a machine without CUDA, or a string torch does
            not read as a device (names ``model.device``).
    """
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as exc:
        raise ConfigError(f"model.device: {device!r} is not a device (auto, cpu, cuda, cuda:N): {exc}") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"model.device is {device!r} but CUDA is not available (model.device: auto picks it when there is one)")
    return dev


def resolve_compute_dtype(
    compute_dtype: str, weights_dtype: str, device: torch.device, flags: frozenset[str] | None = None
) -> tuple[str, str]:
    """The dtype the training matmuls run in, and why (for the start-up log line).

    Args:
        compute_dtype: ``model.compute_dtype`` (``auto`` or a dtype name).
        weights_dtype: ``model.dtype``, the weights' dtype.
        device: the training device.
        flags: CPU flags (default: this machine's, :func:`chatgym.trainer.models.dtype.cpu_flags`).

    Returns:
        ``(dtype name, reason)``. An explicit ``compute_dtype`` is kept; ``auto`` over non-fp32 weights
        is the weights' dtype; ``auto`` over fp32 weights is
        :func:`chatgym.trainer.models.dtype.choose_compute_dtype` (bf16 on CUDA and on native-bf16 CPUs
        where, when ``flags`` is None, a bf16 matmul also measures faster than fp32:
        :func:`~chatgym.trainer.models.dtype.cpu_bf16_time_ratio`).
    """
    if compute_dtype != "auto":
        return compute_dtype, "model.compute_dtype"
    if weights_dtype != "float32":
        return weights_dtype, f"the weights' dtype (model.dtype {weights_dtype})"
    if flags is not None:  # given flags (tests): the rule alone
        return choose_compute_dtype(device.type, flags)
    if device.type != "cpu":
        return choose_compute_dtype(device.type, frozenset())
    flags = cpu_flags()  # this machine: its flags, and whether bf16 is in fact faster here
    native = any(f in flags for f in NATIVE_BF16_FLAGS)
    return choose_compute_dtype("cpu", flags, cpu_bf16_time_ratio() if native else None)


def autocast_context(device: torch.device, compute_dtype: str, weights_dtype: str) -> Any:
    """A fresh ``torch.autocast`` to ``compute_dtype`` on ``device``, or a no-op when it equals the
    weights' dtype (call it once per ``with``)."""
    if compute_dtype == weights_dtype:
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=getattr(torch, compute_dtype))


def cpu_threads() -> int:
    """Torch intra-op threads for the trainer on CPU: ``$OMP_NUM_THREADS`` when set (a user sharing the
    machine), else every core this process may run on (``os.sched_getaffinity``), which is what the
    update's matmuls scale with."""
    env = os.environ.get("OMP_NUM_THREADS", "")
    if env.isdigit() and int(env) > 0:
        return int(env)
    try:
        return max(len(os.sched_getaffinity(0)), 1)
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def load_policy(cfg: ModelConfig, lora: LoraConfig, device: torch.device) -> Any:
    """The trainable policy: a transformers causal LM or vision-language model in train mode (a peft
    model with ``lora.enabled``).

    A VLM's vision tower is frozen with ``cfg.freeze_vision`` (its connector always trains). Under
    LoRA the adapters go on the language side only (``lora.target_modules`` inside the text model) and
    on the connector, and also on the vision tower's linear layers unless ``cfg.freeze_vision``: every
    base weight stays frozen, so the reference (adapters off) is the initial model, vision included.

    Raises:
        ModuleNotFoundError: LoRA asked for without ``peft`` installed (names the extra).
        ValueError: ``model.freeze_vision`` for a model without a vision tower.
    """
    from transformers import AutoConfig

    dtype = resolve_dtype(cfg.dtype)
    if cfg.random_init:
        model = random_model(cfg.path, dtype=dtype, device=device, **cfg.config_overrides)
    else:
        path = load_model_path(cfg.path)
        model = auto_model_class(AutoConfig.from_pretrained(path)).from_pretrained(path, dtype=dtype).to(device)
    vlm = is_vlm(model)
    if cfg.freeze_vision and not vlm:
        raise ValueError(f"model.freeze_vision is set but {cfg.path!r} has no vision tower")
    if cfg.freeze_vision:
        for module in vision_modules(model):
            module.requires_grad_(False)
    # The KV cache is useless in a training forward and costs memory.
    model.config.use_cache = False
    if cfg.gradient_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        # With frozen embeddings (LoRA) checkpointed blocks would otherwise see no input requiring grad.
        model.enable_input_require_grads()
    if lora.enabled:
        try:
            from peft import LoraConfig as PeftLoraConfig
            from peft import get_peft_model
        except ModuleNotFoundError as exc:
            raise ModuleNotFoundError("lora.enabled needs peft: pip install 'chatgym[train]'") from exc
        peft_cfg = PeftLoraConfig(
            r=lora.r,
            lora_alpha=lora.alpha,
            lora_dropout=lora.dropout,
            target_modules=_vlm_lora_targets(lora, cfg.freeze_vision) if vlm else list(lora.target_modules),
            task_type="CAUSAL_LM",
        )
        model = get_peft_model(model, peft_cfg)
    if cfg.compile:
        compile_decoder_layers(model)
    return model.train()


def compile_decoder_layers(model: Any) -> int:
    """``torch.compile`` each decoder layer of ``model`` in place (``nn.Module.compile``; see
    ``model.compile`` in :class:`~chatgym.trainer.config.run.ModelConfig`). Per layer, not the whole
    model, as torchtitan compiles its blocks: every forward layout of the learner (padded, shared
    prompt, packed, the chunked head's decoder call) runs through the layers, and torch's inlining of
    modules lets one graph serve all of them. The weights, their names and gradient checkpointing (it
    wraps the compiled call) are unchanged. Compiled for any sizes (``dynamic=True``): every update's
    batch has another padded length, and the default compiles for the first and again, dynamic, at the
    second (5.4 s of SmolLM2's fifth vs-TRL step on an H100, ``benchmarks/results/fp8_unit_h100_2026-12-06``).

    Args:
        model: a transformers causal LM or VLM, or a peft model around one.

    Returns:
        The number of layers compiled.

    Raises:
        ConfigError: ``model`` has no ``get_decoder().layers`` list (names ``model.compile``; GPT-2's
            blocks are ``transformer.h``): one line at ``chatgym train``'s start.
    """
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    decoder = base.get_decoder() if hasattr(base, "get_decoder") else None
    layers = getattr(decoder, "layers", None)
    if not isinstance(layers, torch.nn.ModuleList) or not len(layers):
        raise ConfigError(
            f"model.compile: {type(base).__name__} has no decoder layer list (get_decoder().layers) to compile"
        )
    for layer in layers:
        layer.compile(dynamic=True)
    return len(layers)


def _vlm_lora_targets(lora: LoraConfig, freeze_vision: bool) -> str:
    """peft's regex of a VLM's adapted layers (see :func:`load_policy`): ``lora.target_modules`` of
    the text model, the connector's projection, and the vision tower's linear layers when it trains."""
    names = "|".join(sorted(lora.target_modules))
    parts = [rf".*text_model\..*\.({names})", r".*connector\.modality_projection\.proj"]
    if not freeze_vision:
        parts.append(r".*vision_model\..*\.(q_proj|k_proj|v_proj|out_proj|fc1|fc2)")
    return "|".join(f"(?:{p})" for p in parts)


def load_critic(cfg: ModelConfig, device: torch.device) -> Any:
    """A value model: the policy's architecture and weights with a scalar head per token
    (``AutoModelForTokenClassification``, one label; the head starts at random, the trunk from the
    policy's weights, as OpenRLHF's critic). Its classifier dropout is 0: transformers' default (0.1)
    made every value pass in train mode random, so old values and GAE targets changed run to run."""
    from transformers import AutoConfig, AutoModelForTokenClassification

    dtype = resolve_dtype(cfg.dtype)
    if cfg.random_init:
        config = random_model(cfg.path, dtype=dtype, **cfg.config_overrides).config
        _text_only_critic(cfg, config)
        config.num_labels = 1
        config.classifier_dropout = 0.0
        torch.manual_seed(1)
        critic = AutoModelForTokenClassification.from_config(config, dtype=dtype)
    else:
        path = load_model_path(cfg.path)
        config = AutoConfig.from_pretrained(path, num_labels=1)
        _text_only_critic(cfg, config)
        config.classifier_dropout = 0.0
        critic = AutoModelForTokenClassification.from_pretrained(path, config=config, dtype=dtype)
    critic.config.use_cache = False
    if cfg.gradient_checkpointing:
        critic.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    return critic.to(device).train()


def _text_only_critic(cfg: ModelConfig, config: Any) -> None:
    if is_vision_config(config):
        raise ValueError(f"model.value_head: {cfg.path!r} is a vision-language model; value heads are text-only")


def _is_peft(model: Any) -> bool:
    return hasattr(model, "get_base_model") and hasattr(model, "peft_config")


def export_weights(policy: Any) -> Iterator[tuple[str, torch.Tensor]]:
    """The policy's full weights under the base model's parameter names, for ``engine.update_weights``.

    A LoRA policy's adapters are merged into the base weights for the duration of the iteration (then
    unmerged), and peft's wrapper names (``base_model.model.``, ``.base_layer``) are removed, so the
    engine sees the plain Hugging Face names; those tensors are copies (one at a time), so a consumer
    that collects them before copying still gets the merged values. A full model's tensors are
    detached views: consume them before the next optimizer step.
    """
    if not _is_peft(policy):
        for name, param in policy.named_parameters():
            yield name, param.detach()
        return
    policy.merge_adapter()
    try:
        for name, param in policy.get_base_model().named_parameters():
            if "lora_" in name:
                continue
            yield name.replace(".base_layer", ""), param.detach().clone()
    finally:
        policy.unmerge_adapter()


def trainable_parameters(model: Any) -> list[torch.nn.Parameter]:
    return [p for p in model.parameters() if p.requires_grad]
