"""Tokenizers with a chat template that renders tools.

SmolLM2's own template (like many small models') ignores ``tools=`` and ``tool`` messages. chatgym
ships ``templates/chatml_tools.jinja``: ChatML with hermes/Qwen-style tool calling (tool schemas in a
``<tools>`` block of the system turn, ``<tool_call>{json}</tool_call>`` for calls, tool results as
``<tool_response>`` user turns). It is prefix-preserving (rendering ``messages[:k]`` is a prefix of
rendering ``messages[:k+1]``), which the collector needs to append observation deltas as tokens.
"""

from __future__ import annotations

import os
from functools import cache
from pathlib import Path
from typing import Any

from ..models import load_model_path

TEMPLATES_DIR = Path(__file__).parent / "templates"
CHATML_TOOLS = "chatml_tools"


@cache
def builtin_template(name: str = CHATML_TOOLS) -> str:
    """Source of a template shipped in ``trainer/templates/<name>.jinja``.

    Raises:
        FileNotFoundError: no such template (the message lists the shipped ones).
    """
    path = TEMPLATES_DIR / f"{name}.jinja"
    if not path.is_file():
        shipped = sorted(p.stem for p in TEMPLATES_DIR.glob("*.jinja"))
        raise FileNotFoundError(f"chat_template {name!r} is not shipped; choose one of {shipped}")
    return path.read_text()


def template_supports_tools(template: str | None) -> bool:
    """True when a Jinja chat template reads the ``tools`` variable.

    Found by parsing the template (``jinja2.meta.find_undeclared_variables``), not by string search,
    so a template that only mentions the word "tools" in text does not count.
    """
    if not template:
        return False
    import jinja2
    from jinja2 import meta

    try:
        ast = jinja2.Environment().parse(template)
    except jinja2.TemplateSyntaxError:
        return False
    return "tools" in meta.find_undeclared_variables(ast)


def resolve_chat_template(model_template: str | None, chat_template: str = "auto") -> str:
    """Pick the template source.

    Rule for ``"auto"``: the model's own template when it reads ``tools`` (see
    :func:`template_supports_tools`), otherwise chatgym's ``chatml_tools``. ``"model"`` forces the
    model's own; a shipped name (``"chatml_tools"``) or a path to a ``.jinja`` file or a template
    string (anything containing ``{%`` or ``{{``) is used as given.

    Raises:
        ValueError: ``"model"`` asked for but the model has no template.
        FileNotFoundError: an unknown template name.
    """
    if chat_template == "auto":
        return model_template if template_supports_tools(model_template) else builtin_template(CHATML_TOOLS)
    if chat_template == "model":
        if not model_template:
            raise ValueError("chat_template='model' but the model's tokenizer has no chat template")
        return model_template
    if "{%" in chat_template or "{{" in chat_template:
        return chat_template
    path = Path(chat_template).expanduser()
    if path.suffix == ".jinja" and path.is_file():
        return path.read_text()
    return builtin_template(chat_template)


def get_tokenizer(name_or_path: str | os.PathLike[str], chat_template: str = "auto") -> Any:
    """Load a model's tokenizer with a tool-capable chat template.

    Args:
        name_or_path: packaged model name (``"smollm2"``) or local model directory
            (see :func:`chatgym.trainer.models.load_model_path`).
        chat_template: ``"auto"`` (default), ``"model"``, ``"chatml_tools"``, a ``.jinja`` path or a
            template string; see :func:`resolve_chat_template` for the rule.

    Returns:
        A ``transformers`` tokenizer whose ``chat_template`` is the chosen template.

    Raises:
        as :func:`load_model_path` and :func:`resolve_chat_template`.
    """
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(load_model_path(name_or_path))
    own = tokenizer.chat_template if isinstance(tokenizer.chat_template, str) else None
    tokenizer.chat_template = resolve_chat_template(own, chat_template)
    return tokenizer
