"""Training config: YAML + ``key.sub=value`` overrides; bad keys/values fail with the dotted field name."""

from __future__ import annotations

from pathlib import Path

import pytest

from chatgym.trainer.config.run import (
    Config,
    ConfigError,
    config_to_dict,
    from_dict,
    load_config,
    save_config,
)
from chatgym.trainer.train_cli import main

EXAMPLES = sorted((Path(__file__).parent.parent / "examples" / "configs").glob("*.yaml"))


def test_yaml_then_overrides(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("algo:\n  advantage: rloo\n  kl_coef: 0.05\noptim:\n  lr: 1e-5\ntrain:\n  max_steps: 7\n")
    cfg = load_config(
        path, ["train.max_steps=3", "lora.target_modules=[q_proj, v_proj]", "env.kwargs.size=50"]
    )
    assert cfg.algo.advantage == "rloo" and cfg.algo.kl_coef == 0.05
    assert cfg.optim.lr == 1e-5  # YAML 1.1 reads "1e-5" as a string; float fields accept it
    assert cfg.train.max_steps == 3  # the override wins over the file
    assert cfg.lora.target_modules == ("q_proj", "v_proj")
    assert cfg.env.kwargs == {"size": 50}
    assert cfg.algo.tis_cap == 2.0 and cfg.rollout.max_tokens == 512  # untouched defaults
    assert load_config(None, ["algo.tis_cap=null"]).algo.tis_cap is None


def test_a_config_that_is_not_utf8_is_one_line_naming_the_file(tmp_path):
    # Regression (fresh-user walk): chatgym train on such a file was a UnicodeDecodeError traceback.
    path = tmp_path / "c9.yaml"
    path.write_bytes(b"\xff\xfe\x00")
    with pytest.raises(ConfigError) as err:
        load_config(path)
    assert str(err.value) == f"{path}: not UTF-8 text (byte 0: invalid start byte)"


@pytest.mark.parametrize(
    ("text", "where"),
    [
        ("train:\n  max_steps: 2\ntrain:\n  max_steps: 5\n", "3:1: duplicate key train (first on line 1)"),
        ("optim:\n  lr: 1.0e-5\n  lr: 2.0e-5\n", "3:3: duplicate key optim.lr (first on line 2)"),
        ("env:\n  kwargs:\n    size: 5\n    size: 6\n", "4:5: duplicate key env.kwargs.size (first on line 3)"),
        ("lora:\n  target_modules:\n    - {a: 1, a: 2}\n", "3:14: duplicate key lora.target_modules[0].a (first on line 3)"),
    ],
)
def test_a_key_given_twice_is_refused_naming_the_file_the_key_and_its_line(tmp_path, text, where):
    # Regression: PyYAML keeps the last of two equal keys, so a second train: section (or lr written
    # twice) dropped the first without a word. chatgym cotrain's config is read by the same reader.
    from chatgym.trainer.config.cotrain import load_cotrain_config

    path = tmp_path / "run.yaml"
    path.write_text(text)
    for load in (load_config, load_cotrain_config):
        with pytest.raises(ConfigError) as err:
            load(path)
        assert str(err.value) == f"{path}:{where}"


@pytest.mark.parametrize(
    ("text", "where"),
    [
        # position 21 of the text: line 2, column 15 (PyYAML's ReaderError carries only the position)
        ("train:\n  max_steps: 3\x01\n", "2:15: character #x0001: special characters are not allowed"),
        ("a: " + "[" * 5000 + "]" * 5000 + "\n", " nested too deeply to read (a few thousand levels)"),
    ],
)
def test_a_control_character_or_deep_nesting_is_one_line_naming_the_file(tmp_path, text, where):
    # Regression (fresh-user walk): a control character gave PyYAML's two lines without the file's name
    # (its ReaderError is no MarkedYAMLError); 5,000 nested brackets a RecursionError's traceback.
    path = tmp_path / "run.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as err:
        load_config(path)
    assert str(err.value) == f"{path}:{where}"


def test_a_merge_key_may_still_be_overridden(tmp_path):
    # YAML's merge key is made to be overridden: not a duplicate.
    path = tmp_path / "run.yaml"
    path.write_text("optim:\n  <<: {lr: 1.0e-5, eps: 1.0e-6}\n  lr: 2.0e-5\n")
    cfg = load_config(path)
    assert (cfg.optim.lr, cfg.optim.eps) == (2.0e-5, 1.0e-6)


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("train.max_step=3", r"^train\.max_step: unknown config key; did you mean train\.max_steps\?"),
        ("trian.max_steps=3", r"^trian: unknown config key; did you mean train\?"),
        ("algo.kl_coef=abc", r"^algo\.kl_coef: expected a number, got 'abc'"),
        ("train.max_steps=2.5", r"^train\.max_steps: expected an integer, got 2\.5"),
        ("model.gradient_checkpointing=yes please", r"^model\.gradient_checkpointing: expected true/false"),
        ("optim.schedule=exp", r"^optim\.schedule: must be one of \['constant', 'linear', 'cosine'\]"),
        ("optim.betas=[0.9]", r"^optim\.betas: expected 2 items, got 1"),
        ("algo.advantage=ppo", r"^algo\.advantage: unknown 'ppo'; choose one of \['dr_grpo', 'gae', 'gigpo', 'grpo'"),
        ("algo.policy_loss=vanilla", r"^algo\.policy_loss: unknown 'vanilla'"),
        ("algo.tis_cap=0", r"^algo\.tis_cap must be > 0, got 0"),
        ("engine.backend=tgi", r"^engine\.backend: unknown 'tgi'"),
        ("rollout.max_tokens=0", r"^rollout\.max_tokens must be an int >= 1, got 0"),
        ("rollout.temperature=-1", r"^rollout\.temperature: .*temperature must be >= 0"),
        ("env.kwargs.split=train", r"^env\.kwargs must not set 'split'"),
        ("train.trace_fraction=2", r"^train\.trace_fraction must be in \[0, 1\]"),
        ("algo.advantage=gae", r"^model\.value_head must be true with algo\.advantage 'gae'"),
        ("train.group_size=1", r"^train\.group_size must be >= 2 with algo\.advantage 'grpo'"),
        ("train=3", r"^train: expected a mapping of TrainConfig fields"),
        ("algo.kl_coef", r"^override 'algo\.kl_coef': expected key\.sub=value"),
    ],
)
def test_bad_key_or_value_names_the_field(override, message):
    with pytest.raises(ConfigError, match=message):
        load_config(None, [override])


