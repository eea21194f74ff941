"""Write docs/config.md: every section and field of the run config, from the config dataclasses.

    .venv/bin/python scripts/gen_config_docs.py            # rewrite docs/config.md
    .venv/bin/python scripts/gen_config_docs.py --check    # exit 1 when docs/config.md is stale

The sections are found by walking :class:`chatgym.trainer.config.run.Config`'s fields: a field whose type
is a dataclass is a section (``trainer.ray`` inside ``trainer``), any other field is a key. The
``cotrain:`` section of ``chatgym cotrain`` configs is a second root. A field's text is its entry in
the class docstring's ``Attributes:`` block: an entry may name several fields (``r, alpha,
dropout: ...``), name a second field after a semicolon (``lr: ...; value_lr: ...``), or mention one in
double backticks (``loss_agg: ...; ``loss_norm_constant`` its C``); such a field gets the whole entry.
``tests/test_docs.py`` regenerates the page in memory and fails when the file differs, and when a
field has no entry (:func:`undocumented`).
"""

from __future__ import annotations

import argparse
import dataclasses
import inspect
import re
import sys
import types
import typing
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "docs" / "config.md"
COMMAND = ".venv/bin/python scripts/gen_config_docs.py"

_ENTRY = re.compile(r"^(\w+(?:\s*,\s*\w+)*)\s*:\s*(.*)$")


def roots() -> list[tuple[str, type, str]]:
    """The config roots: ``(YAML prefix, dataclass, what reads it)``."""
    from chatgym.trainer.config.cotrain import CoTrainConfig
    from chatgym.trainer.config.run import Config

    return [
        ("", Config, "`chatgym train` and `chatgym cotrain` configs (examples/configs/*.yaml)"),
        ("cotrain", CoTrainConfig, "`chatgym cotrain` configs only (examples/configs/cotrain_*.yaml)"),
    ]


def attribute_entries(cls: type) -> list[tuple[list[str], str]]:
    """The ``Attributes:`` block of ``cls``'s docstring as ``(names, text)`` entries, text on one line."""
    doc = inspect.cleandoc(cls.__doc__ or "")
    lines = doc.splitlines()
    try:
        start = next(i for i, line in enumerate(lines) if line.strip() == "Attributes:") + 1
    except StopIteration:
        return []
    entries: list[tuple[list[str], list[str]]] = []
    for line in lines[start:]:
        if line and not line.startswith(" "):
            break  # the next section of the docstring
        stripped = line.strip()
        indent = len(line) - len(line.lstrip())
        match = _ENTRY.match(stripped) if indent <= 4 else None
        if match:
            names = [n.strip() for n in match.group(1).split(",")]
            entries.append((names, [match.group(2)]))
        elif entries and stripped:
            entries[-1][1].append(stripped)
    return [(names, " ".join(text)) for names, text in entries]


def field_docs(cls: type) -> dict[str, str]:
    """Field name -> its text, for the fields of ``cls`` its docstring documents.

    A field at the head of an entry gets the entry's text; a field named after a semicolon or
    mentioned inside an entry gets the whole entry, head included (``lr: peak learning rate;
    value_lr: the value head's``), so that the text still says what "its" refers to.
    """
    fields = [f.name for f in dataclasses.fields(cls)]
    entries = attribute_entries(cls)
    docs = {name: text for names, text in entries for name in names}
    for name in fields:
        if name in docs:
            continue
        pattern = re.compile(r"(?:;\s+|``)" + re.escape(name) + r"\b")
        for names, text in entries:
            if pattern.search(text):
                docs[name] = ", ".join(f"``{n}``" for n in names) + ": " + text
                break
    return {name: docs[name] for name in fields if name in docs}


def _type_text(tp: Any) -> str:
    """A resolved type as YAML sees it: ``Literal`` as its values, ``None`` as ``null``."""
    origin = typing.get_origin(tp)
    if origin is typing.Literal:
        return " | ".join(_value_text(v) for v in typing.get_args(tp))
    if origin in (typing.Union, types.UnionType):
        return " | ".join(_type_text(a) for a in typing.get_args(tp))
    if tp is type(None):
        return "null"
    if isinstance(tp, type) and origin is None:
        return tp.__name__
    return str(tp).replace("typing.", "")


_ROLE = re.compile(r":(?:func|class|mod|meth|data|attr):`~?([^`]+)`")


def _markdown(text: str) -> str:
    """Docstring markup (reST) as Markdown: ````x```` and ``:func:`x``` become ```x```."""
    text = _ROLE.sub(lambda m: f"`{m.group(1)}`", text)
    return text.replace("``", "`")


