"""Generated multi-turn trajectories through the real Collector, and their independent reference.

:func:`run_batch` draws ``n`` episodes for one :class:`template_families.Family`: opening messages,
scripted engine turns (random ids of the family's token space: ordinary text, think blocks, tool
calls in the family's format, empty turns, control ids mid-turn, a different EOS id or none at all)
and observations (user / tool messages, empty or holding the family's control-token text), runs
them through :class:`chatgym.trainer.rollout.Collector` with a :class:`ReplayEngine`, and returns
the trajectories with what the reference needs.

:func:`reference_ids` computes the expected token stream without chatgym's renderer or codec: each
observation's text is cut from Hugging Face ``apply_chat_template`` renderings of the whole
conversation, and text is encoded with the plain SmolLM2 tokenizer (``split_special_tokens=True``)
between the control tokens the template itself wrote (found by rendering the messages with their
control-token texts swapped for private-use markers of another plane than the codec's).
"""

from __future__ import annotations

import asyncio
import random
import re
from dataclasses import dataclass, field
from functools import cache
from typing import Any

import gymnasium as gym
from template_families import BY_NAME, Family, call_text, eos_ids, family_tokenizer

from chatgym.envs.spaces import ActionSpace, MessagesSpace
from chatgym.trainer.engines.replay import ReplayEngine
from chatgym.trainer.rollout import Collector, RolloutConfig

ADD_TOOL = {
    "type": "function",
    "function": {
        "name": "add",
        "description": "Add two integers.",
        "parameters": {
            "type": "object",
            "properties": {"a": {"type": "integer", "description": "first"}, "b": {"type": "integer"}},
            "required": ["a", "b"],
        },
    },
}
STUB = "ZQZplaceholderZQZ"  # an assistant content the reference cuts after
MARK = 0xF0000  # reference markers: U+F0000 + index (the codec uses U+E000/U+E001)


@dataclass
class Episode:
    opening: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None
    observations: list[list[dict[str, Any]]]
    turns: list[list[int]]
    prompt: list[int] = field(default_factory=list)
    calls: int = 0


class ScriptedEnv(gym.Env):
    """Returns the episode's scripted observations in order; terminates after the last turn."""

    def __init__(self, episode: Episode):
        self.observation_space = MessagesSpace()
        self.action_space = ActionSpace()
        self.episode = episode
        self.tools = episode.tools
        self.k = 0

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        self.k = 0
        return [dict(m) for m in self.episode.opening], {"task_id": "scripted", "tools": self.episode.tools}

    def step(self, action: str):
        self.k += 1
        if self.k > len(self.episode.observations):
            return [], 1.0, True, False, {}
        return [dict(m) for m in self.episode.observations[self.k - 1]], 0.0, False, False, {}


def _text(rng: random.Random, fam: Family) -> str:
    pieces = ["", " ", "ok", "Hello, world.", "  padded  ", "\n", "über 3€ ✓ 日本", "a\n\nb", '{"x": [1, 2]}']
    controls = [*fam.controls, "<|im_end|>", "<|im_start|>"]
    out = []
    for _ in range(rng.randint(0, 3)):
        r = rng.random()
        if r < 0.3:
            out.append(rng.choice(controls))  # control-token text in message content
        elif r < 0.4:
            out.append(call_text(fam, "add", {"a": rng.randint(0, 9), "b": 1}))
        else:
            out.append(rng.choice(pieces))
    return "".join(out)


def _observation(rng: random.Random, fam: Family, k: int) -> list[dict[str, Any]]:
    shape = rng.random()
    tools = [] if fam.name == "phi3_5" else [
        {"role": "tool", "content": _text(rng, fam), "tool_call_id": f"call_{k}_{j}", "name": "add"}
        for j in range(rng.randint(1, 2))
    ]
    user = [{"role": "user", "content": _text(rng, fam)}]
    if shape < 0.45 or not tools:
        return user
    return tools if shape < 0.85 else tools + user