def test_cli_refuses_importance_sampling_without_tis_cap_in_one_line(tmp_path, capsys):
    # Regression: the check ran when the Trainer started, after the output dir was made, and the CLI
    # printed a traceback (exit 1) instead of its one-line error (exit 2).
    out = tmp_path / "never"
    assert main(["trainer.stale=importance_sampling", "algo.tis_cap=null", "--output-dir", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("chatgym train: trainer.stale: 'importance_sampling'") and err.count("\n") == 1
    assert not out.exists()


def test_round_trip_through_yaml(tmp_path):
    cfg = load_config(
        None, ["algo.policy_loss=clip_higher", "algo.policy_loss_kwargs={eps_high: 0.3}", "optim.betas=[0.9, 0.95]"]
    )
    save_config(cfg, tmp_path / "config.yaml")
    assert load_config(tmp_path / "config.yaml") == cfg
    assert from_dict(Config, config_to_dict(cfg)) == cfg


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_example_configs_load(path):
    if path.stem.startswith("cotrain_"):  # chatgym cotrain's configs: the train sections + cotrain:
        from chatgym.trainer.config.cotrain import load_cotrain_config

        cfg, _ = load_cotrain_config(path)
    else:
        cfg = load_config(path)
    assert cfg.train.output_dir.startswith("runs/")


def test_cli_rejects_a_bad_key_before_doing_anything(tmp_path, capsys):
    out = tmp_path / "never"
    assert main(["algo.kl_coeff=0.1", "--output-dir", str(out)]) == 2
    err = capsys.readouterr().err
    assert "algo.kl_coeff: unknown config key; did you mean algo.kl_coef?" in err
    assert not out.exists()


def test_engine_dtype_auto_resolves_when_the_engine_is_built_not_in_the_config(tmp_path):
    # Emulated bf16 is several times slower than fp32 on CPUs without AVX-512 BF16, so "auto" picks
    # by hardware; the independent check reads the same CPU flags. The config keeps "auto" (the
    # saved config.yaml must not differ by machine).
    from pathlib import Path

    import torch

    from chatgym.trainer.config.run import EngineConfig, load_config, save_config
    from chatgym.trainer.engines import engine_dtype

    flags = Path("/proc/cpuinfo").read_text()
    native = torch.cuda.is_available() or "avx512_bf16" in flags or "amx_bf16" in flags
    assert EngineConfig(dtype="auto").dtype == "auto"
    assert engine_dtype(EngineConfig(dtype="auto")) == ("bfloat16" if native else "float32")
    assert engine_dtype(EngineConfig(dtype="bfloat16")) == "bfloat16"
    save_config(load_config(None, ["engine.dtype=auto"]), tmp_path / "config.yaml")
    assert "dtype: auto" in (tmp_path / "config.yaml").read_text().split("engine:")[1].split("env:")[0]


@pytest.mark.parametrize(
    ("override", "message"),
    [
        (
            "algo.advantage_kwargs={epsilon: 0.1}",
            "algo.advantage_kwargs: unknown key 'epsilon' for grpo_advantages; allowed: ['eps']",
        ),
        (
            "algo.policy_loss_kwargs={eps_hgh: 0.3}",
            "algo.policy_loss_kwargs: unknown key 'eps_hgh' for ppo_clip_loss; allowed: ['eps']",
        ),
    ],
)
def test_algo_kwargs_are_checked_against_the_registered_function_at_load(override, message):
    # Regression: a typo in *_kwargs failed only at the first update, minutes in.
    from chatgym.trainer.config.run import ConfigError, load_config

    with pytest.raises(ConfigError) as err:
        load_config(None, [override])
    assert str(err.value) == message
    cfg = load_config(None, ["algo.policy_loss=clip_higher", "algo.policy_loss_kwargs={eps_low: 0.2, eps_high: 0.28}"])
    assert cfg.algo.policy_loss_kwargs == {"eps_low": 0.2, "eps_high": 0.28}


def test_unknown_env_id_fails_at_config_load_naming_the_field():
    # Regression: a bad env.id was only found after the engine had started (minutes on CPU).
    from chatgym.trainer.config.run import ConfigError, EnvConfig, load_config

    with pytest.raises(ConfigError, match=r"env\.id: unknown env 'Nope-v0'"):
        load_config(None, ["env.id=Nope-v0"])
    assert load_config(None, ["env.id=CodeSandbox-v0"]).env.id == "CodeSandbox-v0"
    assert EnvConfig(id="Nope-v0").id == "Nope-v0"  # building a config never reads the gym registry


def test_ray_weight_sync_bounds_and_fp8_on_cpu_workers_fail_at_load():
    # Found by a fresh-user check: an infinite timeout crashed the first sync after minutes of
    # rollout (timedelta overflow), a 1-byte bucket meant one collective per byte, and FP8 with
    # GPU-less Ray workers died inside the worker actor with a traceback.
    with pytest.raises(ConfigError, match=r"trainer.ray.weight_sync_timeout_s must be a number in \(0, 86400\] seconds, got inf"):
        load_config(None, ["trainer.ray.weight_sync_timeout_s=.inf"])
    with pytest.raises(ConfigError, match=r"trainer.ray.weight_bucket_bytes must be an int >= 1048576 \(1 MiB\), got 1"):
        load_config(None, ["trainer.ray.weight_bucket_bytes=1"])
    assert load_config(None, ["trainer.ray.weight_sync_timeout_s=86400"]).trainer.ray.weight_sync_timeout_s == 86400
    with pytest.raises(ConfigError, match=r"engine.options.quantization: 'fp8' is refused: trainer.ray.worker_num_gpus is 0"):
        load_config(None, ["trainer.backend=ray", "engine.options.quantization=fp8"])
    with pytest.raises(ConfigError, match=r"engine.options.device 'gpu0' is not a torch device"):
        load_config(None, ["engine.backend=hf", "engine.options={quantization: fp8, device: gpu0}"])


def test_config_changes_lists_the_dotted_keys_that_differ():
    from chatgym.trainer.config.loader import config_changes

    old = {"algo": {"kl_coef": 0.01, "tis_cap": None}, "train": {"max_steps": 1}, "engine": {"options": {}}}
    new = {"algo": {"kl_coef": 0.0, "tis_cap": None}, "train": {"max_steps": 5}, "engine": {"options": {"x": 1}}}
    assert config_changes(old, new) == [
        "algo.kl_coef: 0.01 -> 0.0", "engine.options.x: (unset) -> 1", "train.max_steps: 1 -> 5",
    ]
    assert config_changes(old, new, ignore=("train.max_steps",))[-1] == "engine.options.x: (unset) -> 1"
    assert config_changes(old, old) == []


SEED_RANGE = "must be an int in [0, 4294967295] (2**32 - 1)"


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("train.seed=-1", f"train.seed {SEED_RANGE}, got -1"),
        ("train.seed=4294967296", f"train.seed {SEED_RANGE}, got 4294967296"),
        ("rollout.seed=-1", f"rollout.seed {SEED_RANGE}, got -1"),
        # Regression: env.kwargs.seed=-1 loaded and built (Math-v0 seeds by its absolute value).
        ("env.kwargs.seed=-1", f"env.kwargs.seed {SEED_RANGE}, got -1"),
        ("env.kwargs.seed=1.5", f"env.kwargs.seed {SEED_RANGE}, got 1.5"),
        ("env.kwargs.seed=true", f"env.kwargs.seed {SEED_RANGE}, got True"),
        ("env.kwargs.seed=4294967296", f"env.kwargs.seed {SEED_RANGE}, got 4294967296"),
        ("rollout.seed=1180591620717411303424", f"rollout.seed {SEED_RANGE}, got 1180591620717411303424"),
        ("algo.kl_coef=nan", "algo.kl_coef: expected a number, got nan"),
        ("algo.kl_coef=.inf", "algo.kl_coef must be >= 0 and finite, got inf"),
        ("algo.entropy_coef=.inf", "algo.entropy_coef must be >= 0 and finite, got inf"),
        ("algo.value_loss_coef=-.inf", "algo.value_loss_coef must be >= 0 and finite, got -inf"),
        ("algo.loss_norm_constant=.inf", "algo.loss_norm_constant must be > 0 and finite, got inf"),
        ("optim.lr=.inf", "optim.lr must be > 0 and finite, got inf"),
        ("optim.lr=1e400", "optim.lr must be > 0 and finite, got inf"),
        ("optim.weight_decay=nan", "optim.weight_decay: expected a number, got nan"),
        ("optim.weight_decay=.inf", "optim.weight_decay must be >= 0 and finite, got inf"),
        ("rollout.temperature=.inf",
         "rollout.temperature: RolloutConfig: SamplingParams.temperature must be >= 0 and finite, got inf"),
        ("reward.env_weight=nan", "reward.env_weight: expected a number, got nan"),
    ],
)
def test_seeds_out_of_range_and_non_finite_numbers_are_refused_at_load(override, message):
    # Regression (fresh-user walk): train.seed=-1 loaded, then crashed in seed_everything
    # (np.random.seed) once the run had started; rollout.seed=-1 and algo.kl_coef=nan loaded (nan
    # passes every `< 0` check).
    with pytest.raises(ConfigError) as err:
        load_config(None, [override])
    assert str(err.value) == message


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["algo.policy_loss_kwargs.eps_low=nan"], "eps_low must be a number, got 'nan'"),  # YAML: a string
        (["algo.policy_loss_kwargs.eps_low=.nan"], "eps_low must be in [0, 1), got nan"),
        (["algo.policy_loss_kwargs.eps_low=1.5"], "eps_low must be in [0, 1), got 1.5"),
        (["algo.policy_loss_kwargs.eps_high=.nan"], "eps_high must be >= 0 and finite, got nan"),
        (["algo.policy_loss_kwargs.eps_high=true"], "eps_high must be a number, got True"),
        (["algo.policy_loss=dual_clip", "algo.policy_loss_kwargs={c: .nan}"], "c must be > 1 and finite (or None), got nan"),
        (["algo.policy_loss=ppo_clip", "algo.policy_loss_kwargs={eps: -0.1}"], "eps must be in [0, 1), got -0.1"),
        # Regression: an infinite bound loaded (it turns that clip off, which None / another loss says).
        (["algo.policy_loss=dual_clip", "algo.policy_loss_kwargs={c: .inf}"], "c must be > 1 and finite (or None), got inf"),
        (["algo.policy_loss=dual_clip", "algo.policy_loss_kwargs={c: 1.0}"], "c must be > 1 and finite (or None), got 1.0"),
        (["algo.policy_loss=dual_clip", "algo.policy_loss_kwargs={eps: .inf}"], "eps must be in [0, 1), got inf"),
        (["algo.policy_loss=ppo_clip", "algo.policy_loss_kwargs={eps: .nan}"], "eps must be in [0, 1), got nan"),
        (["algo.policy_loss_kwargs.eps_high=.inf"], "eps_high must be >= 0 and finite, got inf"),
        (["algo.policy_loss_kwargs.dual_clip=.inf"], "dual_clip must be > 1 and finite (or None), got inf"),
        (["algo.policy_loss_kwargs.dual_clip=-.inf"], "dual_clip must be > 1 and finite (or None), got -inf"),
        # Regression (fresh-user walk): an int past float's range passed `1 < c < inf` and overflowed in
        # the first product (a traceback); a null eps raised a TypeError named only "algo".
        (["algo.policy_loss=dual_clip", f"algo.policy_loss_kwargs={{c: {10**400}}}"],
         "c must be > 1 and finite (or None), got an int of 401 digits"),
        ([f"algo.policy_loss_kwargs.eps_high={10**400}"], "eps_high must be >= 0 and finite, got an int of 401 digits"),
        ([f"algo.policy_loss_kwargs.dual_clip={10**400}"],
         "dual_clip must be > 1 and finite (or None), got an int of 401 digits"),
        (["algo.policy_loss=dual_clip", "algo.policy_loss_kwargs={eps: null}"], "eps must be a number in [0, 1), got None"),
        (["algo.policy_loss_kwargs.eps_low=null"], "eps_low must be a number in [0, 1), got None"),
        (["algo.policy_loss_kwargs.eps_high=null"], "eps_high must be a number >= 0 and finite, got None"),
    ],
)
def test_policy_loss_values_are_checked_at_load(overrides, message):
    # Regression (fresh-user walk): eps_low=nan loaded, then the first update raised a TypeError after
    # the model had loaded and the held-out evaluation had run (80 s in).
    with pytest.raises(ConfigError) as err:
        load_config("examples/configs/math_grpo.yaml", overrides)
    assert str(err.value) == f"algo.policy_loss_kwargs: {message}"


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("-1", "env.eval_temperature must be >= 0 and finite, got -1.0"),
        (".inf", "env.eval_temperature must be >= 0 and finite, got inf"),
        ("-.inf", "env.eval_temperature must be >= 0 and finite, got -inf"),
        (".nan", "env.eval_temperature: expected a number, got nan"),  # the loader's own refusal of nan
    ],
)
def test_a_negative_or_non_finite_eval_temperature_is_refused_at_load(value, message):
    # Regression (fresh-user walk): env.eval_temperature=-1 loaded; the run died at the first held-out
    # evaluation, 44 s in, after the models had loaded.
    with pytest.raises(ConfigError) as err:
        load_config(None, [f"env.eval_temperature={value}"])
    assert str(err.value) == message
    assert load_config(None, ["env.eval_temperature=0.7"]).env.eval_temperature == 0.7


