"""Cold-start SFT for the tool recipes: teach the model the tool's format before RL.

    python examples/recipes/sft_warmup.py --recipe retool --out runs/recipes/retool_sft --examples 16 --batch-size 4 --lr 5e-5
    python examples/recipes/sft_warmup.py --recipe search --config examples/recipes/search_r1/tags_cpu.yaml \\
        --out runs/recipes/search_sft_tags --examples 16 --batch-size 2 --lr 5e-5

RL cannot reinforce a tool call the policy never makes, and SmolLM2-135M-Instruct makes none on
either recipe's env (see the recipes' READMEs). ReTool (Feng et al. 2025, arXiv:2504.11536, section
3.1) fine-tunes on tool-integrated traces before RL; this script writes such traces itself, as real
episodes of the recipe's env (the env kwargs of ``--config``, its training split), and fine-tunes on
them:

* ``retool`` (MathPython-v0): the scripted policy calls ``python`` with ``print(<the task's
  expression>)``, the real sandbox answers, and the policy copies the printed value into
  ``<answer></answer>``;
* ``arith_chain`` (MathPython-v0, chains of four 3-4 digit terms): as ``retool``;
* ``countdown`` (MathPython-v0, countdown): the scripted policy runs a brute-force search program
  (:data:`COUNTDOWN_PROGRAM`, the task's numbers and target filled in) and copies the expression it
  prints into ``<answer></answer>``; a task the search cannot solve is skipped;
* ``search`` (Search-v0, tags or tool mode as the config says): the scripted policy searches for the
  question's key phrase (:func:`search_query`: the question without its ``What is`` / ``Who was``
  opening, quotes and question mark), the real BM25 retriever answers, and the policy answers with
  the gold article's title when a returned passage carries it (``(Title: <title>)``). An episode where
  the article was not retrieved, or that the env did not score correct, is skipped: every trace is a
  real, successful episode;
* ``usersim`` (UserSim-v0, the simulated-user party of ``chatgym cotrain``): no episode is played; the
  trace is the user's first turn as its engine sees it (the user system prompt with the task's
  scenario, the agent's greeting) answered by :func:`~chatgym.envs.usersim.env.scripted_opening` (the
  scenario's reason for calling and its known info). Without it the 135M user states no identifier
  of its scenario (0 of 48 sampled openings on six training scenarios, temperature 1), so the
  faithfulness reward's coverage half gives co-training no gradient; a few of these traces make it
  state them sometimes. Use ``--config`` for another domain (``env.kwargs.domain``).

Each trace is rendered with the rollout's chat template and tool schemas (what the policy sees in
RL); the loss covers the assistant turns only (each turn's text and its ``<|im_end|>``), never the
system, user, tool or retrieved tokens. AdamW, ``--epochs`` passes over ``--examples`` traces in
batches of ``--batch-size``, fp32 on ``--device``; the model and tokenizer are saved to ``--out`` (a
Hugging Face model directory: ``model.path`` of the RL config), with ``sft_summary.json``.

Tasks are tried in order from ``--offset`` (a negative offset counts from the end of the training
split) until ``--examples`` episodes are kept; the held-out test split is never used.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass
class Episode:
    """One scripted episode: the full message history, the final step's reward and info, the first
    observation's text (the tool's output / the retrieved passages) and, for ``search``, the query,
    the rank (1-based) of the gold article among the passages and the retrieved article ids."""

    messages: list[dict[str, Any]]
    reward: float
    info: dict[str, Any]
    observation: str
    query: str = ""
    gold_rank: int | None = None
    retrieved: list[str] | None = None


def python_episode(env: Any, task_index: int, code_for: Any, strict: bool = True) -> Episode | None:
    """One solved episode of MathPython-v0 (real sandbox): run ``code_for(task metadata)`` with the
    ``python`` tool and answer with the first thing it printed.

    Returns None, with ``strict`` off, when it printed nothing (or ``None``) or the env scored the
    answer wrong.

    Raises:
        RuntimeError: (``strict``) the same two cases.
    """

    async def run() -> Episode | None:
        await env.areset(options={"task_index": task_index})
        call = json.dumps({"name": "python", "arguments": {"code": code_for(env.task["metadata"])}})
        obs, *_ = await env.astep(f"<tool_call>\n{call}\n</tool_call>")
        value = re.search(r"stdout:\n(\S+)", obs[0]["content"])
        if value is None or value.group(1) == "None":
            if strict:
                raise RuntimeError(f"task {task_index}: the sandbox printed no answer: {obs[0]['content']!r}")
            return None
        _, reward, _, _, info = await env.astep(f"<answer>{value.group(1)}</answer>")
        if not info["success"]:
            if strict:
                raise RuntimeError(f"task {task_index}: the scripted answer was scored wrong: {info}")
            return None
        return Episode([dict(m) for m in env.messages], reward, info, obs[0]["content"])

    return asyncio.run(run())


def retool_episode(env: Any, task_index: int) -> Episode:
    """ReTool / arith_chain: ``print(<the task's expression>)``, then that value as the answer
    (:func:`python_episode`; raises RuntimeError when it does not solve the task)."""
    return python_episode(env, task_index, lambda meta: f"print({meta['expression']})")


# The scripted countdown program: a brute-force search over the orders of the numbers and the
# operators between them, written without brackets (Python's precedence applies). It solves 181 of
# the 200 held-out tasks of the countdown recipe (a bracketed solution is missed); what it prints is
# the answer.
COUNTDOWN_PROGRAM = """from itertools import permutations, product
def solve(nums, target):
    for p in permutations(nums):
        for ops in product("+-*/", repeat=len(nums) - 1):
            e = str(p[0]) + "".join(o + str(x) for o, x in zip(ops, p[1:]))
            if abs(eval(e) - target) < 1e-9:
                return e
print(solve({numbers}, {target}))"""


def countdown_program(numbers: list[int], target: int) -> str:
    """The scripted policy's ``python`` code for a countdown task (:data:`COUNTDOWN_PROGRAM`)."""
    return COUNTDOWN_PROGRAM.format(numbers=list(numbers), target=int(target))


def countdown_episode(env: Any, task_index: int) -> Episode | None:
    """One solved countdown episode (:func:`python_episode` running :func:`countdown_program`); None
    when the search found no bracket-free solution (it printed ``None``) or the env scored it wrong."""
    return python_episode(
        env, task_index, lambda meta: countdown_program(meta["numbers"], meta["target"]), strict=False
    )


_WH_OPENING = re.compile(r"^(?:what|who|which)\s+(?:is|was|are|were)\s+", re.I)


def search_query(question: str) -> str:
    """The query a policy could write for a WikiQA question: its key phrase, i.e. the question without
    the ``What is`` / ``Who was`` opening, the quotes and the question mark.

    ``'What is "1968 film by Stanley Kubrick"?'`` -> ``'1968 film by Stanley Kubrick'``;
    ``'Who was an English naturalist ...?'`` -> ``'an English naturalist ...'``.
    """
    q = _WH_OPENING.sub("", question.strip()).rstrip("?").strip()
    return q.replace('"', "").strip() or question.strip()


def search_episode(env: Any, task_index: int) -> Episode | None:
    """One Search-v0 episode (real BM25): search :func:`search_query` of the question, then answer
    with the gold title if a returned passage carries it. None when the gold article was not among
    the passages the model reads (after the env's ``max_passage_tokens`` cut) or the env scored the
    answer wrong."""

    async def run() -> Episode | None:
        await env.areset(options={"task_index": task_index})
        task = env.task
        title = task["answers"][0]  # the article title; answers[1] (if any) is it without "(...)"
        query = search_query(task["question"])
        if env.mode == "tags":
            obs, *_, searched = await env.astep(f"<search> {query} </search>")
        else:
            call = json.dumps({"name": "search", "arguments": {"query": query}})
            obs, *_, searched = await env.astep(f"<tool_call>\n{call}\n</tool_call>")
        text = obs[0]["content"] if obs else ""
        if f"(Title: {title}) " not in text:  # the passages shown, after the env's token cut
            return None
        rank = _rank_of(text, title)
        answer = f"<answer> {title} </answer>" if env.mode == "tags" else f"<answer>{title}</answer>"
        _, reward, terminated, _, info = await env.astep(answer)
        if not (terminated and info.get("success")):
            return None
        retrieved = list(searched.get("retrieved_ids", []))
        return Episode([dict(m) for m in env.messages], reward, info, text, query, rank, retrieved)

    return asyncio.run(run())


def _rank_of(text: str, title: str) -> int:
    """1-based number of the ``Doc i (Title: <title>) `` line in ``text``."""
    at = text.index(f"(Title: {title}) ") + len("(Title: ")
    return int(re.findall(r"Doc (\d+) \(Title: ", text[:at])[-1])


def usersim_episode(env: Any, task_index: int) -> Episode:
    from chatgym.envs import messages as M
    from chatgym.envs.usersim.env import GREETING, scripted_opening

    task = env.tasks[task_index]
    messages = [M.system(env.user_system_prompt(task)), M.user(GREETING), M.assistant(scripted_opening(task))]
    return Episode(messages, reward=1.0, info={}, observation="")


# recipe -> (default config, default --offset, episode function)
RECIPES: dict[str, tuple[str, int, Any]] = {
    "retool": ("examples/recipes/retool/cpu.yaml", 4000, retool_episode),
    "arith_chain": ("examples/recipes/arith_chain/cpu.yaml", 4000, retool_episode),
    "countdown": ("examples/recipes/countdown/cpu.yaml", 4000, countdown_episode),
    "search": ("examples/recipes/search_r1/tags_cpu.yaml", -400, search_episode),
    "usersim": ("examples/configs/cotrain_usersim_gpu.yaml", 0, usersim_episode),
}


def make_env(recipe: str, cfg: Any) -> Any:
    """The recipe's env on its training split, with the config's env kwargs (a ReTool worked example
    in the prompt, ``demo``, is left out: the traces carry none)."""
    import gymnasium as gym

    import chatgym  # noqa: F401  (registers the env ids)

    kwargs = {k: v for k, v in cfg.env.kwargs.items() if not (k == "demo" and recipe != "search")}
    return gym.make(cfg.env.id, split=cfg.env.train_split, **kwargs).unwrapped


def collect_episodes(recipe: str, env: Any, examples: int, offset: int) -> tuple[list[Episode], int]:
    """``examples`` kept episodes from the tasks ``offset, offset + 1, ...`` of ``env``'s split
    (negative ``offset``: from the end); returns them and the number of tasks tried.

    Raises:
        ValueError: the split ran out before ``examples`` episodes were kept.
    """
    episode = RECIPES[recipe][2]
    start = len(env.tasks) + offset if offset < 0 else offset
    kept, i = [], max(start, 0)
    while len(kept) < examples:
        if i >= len(env.tasks):
            raise ValueError(
                f"only {len(kept)} of {examples} episodes kept from tasks {start}..{i - 1}; lower --offset"
            )
        ep = episode(env, i)
        if ep is not None:
            kept.append(ep)
        i += 1
    return kept, i - max(start, 0)


def assistant_mask(
    tokenizer: Any, messages: list[dict[str, Any]], tools: list[dict[str, Any]]
) -> tuple[list[int], list[int]]:
    """Token ids of the rendered episode and a 0/1 mask that is 1 on the assistant turns' tokens.

    The template is prefix-preserving (``chatml_tools``): the text of ``messages[:k]`` with the
    generation prompt is a prefix of the text of ``messages[:k+1]``, so each assistant turn is the
    character span between the two; a token is trained when it starts inside such a span.

    Raises:
        ValueError: the template is not prefix-preserving.
    """

    def render(msgs: list[dict[str, Any]], gen: bool) -> str:
        return tokenizer.apply_chat_template(msgs, tools=tools, tokenize=False, add_generation_prompt=gen)

    text = render(messages, False)
    spans = []
    for k, m in enumerate(messages):
        if m["role"] == "assistant":
            start, end = len(render(messages[:k], True)), len(render(messages[: k + 1], False))
            if text[:end] != render(messages[: k + 1], False):
                raise ValueError("the chat template is not prefix-preserving; cannot mask by spans")
            # Up to the turn's <|im_end|> (where generation stops), not the template's newline after it.
            end = start + text[start:end].rindex("<|im_end|>") + len("<|im_end|>")
            spans.append((start, end))
    enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    mask = [int(any(s <= a < e for s, e in spans)) for a, _ in enc["offset_mapping"]]
    return enc["input_ids"], mask


def sft(
    model_path: Path,
    rows: list[tuple[list[int], list[int]]],
    *,
    pad_id: int,
    epochs: int,
    batch_size: int,
    lr: float,
    device: str,
) -> tuple[Any, list[float]]:
    """Fine-tune the causal LM at ``model_path`` on ``rows`` (token ids, 0/1 loss mask): next-token
    cross-entropy averaged over the masked tokens of each batch, AdamW, gradient norm clipped at 1,
    fp32. Returns the model (eval mode) and the loss of every step."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32).to(device).train()
    optim = torch.optim.AdamW(model.parameters(), lr=lr)
    losses = []
    for _ in range(epochs):
        order = torch.randperm(len(rows)).tolist()
        for b in range(0, len(order), batch_size):
            batch = [rows[j] for j in order[b : b + batch_size]]
            width = max(len(ids) for ids, _ in batch)
            ids = torch.tensor([i + [pad_id] * (width - len(i)) for i, _ in batch], device=device)
            mask = torch.tensor([m + [0] * (width - len(m)) for _, m in batch], device=device)
            attn = torch.tensor([[1] * len(i) + [0] * (width - len(i)) for i, _ in batch], device=device)
            logits = model(input_ids=ids, attention_mask=attn).logits[:, :-1].float()
            target, weight = ids[:, 1:], mask[:, 1:].float()
            nll = torch.nn.functional.cross_entropy(logits.transpose(1, 2), target, reduction="none")
            loss = (nll * weight).sum() / weight.sum()  # mean over trained (assistant) tokens
            optim.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optim.step()
            losses.append(loss.item())
            print(f"sft step {len(losses)}: loss {losses[-1]:.4f}", flush=True)
    return model.eval(), losses


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--recipe", choices=sorted(RECIPES), default="retool")
    p.add_argument("--out", required=True, type=Path, help="directory for the fine-tuned model")
    p.add_argument("--config", help="recipe config (env kwargs); default: the recipe's CPU config")
    p.add_argument("--model", default="smollm2", help="packaged model name or model directory")
    p.add_argument("--examples", type=int, default=64, help="successful episodes kept as traces")
    p.add_argument("--offset", type=int, help="first training-split task tried (< 0: from the end)")
    p.add_argument("--epochs", type=int, default=1, help="passes over the traces")
    p.add_argument("--batch-size", type=int, default=8, help="traces per AdamW step")
    p.add_argument("--lr", type=float, default=1e-5, help="AdamW learning rate (constant)")
    p.add_argument("--device", default="auto", help="auto | cpu | cuda")
    p.add_argument("--seed", type=int, default=0, help="torch seed (the order of the traces)")
    args = p.parse_args(argv)

    import torch
    from transformers import AutoTokenizer

    from chatgym.trainer.chat.tokenizer import get_tokenizer
    from chatgym.trainer.config.run import load_config
    from chatgym.trainer.models.packaged import load_model_path

    torch.manual_seed(args.seed)
    device = ("cuda" if torch.cuda.is_available() else "cpu") if args.device == "auto" else args.device
    default_config, default_offset, _ = RECIPES[args.recipe]
    if args.recipe == "usersim":  # a co-training config: its run sections, the cotrain: one set aside
        from chatgym.trainer.config.cotrain import load_cotrain_config

        cfg = load_cotrain_config(args.config or default_config)[0]
    else:
        cfg = load_config(args.config or default_config)
    offset = default_offset if args.offset is None else args.offset
    t0 = time.perf_counter()
    env = make_env(args.recipe, cfg)
    try:
        episodes, tried = collect_episodes(args.recipe, env, args.examples, offset)
        tools = None if args.recipe == "usersim" else env.tools  # the user party is offered no tools
    finally:
        env.close()
    tokenizer = get_tokenizer(args.model, cfg.rollout.chat_template or "auto")
    rows = [assistant_mask(tokenizer, ep.messages, tools) for ep in episodes]
    t_traces = time.perf_counter() - t0

    path = load_model_path(args.model)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    t1 = time.perf_counter()
    model, losses = sft(
        path, rows, pad_id=pad, epochs=args.epochs, batch_size=args.batch_size, lr=args.lr, device=device
    )
    t_train = time.perf_counter() - t1
    args.out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(args.out)
    AutoTokenizer.from_pretrained(path).save_pretrained(args.out)  # the model's own files, unchanged
    summary = {
        "recipe": args.recipe,
        "config": args.config or default_config,
        "examples": len(rows),
        "tasks_tried": tried,
        "trained_tokens": sum(sum(m) for _, m in rows),
        "steps": len(losses),
        "loss_first": losses[0],
        "loss_last": losses[-1],
        "traces_seconds": t_traces,
        "train_seconds": t_train,
        "seconds": time.perf_counter() - t0,
        "device": device,
    }
    ranks = [ep.gold_rank for ep in episodes if ep.gold_rank is not None]
    if ranks:  # search: where the gold article was among the passages of the kept episodes
        summary["gold_rank_counts"] = {str(r): ranks.count(r) for r in sorted(set(ranks))}
    (args.out / "sft_summary.json").write_text(json.dumps(summary, indent=1))
    print(json.dumps(summary))
    return summary


if __name__ == "__main__":
    main()
