"""Frozen dataclasses from YAML-shaped dicts, checked field by field: the loader behind
:func:`chatgym.trainer.config.run.load_config` (any config dataclass may use it; it knows none of them).

A config file is read by :func:`read_config_file` (:func:`chatgym.yaml_files.read_yaml_file`): a key
given twice in one mapping is refused with the file, its dotted name and its line (PyYAML keeps the
last without a word).

Rules of :func:`from_dict`:

- an unknown key fails with its dotted name and the close matches (``train.max_step`` -> did you mean
  ``train.max_steps``?);
- a value is checked against the field's annotation: ``int`` (not bool), ``float`` (an int or a
  number written as a string, since YAML 1.1 reads ``1e-6`` as a string), ``bool``, ``str``,
  ``X | None``, ``tuple[X, ...]``, ``Literal[...]``, ``dict[str, Any]`` and nested dataclasses;
- a ``float`` is never NaN (every range check would pass it: ``nan < 0`` is False);
- each dataclass's own ``__post_init__`` checks (ranges, registered names) run, and their errors
  are prefixed with the section's dotted name; seeds are checked by :func:`check_seed`.

Override values (:func:`apply_overrides`) are parsed as YAML (``train.max_steps=5`` is an int,
``algo.tis_cap=null`` is None, ``lora.target_modules=[q_proj,v_proj]`` a list).
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import os
import re
import tempfile
import types
import typing
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

import yaml

from chatgym.yaml_files import YAMLFileError, read_yaml_file


class ConfigError(ValueError):
    """A bad config key or value; the message starts with the field's dotted name."""


def missing_package(exc: ModuleNotFoundError) -> str:
    """The one line every CLI prints when an optional package (vLLM, Ray, ...) is missing at start-up:
    the error's own text (ours name the extra to install) and where set-up is explained."""
    return f"{exc} (a missing package: see docs/training.md#set-up)"


# NumPy's legacy seeding (np.random.seed, which the learner's seed_everything and vLLM call) takes
# [0, 2**32 - 1], the narrowest of the seeds' readers: gymnasium's reset refuses a negative seed, and
# the reset seed of task i, seed + i, goes into SQLite's signed 64-bit INTEGER column.
SEED_MAX = 2**32 - 1


def check_seed(name: str, value: Any, error: type[Exception] = ValueError) -> None:
    """Raise ``error`` naming ``name`` unless ``value`` is an int in [0, :data:`SEED_MAX`] (None passes:
    unseeded). ValueError for a dataclass's ``__post_init__`` (:func:`from_dict` prefixes its section)."""
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= SEED_MAX:
        raise error(f"{name} must be an int in [0, {SEED_MAX}] (2**32 - 1), got {value!r}")


def check_env_seed(kwargs: Mapping[str, Any], name: str, error: type[Exception] = ValueError) -> None:
    """An env's ``gym.make`` keywords (``env.kwargs``, ``--env-arg``): a ``seed`` among them follows
    :func:`check_seed`, named ``name`` (a negative one repeated other seeds' tasks in Math-v0, whose
    generator seeds by its absolute value, and failed Search-v0 as its tasks were read)."""
    if "seed" in kwargs:
        check_seed(name, kwargs["seed"], error)


def read_config_file(path: str | os.PathLike) -> dict[str, Any]:
    """The sections of the YAML config file ``path`` (``{}`` for an empty file), read by
    :func:`chatgym.yaml_files.read_yaml_file` (a key given twice in one mapping is refused).

    Raises:
        FileNotFoundError: ``path`` does not exist.
        ConfigError: one line starting with ``path``: a directory (``path: is a directory, not a config
            file``), not UTF-8, malformed YAML (``path:line:column``),
            a duplicate key (``path:line:column: duplicate key train.lr (first on line 3)``), or a top
            level that is not a mapping.
    """
    try:
        data = read_yaml_file(path)
    except YAMLFileError as exc:
        raise ConfigError(str(exc)) from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: the top level must be a mapping of sections, got {type(data).__name__}")
    return data