def test_a_dual_clip_c_of_none_or_finite_above_1_loads(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("algo:\n  policy_loss: dual_clip\n  policy_loss_kwargs: {c: 1.5, eps: 0.1}\n")
    assert load_config(path).algo.policy_loss_kwargs == {"c": 1.5, "eps": 0.1}
    assert load_config(None, ["algo.policy_loss=dual_clip", "algo.policy_loss_kwargs.c=null"]).algo.policy_loss_kwargs == {
        "c": None
    }


def test_the_seed_range_ends_are_accepted_and_direct_construction_is_checked_too():
    from chatgym.trainer.config.run import AlgoConfig

    assert load_config(None, ["train.seed=4294967295", "rollout.seed=0"]).train.seed == 4294967295
    assert load_config(None, ["rollout.seed=null"]).rollout.seed is None
    assert load_config(None, ["env.kwargs.seed=4294967295"]).env.kwargs == {"seed": 4294967295}
    assert load_config(None, ["env.kwargs.seed=0"]).env.kwargs == {"seed": 0}
    with pytest.raises(ValueError) as err:  # not through the loader: the dataclass's own check
        AlgoConfig(kl_coef=float("nan"))
    assert str(err.value) == "algo.kl_coef must be >= 0 and finite, got nan"


@pytest.mark.parametrize("field", ["train.seed", "env.kwargs.seed"])
def test_cli_refuses_a_negative_seed_in_one_line_before_doing_anything(tmp_path, capsys, field):
    out = tmp_path / "never"
    assert main([f"{field}=-1", "--output-dir", str(out)]) == 2
    assert capsys.readouterr().err == f"chatgym train: {field} {SEED_RANGE}, got -1\n"
    assert not out.exists()


def test_cli_refuses_an_infinite_dual_clip_c_in_one_line_before_doing_anything(tmp_path, capsys):
    out = tmp_path / "never"
    assert main(["algo.policy_loss=dual_clip", "algo.policy_loss_kwargs.c=.inf", "--output-dir", str(out)]) == 2
    assert capsys.readouterr().err == (
        "chatgym train: algo.policy_loss_kwargs: c must be > 1 and finite (or None), got inf\n"
    )
    assert not out.exists()