def _value_text(value: Any) -> str:
    """A default as it would be written in YAML."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return '""' if value == "" else value
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_value_text(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {_value_text(v)}" for k, v in value.items()) + "}"
    return repr(value)


def _default(f: dataclasses.Field) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return dataclasses.MISSING


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def sections(prefix: str, cls: type) -> list[tuple[str, type]]:
    """``(dotted prefix, dataclass)`` of ``cls`` and every section below it, depth first."""
    out = [(prefix, cls)]
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        tp = hints.get(f.name)
        if isinstance(tp, type) and dataclasses.is_dataclass(tp):
            out += sections(f"{prefix}.{f.name}" if prefix else f.name, tp)
    return out


def undocumented() -> list[str]:
    """Dotted names of the config keys whose class docstring has no entry for them."""
    missing = []
    for root, cls, _ in roots():
        for prefix, section in sections(root, cls):
            docs = field_docs(section)
            hints = typing.get_type_hints(section)
            for f in dataclasses.fields(section):
                tp = hints.get(f.name)
                is_section = isinstance(tp, type) and dataclasses.is_dataclass(tp)
                if not is_section and f.name not in docs:
                    missing.append(f"{prefix}.{f.name}" if prefix else f.name)
    return missing


def render() -> str:
    """The text of docs/config.md."""
    found = {root: sections(root, cls) for root, cls, _ in roots()}
    links = [f"[`{p}:`](#{_anchor(p, c)})" for root in found for p, c in found[root] if p and "." not in p]
    out = [
        "# Config reference",
        "",
        f"<!-- Generated by `{COMMAND}` from the config dataclasses; edit their docstrings, not this file. -->",
        "",
        "A run config is a YAML file of sections (`model:`, `engine:`, `env:`, ...), each a frozen",
        "dataclass; a key left out keeps its default. On the command line `key.sub=value` overrides any key",
        "(`chatgym train examples/configs/math_grpo.yaml algo.kl_coef=0.01 trainer.ray.num_learners=2`; the",
        "value is read as YAML). An unknown key, a wrong type or a bad value fails at start with the key's",
        "dotted name; so does a key given twice in one mapping (two `train:` sections, `lr` twice), with the",
        "file and its line, where YAML readers keep the last without a word. `config.yaml` in a run's output",
        "directory is the resolved config of that run.",
        "",
        "Sections: " + ", ".join(links) + ".",
        "",
    ]
    for root, _, used_by in roots():
        for prefix, section in found[root]:
            if not prefix:
                continue
            doc = _markdown(inspect.cleandoc(section.__doc__ or "").split("\n\n")[0].replace("\n", " "))
            out += [f"## `{prefix}:` ({section.__name__})", "", doc, ""]
            if prefix == root:
                out += [f"Read by {used_by}.", ""]
            out += ["| key | type | default | meaning |", "|---|---|---|---|", *_rows(prefix, section), ""]
    return "\n".join(out).rstrip() + "\n"


def _rows(prefix: str, section: type) -> list[str]:
    docs = field_docs(section)
    hints = typing.get_type_hints(section)
    rows = []
    for f in dataclasses.fields(section):
        key = f"{prefix}.{f.name}"
        tp = hints.get(f.name)
        if isinstance(tp, type) and dataclasses.is_dataclass(tp):
            rows.append(f"| `{key}` | section | | see [`{key}:`](#{_anchor(key, tp)}) |")
            continue
        default = _default(f)
        shown = "(required)" if default is dataclasses.MISSING else f"`{_cell(_value_text(default))}`"
        rows.append(f"| `{key}` | `{_cell(_type_text(tp))}` | {shown} | {_cell(_markdown(docs.get(f.name, '')))} |")
    return rows


def _anchor(prefix: str, cls: type) -> str:
    """GitHub's anchor of the heading ``## `prefix:` (Class)``."""
    heading = f"{prefix}: ({cls.__name__})".lower()
    return re.sub(r"[^\w\- ]", "", heading).replace(" ", "-")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Write docs/config.md from the config dataclasses.")
    ap.add_argument("--check", action="store_true", help="exit 1 when docs/config.md is stale; write nothing")
    args = ap.parse_args(argv)
    missing = undocumented()
    if missing:
        print(f"config keys without an Attributes entry in their class docstring: {', '.join(missing)}", file=sys.stderr)
        return 1
    text = render()
    if args.check:
        if not OUT.is_file() or OUT.read_text(encoding="utf-8") != text:
            print(f"{OUT.relative_to(ROOT)} is stale; run: {COMMAND}", file=sys.stderr)
            return 1
        return 0
    OUT.write_text(text, encoding="utf-8")
    print(f"wrote {OUT.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