def _turn(rng: random.Random, fam: Family, tok: Any, eos: tuple[int, ...]) -> list[int]:
    base = [i for i in range(3, 49152)]
    controls = [tok.convert_tokens_to_ids(t) for t in fam.controls]
    controls = [i for i in controls if i not in eos]
    ids: list[int] = []
    if fam.think and rng.random() < 0.5:
        ids += tok.encode(fam.think[0], add_special_tokens=False)
        ids += [rng.choice(base) for _ in range(rng.randint(0, 6))]
        ids += tok.encode(fam.think[1], add_special_tokens=False)
    r = rng.random()
    if r < 0.15:
        pass  # an empty turn
    elif r < 0.4:
        ids += tok.encode(call_text(fam, "add", {"a": rng.randint(0, 99), "b": 2}), add_special_tokens=False)
    else:
        for _ in range(rng.randint(1, 12)):
            ids.append(rng.choice(controls) if controls and rng.random() < 0.1 else rng.choice(base))
    end = rng.random()
    if end < 0.75:
        ids.append(eos[0])  # the template's own turn end
    elif end < 0.9 and len(eos) > 1:
        ids.append(rng.choice(eos[1:]))  # another EOS id of the model
    return ids  # else: no EOS (a cut turn)


def make_episode(rng: random.Random, fam: Family, index: int) -> Episode:
    tok = family_tokenizer(fam.name)
    eos = eos_ids(fam.name)
    opening: list[dict[str, Any]] = []
    if rng.random() < 0.6:
        opening.append({"role": "system", "content": "Be exact. " + _text(rng, fam)})
    opening.append({"role": "user", "content": f"Task {index}. " + _text(rng, fam)})
    n = rng.randint(1, 4)
    return Episode(
        opening,
        [ADD_TOOL] if rng.random() < 0.7 else None,
        [_observation(rng, fam, k) for k in range(n - 1)],
        [_turn(rng, fam, tok, eos) for _ in range(n)],
    )


def collector_for(fam: Family) -> Collector:
    tok = family_tokenizer(fam.name)
    engine = ReplayEngine(lambda ids: [], tok)
    config = RolloutConfig(
        chat_template=fam.text,
        chat_template_kwargs=dict(fam.kwargs) or None,
        eos_token_ids=eos_ids(fam.name),
        max_model_len=100_000,
        max_response_tokens=100_000,
        max_observation_tokens=100_000,
        episode_timeout_s=120.0,
    )
    return Collector(engine, tok, config)


def run_batch(fam: Family, seed: int, n: int, collector: Collector | None = None) -> list[tuple[Episode, Any]]:
    """``n`` generated episodes of ``fam`` through the Collector: ``[(episode, trajectory)]``."""
    rng = random.Random(f"{fam.name}-{seed}")
    episodes = [make_episode(rng, fam, seed * 100_000 + i) for i in range(n)]
    for ep in episodes:
        ep.prompt = reference_prompt(fam, ep)
    col = collector or collector_for(fam)

    def script(ids: list[int]) -> list[int]:
        # The engine sees only ids: the episode is the one whose reference prompt starts them.
        [ep] = [e for e in episodes if ids[: len(e.prompt)] == e.prompt and len(ids) >= len(e.prompt)][:1] or [None]
        if ep is None:
            raise AssertionError("the collector's prompt ids differ from every reference prompt")
        ep.calls += 1
        return ep.turns[ep.calls - 1]

    col.engine = ReplayEngine(script, col.tokenizer)
    trajs = asyncio.run(col.collect([lambda ep=ep: ScriptedEnv(ep) for ep in episodes], list(range(n))))
    return list(zip(episodes, trajs, strict=True))


# --- the reference ---------------------------------------------------------------------------------


@cache
def _plain_tokenizer() -> Any:
    from transformers import AutoTokenizer

    from chatgym.trainer.models.packaged import load_model_path

    return AutoTokenizer.from_pretrained(load_model_path("smollm2"))


@cache
def _control_pattern(name: str) -> re.Pattern[str]:
    texts = sorted(set(BY_NAME[name].controls) | {"<|endoftext|>", "<|im_start|>", "<|im_end|>"}, key=len, reverse=True)
    return re.compile("|".join(re.escape(t) for t in texts))


