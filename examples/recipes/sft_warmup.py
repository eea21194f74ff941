"""Cold-start SFT for the ReTool recipe: teach the model the `python` call format before RL.

    python examples/recipes/retool/sft_warmup.py --out runs/recipes/retool_sft --examples 16 --batch-size 4 --lr 5e-5

ReTool (Feng et al. 2025, arXiv:2504.11536, section 3.1) fine-tunes on code-integrated reasoning
traces before RL, because RL cannot reinforce a tool call the policy never makes. SmolLM2-135M makes
none on MathPython-v0 (zero-shot or with a worked example in the prompt; see the README), so this
script writes such traces itself and fine-tunes on them:

* each trace is a real MathPython-v0 episode on the recipe's training split (the env kwargs of
  ``--config``): the scripted policy calls ``python`` with ``print(<the task's expression>)``, the
  real sandbox answers, and the policy copies the printed value into ``<answer></answer>``;
* it is rendered with the rollout's chat template and tool schemas (what the policy sees in RL); the
  loss covers the assistant turns only (each turn's text and its ``<|im_end|>``), never the system,
  user or tool tokens;
* AdamW, ``--epochs`` passes over ``--examples`` traces in batches of ``--batch-size``; the model and
  tokenizer are saved to ``--out`` (a Hugging Face model directory: ``model.path`` of the RL config).

Tasks come from the end of the training split (``--offset``), away from the first tasks RL samples;
the held-out test split is never used.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import time
from pathlib import Path
from typing import Any


def scripted_episode(env: Any, task_index: int) -> list[dict[str, Any]]:
    """One solved episode of MathPython-v0 (real sandbox); returns the full message history."""

    async def run() -> list[dict[str, Any]]:
        await env.areset(options={"task_index": task_index})
        expr = env.task["metadata"]["expression"]
        call = json.dumps({"name": "python", "arguments": {"code": f"print({expr})"}})
        obs, *_ = await env.astep(f"<tool_call>\n{call}\n</tool_call>")
        value = re.search(r"stdout:\n(\S+)", obs[0]["content"])
        if value is None:
            raise RuntimeError(f"task {task_index}: the sandbox printed nothing: {obs[0]['content']!r}")
        *_, info = await env.astep(f"<answer>{value.group(1)}</answer>")
        if not info["success"]:
            raise RuntimeError(f"task {task_index}: the scripted answer was scored wrong: {info}")
        return [dict(m) for m in env.messages]

    return asyncio.run(run())


def assistant_mask(
    tokenizer: Any, messages: list[dict[str, Any]], tools: list[dict[str, Any]]
) -> tuple[list[int], list[int]]:
    """Token ids of the rendered episode and a 0/1 mask that is 1 on the assistant turns' tokens.

    The template is prefix-preserving (``chatml_tools``): the text of ``messages[:k]`` with the
    generation prompt is a prefix of the text of ``messages[:k+1]``, so each assistant turn is the
    character span between the two; a token is trained when it starts inside such a span.
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


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, type=Path, help="directory for the fine-tuned model")
    p.add_argument("--config", default="examples/recipes/retool/cpu.yaml", help="recipe config (env kwargs)")
    p.add_argument("--model", default="smollm2", help="packaged model name or model directory")
    p.add_argument("--examples", type=int, default=64)
    p.add_argument("--offset", type=int, default=4000, help="first training-split task used")
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--lr", type=float, default=1e-5)
    p.add_argument("--device", default="auto", help="auto | cpu | cuda")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)

    import gymnasium as gym
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    import chatgym  # noqa: F401  (registers the env ids)
    from chatgym.trainer.config import load_config
    from chatgym.trainer.models import load_model_path
    from chatgym.trainer.rollout.tokenizer import get_tokenizer

    torch.manual_seed(args.seed)
    device = ("cuda" if torch.cuda.is_available() else "cpu") if args.device == "auto" else args.device
    cfg = load_config(args.config)
    kwargs = {k: v for k, v in cfg.env.kwargs.items() if k != "demo"}  # SFT traces carry no demo
    env = gym.make(cfg.env.id, split=cfg.env.train_split, **kwargs).unwrapped
    tokenizer = get_tokenizer(args.model, cfg.rollout.chat_template or "auto")
    rows = []
    for i in range(args.offset, args.offset + args.examples):
        rows.append(assistant_mask(tokenizer, scripted_episode(env, i), env.tools))
    env.close()

    path = load_model_path(args.model)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).to(device).train()
    optim = torch.optim.AdamW(model.parameters(), lr=args.lr)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    losses, t0 = [], time.perf_counter()
    for _ in range(args.epochs):
        order = torch.randperm(len(rows)).tolist()
        for b in range(0, len(order), args.batch_size):
            batch = [rows[j] for j in order[b : b + args.batch_size]]
            width = max(len(ids) for ids, _ in batch)
            ids = torch.tensor([i + [pad] * (width - len(i)) for i, _ in batch], device=device)
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
    args.out.mkdir(parents=True, exist_ok=True)
    model.eval().save_pretrained(args.out)
    AutoTokenizer.from_pretrained(path).save_pretrained(args.out)  # the model's own files, unchanged
    summary = {
        "examples": len(rows),
        "trained_tokens": sum(sum(m) for _, m in rows),
        "steps": len(losses),
        "loss_first": losses[0],
        "loss_last": losses[-1],
        "seconds": time.perf_counter() - t0,
        "device": device,
    }
    (args.out / "sft_summary.json").write_text(json.dumps(summary, indent=1))
    print(json.dumps(summary))
    return summary


if __name__ == "__main__":
    main()