def check_writable(folder: str | os.PathLike, flag: str, path: str | os.PathLike) -> None:
    """Raise unless files can be made in ``folder`` or, where it does not exist yet, in its nearest
    existing ancestor: a temporary file is created there and deleted (nothing else is made). The
    real test, not permission bits: as root ``os.access`` says yes to ``/proc``, where nothing can
    be created.

    Args:
        folder: the folder the command will create files in (it may not exist yet).
        flag: the setting that named ``path`` (``--out``, ``train.output_dir``), for the message.
        path: the path as given, for the message.

    Raises:
        ConfigError: ``{flag}: cannot create {path} (in {the existing folder}: {the OS's reason})``.
    """
    existing = Path(folder).expanduser()
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    try:
        if not existing.is_dir():
            raise NotADirectoryError("not a directory")
        tempfile.TemporaryFile(dir=existing).close()
    except OSError as exc:
        raise ConfigError(f"{flag}: cannot create {path} (in {existing}: {exc.strerror or exc})") from None


def _type_name(tp: Any) -> str:
    return getattr(tp, "__name__", None) or str(tp).replace("typing.", "")


def _convert(value: Any, tp: Any, name: str) -> Any:
    """``value`` checked (and minimally converted) against annotation ``tp``; ConfigError names ``name``."""
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if tp is Any:
        return value
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        errors = []
        for arg in (a for a in args if a is not type(None)):
            try:
                return _convert(value, arg, name)
            except ConfigError as exc:
                errors.append(str(exc))
        raise ConfigError(errors[0] if len(errors) == 1 else f"{name}: {value!r} matches none of {tp}")
    if origin is Literal:
        if value not in args:
            raise ConfigError(f"{name}: must be one of {list(args)}, got {value!r}")
        return value
    if dataclasses.is_dataclass(tp):
        if not isinstance(value, Mapping):
            raise ConfigError(f"{name}: expected a mapping of {tp.__name__} fields, got {value!r}")
        return from_dict(tp, value, prefix=name)
    if origin is tuple:
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{name}: expected a list, got {value!r}")
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(_convert(v, args[0], f"{name}[{i}]") for i, v in enumerate(value))
        if len(value) != len(args):
            raise ConfigError(f"{name}: expected {len(args)} items, got {len(value)}")
        return tuple(_convert(v, a, f"{name}[{i}]") for i, (v, a) in enumerate(zip(value, args, strict=True)))
    if origin in (dict, Mapping) or tp is dict:
        if not isinstance(value, Mapping):
            raise ConfigError(f"{name}: expected a mapping, got {value!r}")
        return dict(value)
    if tp is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{name}: expected true/false, got {value!r}")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{name}: expected an integer, got {value!r}")
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float, str)):
            raise ConfigError(f"{name}: expected a number, got {value!r}")
        try:
            number = float(value)
        except (ValueError, OverflowError):  # OverflowError: an int past float's range
            raise ConfigError(f"{name}: expected a number, got {value!r}") from None
        if math.isnan(number):
            raise ConfigError(f"{name}: expected a number, got nan")
        return number
    if tp is str:
        if not isinstance(value, str):
            raise ConfigError(f"{name}: expected a string, got {value!r}")
        return value
    raise ConfigError(f"{name}: unsupported field type {_type_name(tp)}")


def from_dict(cls: type, data: Mapping[str, Any], prefix: str = "") -> Any:
    """Build dataclass ``cls`` from ``data`` (missing keys keep their defaults).

    Raises:
        ConfigError: an unknown key, a value of the wrong type, or a failed ``__post_init__`` check;
            the message starts with the dotted field name.
    """
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    kwargs = {}
    for key, value in data.items():
        dotted = f"{prefix}.{key}" if prefix else str(key)
        if key not in fields:
            close = difflib.get_close_matches(str(key), list(fields), n=1)
            hint = f"; did you mean {prefix + '.' if prefix else ''}{close[0]}?" if close else ""
            raise ConfigError(f"{dotted}: unknown config key{hint} (valid: {', '.join(fields)})")
        kwargs[key] = _convert(value, hints[key], dotted)
    try:
        return cls(**kwargs)
    except ConfigError:
        raise
    except (ValueError, TypeError) as exc:
        raise ConfigError(_name_field(str(exc), cls, prefix, list(fields))) from None


