"""Chat-template families of published models, each on a token space built offline.

Each :class:`Family` names a model's own template (tests/data/chat_templates/, SOURCES.md there), the
control tokens its tokenizer has, its EOS ids, and how its model writes a think block and a tool call.

**The token space.** No model hub is reachable, so a family's tokenizer is the packaged SmolLM2
tokenizer (49,152 ids: byte-level BPE, ChatML's ``<|im_start|>`` = 1 and ``<|im_end|>`` = 2) with the
family's control tokens added as tokens of their own (ids from 49,152 up), flagged special or not as
in the model's own tokenizer (Qwen's ``<think>`` / ``<tool_call>`` are added but not special). Every
control token is then one id, exactly one way to write it, as in the model's tokenizer; ordinary text
splits into SmolLM2's BPE pieces instead of the model's. What is under test is the template logic and
the collector's token accounting, which depend on where control tokens sit, not on how plain text is
cut into pieces.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

TEMPLATES = Path(__file__).parent / "data" / "chat_templates"


@dataclass(frozen=True)
class Family:
    """One template family.

    Attributes:
        name: the test id.
        template: file name under tests/data/chat_templates/.
        special: control tokens the model's tokenizer flags special (added when SmolLM2 lacks them).
        plain_added: added tokens that are not special (the model writes them in its own turns).
        eos: EOS tokens (the model's generation config); the first is the template's turn end.
        bos / eos_token: the tokenizer's bos_token / eos_token that templates print.
        kwargs: template variables passed with every rendering (Qwen3's enable_thinking).
        think: how the model opens and closes reasoning, or None.
        tool_call: how the model writes one call, ``{name}`` / ``{args}`` filled in.
        refused: the start-up refusal expected (a regex of its reason), or None when supported.
    """

    name: str
    template: str
    special: tuple[str, ...]
    plain_added: tuple[str, ...] = ()
    eos: tuple[str, ...] = ()
    bos: str | None = None
    eos_token: str | None = None
    kwargs: dict[str, Any] = field(default_factory=dict)
    think: tuple[str, str] | None = None
    tool_call: str = '<tool_call>\n{{"name": "{name}", "arguments": {args}}}\n</tool_call>'
    refused: str | None = None

    @property
    def text(self) -> str:
        return (TEMPLATES / self.template).read_text()

    @property
    def controls(self) -> tuple[str, ...]:
        return self.special + self.plain_added


CHATML = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
QWEN_PLAIN = ("<tool_call>", "</tool_call>")

FAMILIES: list[Family] = [
    Family("qwen2_5", "qwen2_5.jinja", CHATML, QWEN_PLAIN, ("<|im_end|>", "<|endoftext|>"), eos_token="<|im_end|>"),
    Family(
        "qwen3_thinking", "qwen3.jinja", CHATML,
        (*QWEN_PLAIN, "<think>", "</think>", "<tool_response>", "</tool_response>"),
        ("<|im_end|>", "<|endoftext|>"), eos_token="<|im_end|>", think=("<think>\n", "\n</think>\n\n"),
    ),
    Family(
        "qwen3_non_thinking", "qwen3.jinja", CHATML,
        (*QWEN_PLAIN, "<think>", "</think>", "<tool_response>", "</tool_response>"),
        ("<|im_end|>", "<|endoftext|>"), eos_token="<|im_end|>", kwargs={"enable_thinking": False},
    ),
    Family(
        "llama3_2", "llama3_2.jinja",
        ("<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>",
         "<|eom_id|>", "<|python_tag|>"),
        eos=("<|eot_id|>", "<|eom_id|>", "<|end_of_text|>"), bos="<|begin_of_text|>", eos_token="<|eot_id|>",
        kwargs={"date_string": "26 Jul 2024"},
        tool_call='{{"name": "{name}", "parameters": {args}}}',
    ),
    Family(
        "mistral_nemo", "mistral_nemo.jinja",
        ("<s>", "</s>", "[INST]", "[/INST]", "[TOOL_CALLS]", "[AVAILABLE_TOOLS]", "[/AVAILABLE_TOOLS]",
         "[TOOL_RESULTS]", "[/TOOL_RESULTS]"),
        eos=("</s>",), bos="<s>", eos_token="</s>", tool_call='[TOOL_CALLS][{{"name": "{name}", "arguments": {args}}}]',
        refused=r"not prefix-preserving: .*Tool call IDs should be alphanumeric strings with length 9!",
    ),
    Family(
        "gemma2", "gemma2.jinja", ("<bos>", "<eos>", "<start_of_turn>", "<end_of_turn>"),
        eos=("<end_of_turn>", "<eos>"), bos="<bos>", eos_token="<eos>", refused=r"raised TemplateError: System role not supported; .*raised TemplateError: Conversation roles must alternate",
    ),
    Family(
        "gpt_oss", "gpt_oss.jinja",
        ("<|start|>", "<|message|>", "<|end|>", "<|channel|>", "<|return|>", "<|call|>", "<|constrain|>",
         "<|endoftext|>"),
        eos=("<|return|>", "<|call|>"), eos_token="<|return|>",
        tool_call="<|channel|>commentary to=functions.{name} <|constrain|>json<|message|>{args}",
        refused=r"does not write an assistant turn's content as is .*writes no EOS token after an assistant turn",
    ),
    Family(
        "glm4_6", "glm4_6.jinja",
        ("[gMASK]", "<sop>", "<|system|>", "<|user|>", "<|assistant|>", "<|observation|>", "<|endoftext|>"),
        ("<think>", "</think>", "<tool_call>", "</tool_call>", "<arg_key>", "</arg_key>", "<arg_value>",
         "</arg_value>", "<tool_response>", "</tool_response>"),
        eos=("<|user|>", "<|observation|>", "<|endoftext|>"), eos_token="<|endoftext|>",
        think=("<think>", "</think>"),
        tool_call="<tool_call>{name}\n<arg_key>a</arg_key>\n<arg_value>{args}</arg_value>\n</tool_call>",
        refused=r"does not write an assistant turn's content as is .*ends an assistant turn with '<\|observation\|>\\n' before a tool message",
    ),
    Family(
        "deepseek_v3_1", "deepseek_v3_1.jinja",
        ("<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜User｜>", "<｜Assistant｜>"),
        ("<think>", "</think>", "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>", "<｜tool▁call▁begin｜>",
         "<｜tool▁call▁end｜>", "<｜tool▁sep｜>", "<｜tool▁output▁begin｜>", "<｜tool▁output▁end｜>"),
        eos=("<｜end▁of▁sentence｜>",), bos="<｜begin▁of▁sentence｜>", eos_token="<｜end▁of▁sentence｜>",
        tool_call="<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>{name}<｜tool▁sep｜>{args}<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
    ),
    Family(
        "phi3_5", "phi3_5.jinja", ("<|endoftext|>", "<|system|>", "<|user|>", "<|assistant|>", "<|end|>"),
        eos=("<|end|>", "<|endoftext|>"), eos_token="<|endoftext|>",
        tool_call='{{"name": "{name}", "arguments": {args}}}',
    ),
    Family("smollm2", "smollm2.jinja", CHATML, eos=("<|im_end|>",), eos_token="<|im_end|>"),
]

BY_NAME = {f.name: f for f in FAMILIES}


@cache
def family_tokenizer(name: str) -> Any:
    """SmolLM2's tokenizer with the family's control tokens added and its template set (cached)."""
    from tokenizers import AddedToken
    from transformers import AutoTokenizer

    from chatgym.trainer.models.packaged import load_model_path

    fam = BY_NAME[name]
    tok = AutoTokenizer.from_pretrained(load_model_path("smollm2"))
    have = set(tok.get_vocab())
    tok.add_tokens([AddedToken(t, special=True, normalized=False) for t in fam.special if t not in have], special_tokens=True)
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in fam.plain_added if t not in have])
    if fam.bos is not None:
        tok.bos_token = fam.bos
    if fam.eos_token is not None:
        tok.eos_token = fam.eos_token
    tok.chat_template = fam.text
    return tok


def eos_ids(name: str) -> tuple[int, ...]:
    tok = family_tokenizer(name)
    return tuple(tok.convert_tokens_to_ids(t) for t in BY_NAME[name].eos)


def call_text(fam: Family, name: str, arguments: dict[str, Any]) -> str:
    return fam.tool_call.format(name=name, args=json.dumps(arguments))
