"""Reading a user's YAML file strictly: the one reader of the files a user writes (a run config of
``chatgym train`` / ``cotrain`` / ``gateway``, an env's ``tools_config``), in the base layer so that
both the trainer and the envs use it.

PyYAML keeps the last of two equal keys in one mapping without a word: a second ``train:`` section,
or ``lr`` written twice inside one, and the first is lost. :class:`UniqueKeyLoader` refuses that
(merge keys, ``<<: *base``, may still be overridden: that is what they are for).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import yaml
from yaml.constructor import ConstructorError
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

_MERGE_TAG = "tag:yaml.org,2002:merge"


class YAMLFileError(ValueError):
    """A YAML file that cannot be used as written: one line that starts with the file's path (and
    ``:line:column`` where the problem has a place)."""


class UniqueKeyLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` that refuses a key given twice in one mapping.

    Raises (from ``yaml.load``):
        yaml.constructor.ConstructorError: ``duplicate key <dotted.key> (first on line N)``, its mark
            at the second occurrence.
    """

    _root: Node | None = None

    def construct_document(self, node: Node) -> Any:
        self._root = node  # where a duplicate's dotted path is looked up from
        return super().construct_document(node)

    def construct_mapping(self, node: MappingNode, deep: bool = False) -> dict[Any, Any]:
        if isinstance(node, MappingNode):
            first_seen: dict[Any, Node] = {}
            for key_node, _ in node.value:  # before merge keys are flattened in (those may be overridden)
                if key_node.tag == _MERGE_TAG:
                    continue
                key = self.construct_object(key_node, deep=False)
                try:
                    first = first_seen.setdefault(key, key_node)
                except TypeError:  # an unhashable key: the base constructor refuses it
                    continue
                if first is not key_node:
                    where = _dotted(self._root, node)
                    name = f"{where}.{key}" if where else str(key)
                    raise ConstructorError(
                        None, None,
                        f"duplicate key {name} (first on line {first.start_mark.line + 1})",
                        key_node.start_mark,
                    )  # fmt: skip
        return super().construct_mapping(node, deep=deep)


def _dotted(root: Node | None, target: Node) -> str:
    """The dotted path of ``target`` below ``root`` (``train``, ``mcp_servers[0]``); '' at the top."""

    def walk(node: Node, path: str, seen: set[int]) -> str | None:
        if node is target:
            return path
        if id(node) in seen:  # an alias back up the tree
            return None
        seen.add(id(node))
        if isinstance(node, MappingNode):
            children = [
                (f"{path}.{k.value}" if path else str(k.value)) if isinstance(k, ScalarNode) else f"{path}.?"
                for k, _ in node.value
            ]
            pairs = zip(children, (v for _, v in node.value), strict=True)
        elif isinstance(node, SequenceNode):
            pairs = ((f"{path}[{i}]", v) for i, v in enumerate(node.value))
        else:
            return None
        for child_path, child in pairs:
            if (found := walk(child, child_path, seen)) is not None:
                return found
        return None

    return (walk(root, "", set()) if root is not None else None) or ""


def read_yaml_file(path: str | os.PathLike[str]) -> Any:
    """The YAML document in the file ``path`` (None for an empty file), read as UTF-8 with
    :class:`UniqueKeyLoader`.

    Raises:
        FileNotFoundError: no such file.
        YAMLFileError: one line starting with ``path``: a directory (``<path>: is a directory, not a
            config file``), a file that is not UTF-8, malformed YAML, a control character, nesting
            too deep for PyYAML, or a key given twice in one mapping (``<path>:<line>:<column>:
            duplicate key train.lr (first on line 3)``).
    """
    try:
        text = Path(path).read_text(encoding="utf-8")
    except IsADirectoryError:  # the OS's text, "[Errno 21] Is a directory: '/tmp'", named no setting
        raise YAMLFileError(f"{path}: is a directory, not a config file") from None
    except UnicodeDecodeError as exc:
        raise YAMLFileError(f"{path}: not UTF-8 text (byte {exc.start}: {exc.reason})") from None
    try:
        return yaml.load(text, Loader=UniqueKeyLoader)  # a SafeLoader: no arbitrary objects
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark
        at = f":{mark.line + 1}:{mark.column + 1}" if mark is not None else ""
        raise YAMLFileError(f"{path}{at}: {exc.problem or exc}") from None
    except yaml.reader.ReaderError as exc:  # a control character: no MarkedYAMLError, two lines of its own
        line = text.count("\n", 0, exc.position) + 1
        column = exc.position - (text.rfind("\n", 0, exc.position) + 1) + 1
        code = exc.character if isinstance(exc.character, int) else ord(exc.character)  # PyYAML gives ord()
        raise YAMLFileError(f"{path}:{line}:{column}: character #x{code:04x}: {exc.reason}") from None
    except RecursionError:  # PyYAML's composer recurses once a level: thousands of nested brackets
        raise YAMLFileError(f"{path}: nested too deeply to read (a few thousand levels)") from None