def _name_field(message: str, cls: type, prefix: str, fields: list[str]) -> str:
    """Make a ``__post_init__`` message start with the dotted field name.

    Our sections already write ``algo.kl_coef ...``; a reused dataclass (``RolloutConfig``) writes
    ``RolloutConfig.max_tokens ...`` or names the field inside a longer message.
    """
    if not prefix or message.startswith(prefix + "."):
        return message
    message = message.replace(f"{cls.__name__}.", f"{prefix}.")
    if message.startswith(prefix + "."):
        return message
    named = [f for f in fields if re.search(rf"\b{re.escape(f)}\b", message)]
    return f"{prefix}.{named[0] if len(named) == 1 else ''}: {message}".replace(".: ", ": ")


def apply_overrides(data: dict[str, Any], overrides: Sequence[str]) -> dict[str, Any]:
    """Set ``key.sub=value`` pairs into a nested dict (a copy); values are parsed as YAML.

    Raises:
        ConfigError: an override without ``=`` or with an empty key, or ``overrides`` given as one
            string (a list of them is meant).
    """
    if isinstance(overrides, str):  # iterating it would read each character as an override
        raise ConfigError(f"overrides must be a list of 'key.sub=value' strings, got one str: [{overrides!r}] is meant")
    out = yaml.safe_load(yaml.safe_dump(data)) or {}
    for item in overrides:
        key, sep, raw = item.partition("=")
        key = key.strip()
        if not sep or not key or any(not part for part in key.split(".")):
            raise ConfigError(f"override {item!r}: expected key.sub=value")
        value = yaml.safe_load(raw) if raw.strip() else ""
        node = out
        parts = key.split(".")
        for i, part in enumerate(parts[:-1]):
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                raise ConfigError(f"{'.'.join(parts[: i + 1])}: is a value, cannot set {key}")
            node = child
        node[parts[-1]] = value
    return out


def config_to_dict(config: Any) -> dict[str, Any]:
    """Plain nested dict of a config (tuples as lists), loadable again by :func:`from_dict`."""
    return yaml.safe_load(yaml.safe_dump(_plain(dataclasses.asdict(config)))) or {}


def _plain(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def config_changes(old: Mapping[str, Any], new: Mapping[str, Any], ignore: Sequence[str] = ()) -> list[str]:
    """The dotted keys whose values differ between two configs as :func:`config_to_dict` writes them
    (a key only one side has counts), each as ``"key: old -> new"``, sorted; ``ignore``: keys left out.

    ``config_changes({"algo": {"kl_coef": 0.01}}, {"algo": {"kl_coef": 0.0}})`` ->
    ``["algo.kl_coef: 0.01 -> 0.0"]``.
    """
    return [f"{key}: {a} -> {b}" for key, (a, b) in changed_values(old, new, ignore).items()]


def changed_values(old: Mapping[str, Any], new: Mapping[str, Any], ignore: Sequence[str] = ()) -> dict[str, tuple[Any, Any]]:
    """``{dotted key: (old value, new value)}`` of :func:`config_changes`, in its order (``"(unset)"``
    for a key one side lacks)."""

    def flat(data: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
        out: dict[str, Any] = {}
        for key, value in data.items():
            name = f"{prefix}{key}"
            if isinstance(value, Mapping):  # a section, or a mapping-valued key: compared key by key
                out.update(flat(value, f"{name}."))
            else:
                out[name] = value
        return out

    a, b = flat(old), flat(new)
    missing = "(unset)"
    return {
        key: (a.get(key, missing), b.get(key, missing))
        for key in sorted(a.keys() | b.keys())
        if key not in ignore and a.get(key, missing) != b.get(key, missing)
    }