def _hide(value: Any, name: str, table: list[str]) -> Any:
    # Swap each control-token text inside a message / schema string for a marker of its own.
    if isinstance(value, str):
        def repl(m: re.Match[str]) -> str:
            table.append(m.group())
            return chr(MARK + len(table) - 1)

        return _control_pattern(name).sub(repl, value)
    if isinstance(value, dict):
        return {k: v if k == "role" else _hide(v, name, table) for k, v in value.items()}
    if isinstance(value, list):
        return [_hide(v, name, table) for v in value]
    return value


def _render(fam: Family, messages: list[dict[str, Any]], tools: Any, gen: bool = True) -> str:
    return family_tokenizer(fam.name).apply_chat_template(
        messages, tools=tools, tokenize=False, add_generation_prompt=gen, **fam.kwargs
    )


def _encode(fam: Family, text: str, table: list[str]) -> list[int]:
    """Ids of rendered text: control tokens left in it are the template's; the rest plain text."""
    tok, plain = family_tokenizer(fam.name), _plain_tokenizer()
    ids: list[int] = []
    pos = 0
    def piece(s: str) -> list[int]:
        s = _restore(s, table)
        return list(plain(s, add_special_tokens=False, split_special_tokens=True)["input_ids"]) if s else []

    for m in _control_pattern(fam.name).finditer(text):
        ids += piece(text[pos : m.start()])
        ids.append(tok.convert_tokens_to_ids(m.group()))
        pos = m.end()
    return ids + piece(text[pos:])


def _restore(text: str, table: list[str]) -> str:
    return re.sub(f"[{chr(MARK)}-{chr(MARK + 0xFFFD)}]", lambda m: table[ord(m.group()) - MARK], text)


def reference_prompt(fam: Family, ep: Episode) -> list[int]:
    table: list[str] = []
    return _encode(fam, _render(fam, _hide(ep.opening, fam.name, table), _hide(ep.tools, fam.name, table)), table)




def reference_ids(fam: Family, ep: Episode, turns: list[list[int]]) -> tuple[list[int], list[int]]:
    """The expected ``(token_ids, loss_mask)`` of an episode whose turns sampled ``turns``.

    Rule: prompt ids, then per turn its sampled ids exactly (mask 1), then (mask 0) the text the
    template writes after that assistant turn's content up to the next assistant content: its turn
    end and the observation messages and the next header, cut from a rendering of the whole
    conversation so far (the assistant turn replaced by a placeholder, which the observation's
    rendering must not depend on: checked against the real rendering). When a turn's last sampled id
    is the template's turn-end token, that sampled id stands for it (not repeated).
    """
    tok, eos = family_tokenizer(fam.name), set(eos_ids(fam.name))
    history = [dict(m) for m in ep.opening]
    ids, mask = list(ep.prompt), [0] * len(ep.prompt)
    for k, sampled in enumerate(turns):
        ids += sampled
        mask += [1] * len(sampled)
        text_ids = sampled[:-1] if sampled and sampled[-1] in eos else sampled
        history.append({"role": "assistant", "content": tok.decode(text_ids, skip_special_tokens=False)})
        if k == len(turns) - 1 or k >= len(ep.observations):
            break
        obs = ep.observations[k]
        table: list[str] = []
        stubbed = _hide([*history[:-1], {"role": "assistant", "content": STUB}, *obs], fam.name, table)
        marked = _render(fam, stubbed, _hide(ep.tools, fam.name, table))
        tail = marked[marked.rindex(STUB) + len(STUB) :]
        real = _render(fam, [*history, *obs], ep.tools)
        plain_tail = _restore(tail, table)
        assert real.endswith(plain_tail), (real[-200:], plain_tail)
        span = _encode(fam, tail, table)
        if sampled and span and sampled[-1] == span[0]:
            span = span[1:]
        ids += span
        mask += [0] * len(span)
        history += obs
    return ids, mask
