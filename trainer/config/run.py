"""The training run's configuration: frozen dataclasses, loaded from YAML with ``key.sub=value``
overrides, checked field by field so a bad key or value fails at start with its dotted name.

    cfg = load_config("examples/configs/math_grpo.yaml", ["algo.kl_coef=0.01", "train.max_steps=3"])

The loader's rules (unknown keys, types, ``__post_init__`` errors named by their dotted field, YAML
override values) are in :mod:`chatgym.trainer.config.loader`; :func:`load_config` adds the checks that
need the outside world (the env id is registered).
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml

from chatgym.trainer.algos import (
    ADVANTAGE_ESTIMATORS,
    AGGREGATION_MODES,
    KL_ESTIMATORS,
    POLICY_LOSSES,
    TURN_ADVANTAGES,
    check_turn_params,
)
from chatgym.trainer.algos.correction import ROLLOUT_CORRECTIONS
from chatgym.trainer.algos.policy_loss import check_policy_loss_kwargs
from chatgym.trainer.config.env import EnvConfig, check_env_id
from chatgym.trainer.config.loader import (
    ConfigError,
    apply_overrides,
    check_seed,
    config_to_dict,
    from_dict,
    read_config_file,
)
from chatgym.trainer.config.reward import RewardConfig
from chatgym.trainer.config.runner import RayConfig, RunnerConfig
from chatgym.trainer.rollout.config import RolloutConfig

__all__ = [
    "AlgoConfig",
    "Config",
    "ConfigError",
    "EngineConfig",
    "EnvConfig",
    "LoraConfig",
    "ModelConfig",
    "OptimConfig",
    "RayConfig",
    "RewardConfig",
    "RunnerConfig",
    "TrainConfig",
    "apply_overrides",
    "config_to_dict",
    "from_dict",
    "load_config",
    "save_config",
]


def _positive(section: str, **values: float | int | None) -> None:
    for name, value in values.items():  # an inf rate or cap is no setting (null turns a cap off): refused too
        if value is not None and not 0 < value < float("inf"):
            raise ValueError(f"{section}.{name} must be > 0{'' if value <= 0 else ' and finite'}, got {value!r}")


@dataclass(frozen=True)
class ModelConfig:
    """The policy model.

    Attributes:
        path: a packaged model name (``smollm2``) or a local Hugging Face model directory.
        dtype: training dtype (``float32`` or ``bfloat16``; optimizer states follow it).
        device: ``auto`` (CUDA when available, else CPU), ``cpu``, ``cuda``, ``cuda:1``.
        gradient_checkpointing: recompute activations in the backward pass (saves memory).
        random_init: random weights of ``path``'s architecture (GPU checks without the weights).
        config_overrides: architecture changes for ``random_init`` (e.g. ``num_hidden_layers: 2``).
        value_head: add a scalar value head (needed by the ``gae`` advantage estimator).
        compute_dtype: dtype of the matrix products in forward/backward (``torch.autocast``) of the
            update and of the reference / old-logprob passes, the weights staying in ``dtype``.
            ``auto``: with float32 weights, bfloat16 (mixed precision) on CUDA and on a CPU with native
            bf16 (AVX-512 BF16 / AMX) whose bf16 matmul measures faster than fp32 at start, float32
            elsewhere (emulated bf16 is several times slower);
            otherwise the weights' dtype. ``auto`` is resolved when the trainer is built and logged,
            never written back into the saved config (it depends on the machine) — see
            :func:`chatgym.trainer.learner.policy.resolve_compute_dtype`.
        pack: the update's micro-batch layout. ``true``: each micro-batch's rows end to end in one
            sequence, no padding (position ids restart per row, a block-diagonal mask, a GRPO group's
            prompt once); ``false``: right-padded rows. ``auto``: packed on CPU, padded on CUDA (see
            :func:`chatgym.trainer.learner.forward.resolve_pack`). Both give the same logprobs up to
            float rounding.
        pack_max_tokens: tokens per packed forward at most (the block-diagonal mask is a dense (N, N)
            attention, so longer packs spend more on masked-out scores); None: 512 on CPU, 2048 on CUDA
            (:func:`chatgym.trainer.learner.forward.resolve_pack`).
        freeze_vision: a vision-language model's vision tower (``smolvlm``'s SigLIP-style encoder) is
            not trained; its connector and language model are. False (default): the tower trains
            too (under LoRA: adapters on its linear layers). Refused for a model without a vision tower.
        logprob_chunk_tokens: None (default): the model computes the logits of every kept position,
            whose float32 log-softmax autograd keeps until the backward (64 rows x 1,024 tokens x
            49,152 ids: 13 GB). N: lm head -> float32 -> log-softmax (and entropy) from the decoder's
            final hidden states N positions at a time, each chunk recomputed in the backward; same
            values up to float rounding, one more lm-head matmul and (vocabulary, hidden) weight
            gradient (docs/gpu.md). Update and reference / old-logprob passes, not a VLM's image
            micro-batches. Refused with LoRA on ``lm_head`` (config load) and for a model whose logits
            are not a plain ``nn.Linear`` head's output (learner build: ``lm_head.chunked_head_refusal``).
        compile: ``torch.compile`` each decoder layer of the learner's model in place (one graph for
            every layer, weights' names unchanged): fewer, fused kernels for an update that looks
            bound by issuing ops at 135M (docs/gpu.md). The first forward compiles, the second length
            once more (dynamic shapes). Refused without ``get_decoder().layers``. Not GPU-measured yet.
    """

    path: str = "smollm2"
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    compute_dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    device: str = "auto"
    gradient_checkpointing: bool = False
    random_init: bool = False
    config_overrides: dict[str, Any] = field(default_factory=dict)
    value_head: bool = False
    pack: Literal["auto", True, False] = "auto"
    pack_max_tokens: int | None = None
    freeze_vision: bool = False
    logprob_chunk_tokens: int | None = None
    compile: bool = False

    def __post_init__(self) -> None:
        # Literal[True, False] also admits 1 and 0 (1 == True): only the words are meant.
        if not (self.pack == "auto" or isinstance(self.pack, bool)):
            raise ValueError(f"model.pack must be auto, true or false, got {self.pack!r}")
        _positive("model", pack_max_tokens=self.pack_max_tokens)
        if self.logprob_chunk_tokens is not None and self.logprob_chunk_tokens < 1:
            raise ValueError(
                f"model.logprob_chunk_tokens must be >= 1 (positions per lm-head chunk) or unset, "
                f"got {self.logprob_chunk_tokens}"
            )


@dataclass(frozen=True)
class LoraConfig:
    """Optional LoRA adapters (peft) instead of full fine-tuning.

    Attributes:
        enabled: train LoRA adapters only; the engine receives the merged weights.
        r, alpha, dropout: rank, scaling numerator (scale = alpha / r) and dropout of the adapters.
        target_modules: names of the linear layers that get adapters.
    """

    enabled: bool = False
    r: int = 16
    alpha: int = 32
    dropout: float = 0.0
    target_modules: tuple[str, ...] = (
        "q_proj",
        "k_proj",
        "v_proj",
        "o_proj",
        "gate_proj",
        "up_proj",
        "down_proj",
    )

    def __post_init__(self) -> None:
        _positive("lora", r=self.r, alpha=self.alpha)
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"lora.dropout must be in [0, 1), got {self.dropout}")
        if not self.target_modules:
            raise ValueError("lora.target_modules must name at least one module")


@dataclass(frozen=True)
class EngineConfig:
    """The inference engine that generates rollouts.

    Attributes:
        backend: an engine name of :data:`chatgym.trainer.engines.ENGINES` (``vllm``: in-process vLLM,
            ``hf``: transformers), or ``auto``: the faster of ``hf`` / ``vllm`` for the model on this
            machine, by a measured rule, logged at start (:mod:`chatgym.trainer.engines.auto`).
        dtype: the engine's dtype; ``auto`` is resolved when the engine is built (and logged; the config
            keeps ``auto``: ``config.yaml`` is the same on every machine) to ``bfloat16`` on GPUs and CPUs
            with native bf16 (AVX-512 BF16 / AMX), else ``float32`` (emulated bf16 was 5.7x slower than fp32
            on an AVX2-only CPU; :func:`chatgym.trainer.engines.engine_dtype`).
        options: backend-specific keyword arguments (e.g. ``enforce_eager``, ``kv_cache_gib``; on a GPU, docs/gpu.md:
            ``quantization: fp8``: FP8 rollout weights, ``kv_cache_dtype: fp8``: an e4m3 KV cache (vLLM's values, on vLLM-CPU only with AVX-512 or AMX; hf: fp8 / auto, GPU only),
            ``sleep_level: 1|2``: vLLM's sleep mode in the update;
            the ``hf`` engine's ``max_batch_size`` 64, ``batch_window_s`` 0.05 and ``batch_quiet_s`` 0.005: an
            idle engine waits for a burst, ``multi_step`` 1: steps a read-back, >1 and ``precapture`` with ``decode: static``).
    """

    backend: str = "vllm"
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    options: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        from chatgym.trainer.engines import ENGINES

        if self.backend not in ENGINES and self.backend != "auto":
            raise ValueError(f"engine.backend: unknown {self.backend!r}; choose auto or one of {sorted(ENGINES)}")


# Arguments the trainer passes to an advantage estimator / policy loss itself: not ``*_kwargs`` keys.
_ESTIMATOR_INPUTS = frozenset(
    {"token_rewards", "mask", "group_ids", "values", "truncated", "bootstrap_values"}
    | {"turn_ids", "turn_counts", "state_ids"}
)
_POLICY_LOSS_INPUTS = frozenset({"logprobs", "old_logprobs", "advantages", "mask", "is_weights"})


def check_kwargs(section: str, fn: Any, kwargs: Mapping[str, Any], passed: frozenset[str]) -> None:
    """Raise ValueError naming ``section`` when ``kwargs`` holds a key that ``fn`` (a registered
    estimator or loss) does not take as a keyword, listing the names it does take."""
    params = inspect.signature(fn).parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return
    allowed = sorted(
        name
        for name, p in params.items()
        if name not in passed
        and p.kind in (inspect.Parameter.KEYWORD_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    )
    for key in kwargs:
        if key not in allowed:
            raise ValueError(
                f"{section}: unknown key {key!r} for {getattr(fn, '__name__', fn)}; allowed: {allowed or 'none'}"
            )


@dataclass(frozen=True)
class AlgoConfig:
    """The RL algorithm (names are those registered in :mod:`chatgym.trainer.algos`).

    Attributes:
        advantage: advantage estimator (``grpo``, ``dr_grpo``, ``rloo``, ``reinforce_plus_plus``,
            ``reinforce_plus_plus_baseline``, ``gae``, ``tppo``; per turn: ``turn_grpo``, ``gigpo``,
            ``turn_rloo``); ``advantage_kwargs`` its parameters (``gamma`` in [0, 1], ``omega`` >= 0).
        policy_loss: ``ppo_clip``, ``clip_higher`` or ``dual_clip``; ``policy_loss_kwargs`` its ε/c, finite
            and checked at load (``eps``/``eps_low`` in [0, 1), ``eps_high`` >= 0, ``c``/``dual_clip`` > 1).
        loss_agg: loss aggregation mode; ``loss_norm_constant`` its C (``seq-mean-token-sum-norm``).
        kl_coef: β of the KL to the reference model (0: no reference model is loaded).
        kl_estimator: ``k1``, ``k2`` or ``k3``; ``kl_in_reward``: subtract β·KL from the token
            rewards instead of adding β·KL to the loss.
        entropy_coef: weight of an entropy bonus (subtracted from the loss).
        tis_cap: truncated importance-sampling cap C for the engine-vs-trainer mismatch (None: off).
        rollout_correction: how the engine-vs-learner ratio ρ = exp(old − engine) weights the loss:
            ``token_tis`` (min(ρ_t, tis_cap) per token; off when ``tis_cap`` is None), ``seq_tis``
            (min(Π ρ_t, tis_cap) on every token of the sequence; needs ``tis_cap``), ``token_mask`` /
            ``seq_mask`` / ``geo_mask`` (tokens / sequences whose ρ_t / Π ρ_t / geometric-mean ρ
            leaves ``rollout_mask_band`` weigh 0; the rest min(ρ_t, tis_cap), or 1 when ``tis_cap``
            is None). See docs/training.md.
        rollout_mask_band: ``[lo, hi]`` with 0 < lo <= 1 <= hi, the ratios the mask modes keep.
        ppo_epochs: passes over each rollout batch.
        mini_batches: optimizer steps per pass.
        dynamic_sampling: drop groups whose rewards are all equal (DAPO) before the update.
        mask_truncated: zero the loss mask of completions cut by a token budget (DAPO).
        missing_eos_penalty: subtracted from the reward of completions without EOS (0: off).
        overlong_buffer: DAPO's L_cache in tokens (0: off), with ``overlong_penalty`` as the factor;
            L_max is ``rollout.max_response_tokens``.
        value_loss_coef, value_clip: weight and clip range of the value loss (``gae``, ``tppo``).
    """

    advantage: str = "grpo"
    advantage_kwargs: dict[str, Any] = field(default_factory=dict)
    policy_loss: str = "ppo_clip"
    policy_loss_kwargs: dict[str, Any] = field(default_factory=dict)
    loss_agg: str = "token-mean"
    loss_norm_constant: float | None = None
    kl_coef: float = 0.0
    kl_estimator: str = "k3"
    kl_in_reward: bool = False
    entropy_coef: float = 0.0
    tis_cap: float | None = 2.0
    rollout_correction: str = "token_tis"
    rollout_mask_band: tuple[float, float] = (0.5, 2.0)
    ppo_epochs: int = 1
    mini_batches: int = 1
    dynamic_sampling: bool = False
    mask_truncated: bool = False
    missing_eos_penalty: float = 0.0
    overlong_buffer: int = 0
    overlong_penalty: float = 1.0
    value_loss_coef: float = 0.5
    value_clip: float | None = 0.2

    def __post_init__(self) -> None:
        for name, table in (
            ("advantage", ADVANTAGE_ESTIMATORS),
            ("policy_loss", POLICY_LOSSES),
            ("loss_agg", AGGREGATION_MODES),
            ("kl_estimator", KL_ESTIMATORS),
        ):
            value = getattr(self, name)
            if value not in table:
                raise ValueError(f"algo.{name}: unknown {value!r}; choose one of {sorted(table)}")
        check_kwargs(
            "algo.advantage_kwargs",
            ADVANTAGE_ESTIMATORS[self.advantage],
            self.advantage_kwargs,
            _ESTIMATOR_INPUTS,
        )
        check_turn_params(self.advantage, self.advantage_kwargs)
        loss = POLICY_LOSSES[self.policy_loss]
        check_kwargs("algo.policy_loss_kwargs", loss, self.policy_loss_kwargs, _POLICY_LOSS_INPUTS)
        check_policy_loss_kwargs("algo.policy_loss_kwargs", loss, self.policy_loss_kwargs)
        if self.loss_agg == "seq-mean-token-sum-norm" and self.loss_norm_constant is None:
            raise ValueError("algo.loss_norm_constant is required with loss_agg 'seq-mean-token-sum-norm'")
        for name in ("kl_coef", "entropy_coef", "missing_eos_penalty", "overlong_penalty", "value_loss_coef",
                     "overlong_buffer"):  # weights of the loss or the reward: an inf one makes it inf or nan
            if not 0 <= getattr(self, name) < float("inf"):  # nan fails it too
                raise ValueError(f"algo.{name} must be >= 0 and finite, got {getattr(self, name)}")
        _positive("algo", tis_cap=self.tis_cap, ppo_epochs=self.ppo_epochs, mini_batches=self.mini_batches)
        self._check_correction()
        _positive("algo", loss_norm_constant=self.loss_norm_constant, value_clip=self.value_clip)

    def _check_correction(self) -> None:
        if self.rollout_correction not in ROLLOUT_CORRECTIONS:
            raise ValueError(
                f"algo.rollout_correction: unknown {self.rollout_correction!r}; "
                f"choose one of {list(ROLLOUT_CORRECTIONS)}"
            )
        if self.rollout_correction == "seq_tis" and self.tis_cap is None:
            raise ValueError(
                "algo.rollout_correction: 'seq_tis' truncates at algo.tis_cap; set it (e.g. 2.0)"
            )
        band = self.rollout_mask_band
        if (
            len(band) != 2
            or not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in band)
            or not 0 < band[0] <= 1 <= band[1]
        ):
            raise ValueError(
                f"algo.rollout_mask_band must be [lo, hi] with 0 < lo <= 1 <= hi, got {list(band)}"
            )


@dataclass(frozen=True)
class OptimConfig:
    """AdamW with a warm-up then constant / linear / cosine learning-rate schedule.

    Attributes:
        lr: peak learning rate.
        value_lr: the value head's (None: same as ``lr``).
        weight_decay, betas, eps: AdamW's.
        warmup_steps: optimizer steps of linear warm-up from 0 to ``lr``.
        schedule: shape after warm-up; decays reach ``min_lr_ratio · lr`` at the last step.
        min_lr_ratio: the decays' end, as a share of ``lr``.
        max_grad_norm: clip the global gradient norm (None: no clipping).
    """

    lr: float = 1e-6
    value_lr: float | None = None
    weight_decay: float = 0.0
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8
    warmup_steps: int = 0
    schedule: Literal["constant", "linear", "cosine"] = "constant"
    min_lr_ratio: float = 0.0
    max_grad_norm: float | None = 1.0

    def __post_init__(self) -> None:
        _positive("optim", lr=self.lr, value_lr=self.value_lr, eps=self.eps, max_grad_norm=self.max_grad_norm)
        if not 0 <= self.weight_decay < float("inf"):
            raise ValueError(f"optim.weight_decay must be >= 0 and finite, got {self.weight_decay}")
        if not all(0.0 <= b < 1.0 for b in self.betas):
            raise ValueError(f"optim.betas must be in [0, 1), got {self.betas}")
        if self.warmup_steps < 0:
            raise ValueError(f"optim.warmup_steps must be >= 0, got {self.warmup_steps}")
        if not 0.0 <= self.min_lr_ratio <= 1.0:
            raise ValueError(f"optim.min_lr_ratio must be in [0, 1], got {self.min_lr_ratio}")


@dataclass(frozen=True)
class TrainConfig:
    """The loop, its outputs and its reproducibility.

    Attributes:
        max_steps: training steps (one rollout batch each).
        prompts_per_step: tasks per step.
        group_size: samples per task (GRPO's G).
        micro_batch_size: trajectories per forward/backward (gradients are accumulated).
        share_prompt_prefix: forward a group's common prompt once for all its samples (exact; about
            G times fewer prompt tokens; on CUDA off under gradient checkpointing, which drops the KV
            cache the padded layout uses — the packed layout, ``model.pack``, needs none).
        seed: seeds torch, task sampling and the engine's sampling.
        output_dir: where metrics, curves, traces and checkpoints go.
        save_every: checkpoint every N steps (0: only at the end).
        keep_checkpoints: how many checkpoints are kept (the newest).
        trace_fraction: share of rollouts written to ``traces.jsonl``.
        tensorboard, wandb: also log there (wandb only if installed).
        wandb_project: the wandb project.
        progress: show a progress bar.
        gc_freeze: move every object alive when training starts (models, tokenizer, env data) out of
            Python's garbage collector for the run (``gc.freeze()``, as vLLM does after start-up): a
            full collection then walks only what the steps allocate. On the H200 a full collection
            inside the update took 0.33-0.37 s of a 1.7 s step.
        max_failed_steps: stop the run with an error once this many steps in a row had every episode
            fail (nothing trained: an engine out of memory, an env the workers cannot make); 0 never
            stops. A step with one episode that did not fail resets the count.
    """

    max_steps: int = 10
    prompts_per_step: int = 8
    group_size: int = 8
    micro_batch_size: int = 8
    share_prompt_prefix: bool = True
    seed: int = 0
    output_dir: str = "runs/default"
    save_every: int = 0
    keep_checkpoints: int = 2
    trace_fraction: float = 0.1
    tensorboard: bool = True
    wandb: bool = False
    wandb_project: str = "chatgym"
    progress: bool = True
    gc_freeze: bool = True
    max_failed_steps: int = 3

    def __post_init__(self) -> None:
        _positive(
            "train",
            max_steps=self.max_steps,
            prompts_per_step=self.prompts_per_step,
            group_size=self.group_size,
            micro_batch_size=self.micro_batch_size,
            keep_checkpoints=self.keep_checkpoints,
        )
        for name in ("save_every", "max_failed_steps"):
            if getattr(self, name) < 0:
                raise ValueError(f"train.{name} must be >= 0, got {getattr(self, name)}")
        check_seed("train.seed", self.seed)  # before seed_everything (np.random.seed) refuses it mid-start
        if not 0.0 <= self.trace_fraction <= 1.0:
            raise ValueError(f"train.trace_fraction must be in [0, 1], got {self.trace_fraction}")


# Estimators whose baseline is the other samples of the same task's group.
GROUP_RELATIVE_ADVANTAGES = frozenset({"grpo", "dr_grpo", "rloo"}) | TURN_ADVANTAGES


@dataclass(frozen=True)
class Config:
    """The whole run (see each section's class for its fields)."""

    model: ModelConfig = field(default_factory=ModelConfig)
    lora: LoraConfig = field(default_factory=LoraConfig)
    engine: EngineConfig = field(default_factory=EngineConfig)
    env: EnvConfig = field(default_factory=EnvConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    algo: AlgoConfig = field(default_factory=AlgoConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    trainer: RunnerConfig = field(default_factory=RunnerConfig)
    reward: RewardConfig = field(default_factory=RewardConfig)

    def __post_init__(self) -> None:
        if self.algo.advantage in GROUP_RELATIVE_ADVANTAGES and self.train.group_size < 2:
            # A group of one is its own baseline: advantage 0 for every sample, so nothing is learned.
            raise ValueError(
                f"train.group_size must be >= 2 with algo.advantage {self.algo.advantage!r} "
                f"(group-relative baseline), got {self.train.group_size}"
            )
        if self.algo.advantage in ("gae", "tppo") and not self.model.value_head:
            raise ValueError(
                f"model.value_head must be true with algo.advantage {self.algo.advantage!r} (a value model)"
            )
        self._check_engine()
        if (
            self.model.logprob_chunk_tokens is not None
            and self.lora.enabled
            and "lm_head" in self.lora.target_modules
        ):
            # Refused before any model loads; the learner refuses any other non-Linear head at build.
            raise ValueError(
                "model.logprob_chunk_tokens: lora.target_modules has lm_head, whose adapter the chunked "
                "head would skip (it multiplies by the base weight); drop one of the two"
            )
        if self.trainer.stale == "importance_sampling" and self.algo.tis_cap is None:
            # Checked at load, not when the trainer starts: a refused run leaves no output dir behind.
            raise ValueError(
                "trainer.stale: 'importance_sampling' keeps stale groups and corrects them with the truncated "
                "IS weight; set algo.tis_cap (e.g. 2.0)"
            )

    def _check_engine(self) -> None:
        """Engine options refused before any model loads: FP8 (weights, hf's e4m3 KV cache) without FP8 hardware, sleep mode where it cannot work."""
        from chatgym.trainer.engines.vllm_sleep import sleep_config_refusal
        from chatgym.trainer.models.cuda import fp8_config_refusal, kv_cache_refusal

        why = fp8_config_refusal(self.engine.options, self.trainer.backend, self.trainer.ray.worker_num_gpus)
        if why is not None:
            raise ValueError(
                f"engine.options.quantization: {self.engine.options['quantization']!r} is refused: {why}"
            )
        if why := kv_cache_refusal(self.engine.backend, self.engine.options, self.trainer.backend,
                                   self.trainer.ray.worker_num_gpus):
            raise ValueError(why)
        if (why := sleep_config_refusal(self)) is not None:
            raise ValueError(why)


def load_config(path: str | Path | None = None, overrides: Sequence[str] = ()) -> Config:
    """Load a :class:`Config` from a YAML file (or defaults when None) plus overrides.

    Raises:
        FileNotFoundError: ``path`` does not exist.
        ConfigError: a directory, a file that is not UTF-8, malformed YAML or a key given twice in one mapping
            (file:line:column, :func:`~chatgym.trainer.config.loader.read_config_file`), bad YAML shape,
            unknown key, wrong type or value (names the dotted field).
    """
    data = read_config_file(path) if path is not None else {}
    config = from_dict(Config, apply_overrides(data, overrides))
    check_env_id(config.env)
    return config


def save_config(config: Config, path: str | Path) -> None:
    """Write ``config`` as YAML (the resolved config of a run, for ``--resume`` and records)."""
    Path(path).write_text(yaml.safe_dump(config_to_dict(config), sort_keys=False))
