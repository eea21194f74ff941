"""Cold-start SFT for the visual recipe: the reference policy's VisualGrid-v0 episodes, fine-tuned into
the SmolVLM-shaped model (connector, language model and, unless frozen, the vision tower).

    python examples/recipes/visual/visual_sft.py --config examples/recipes/visual/cpu.yaml \\
        --out runs/recipes/visual_sft --episodes 48 --batch-size 8 --epochs 2 --lr 1e-4

``smolvlm``'s vision tower and connector are random (docs/multimodal.md): the model as built cannot
see the board, and SmolLM2 does not answer in ``<move>`` tags. As in the tool recipes'
``sft_warmup.py``, RL starts from a short supervised pass over scripted episodes:

* each episode is :func:`chatgym.envs.visual.episodes.reference_episode` on the recipe's env (its
  kwargs from ``--config``, the training split, tasks from ``--offset``): the env's shortest-solution
  policy, one ``<move>`` a turn, the env's new board image after each move;
* the episode is then replayed through the rollout's own :class:`~chatgym.trainer.rollout.collector.Collector`
  (an engine that answers with the reference moves), so the SFT rows are the token ids RL sees —
  the chat template, the image placeholders expanded by the processor, the ``</move>`` stop string,
  the closing ``<|im_end|>`` — with its loss mask: 1 on each move's ids, 0 on the system prompt, the
  boards, the env's replies and the closing tokens;
* loss: next-token cross-entropy averaged over the masked tokens of each batch, through the learner's
  own forward with pixels (:func:`chatgym.trainer.learner.forward.forward_logprobs`), AdamW, gradient
  norm clipped at 1, the learner's compute dtype (bf16 autocast on native-bf16 CPUs and CUDA).

The model, its processor (tokenizer and image processor) and ``sft_summary.json`` go to ``--out``: the
RL config's ``model.path``.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import time
from pathlib import Path
from typing import Any


class ReferenceMoves:
    """An engine (no model) that answers each turn with the next of ``turns`` (texts ending on the
    env's stop string), as a ``stop`` completion; the collector adds the closing tokens."""

    def __init__(self, tokenizer: Any):
        self.tokenizer = tokenizer
        self.turns: list[str] = []

    async def generate(self, prompt_ids: list[int], params: Any, *, images: Any = ()) -> Any:
        from chatgym.trainer.engines.base import Completion

        text = self.turns.pop(0)
        ids = self.tokenizer.encode(text, add_special_tokens=False)
        return Completion(ids, [0.0] * len(ids), "stop", text, stop_reason="</move>")

    def update_weights(self, weights: Any) -> None:
        raise NotImplementedError


def make_env(cfg: Any, split: str | None = None) -> Any:
    import gymnasium as gym

    import chatgym  # noqa: F401  (registers the env ids)

    return gym.make(cfg.env.id, split=split or cfg.env.train_split, **cfg.env.kwargs).unwrapped


def reference_trajectories(cfg: Any, tokenizer: Any, processor: Any, episodes: int, offset: int) -> list[Any]:
    """``episodes`` trajectories of the reference policy on tasks ``offset, offset + 1, ...`` of the
    training split, as the collector writes them (module doc).

    Raises:
        RuntimeError: a replay that did not end as its reference episode did (a different success or
            number of turns, or an error).
    """
    from chatgym.envs.visual.episodes import reference_episode
    from chatgym.trainer.rollout.collector import Collector

    engine = ReferenceMoves(tokenizer)
    rollout = dataclasses.replace(cfg.rollout, trace_path=None, temperature=1.0)
    collector = Collector(engine, tokenizer, rollout, processor=processor)
    env = make_env(cfg)

    async def run() -> list[Any]:
        out = []
        for i in range(offset, offset + episodes):
            ref = reference_episode(env, options={"task_index": i})
            engine.turns = [m["content"] for m in ref.messages if m["role"] == "assistant"]
            [traj] = await collector.collect(lambda: make_env(cfg), [i])
            if traj.error or traj.success != ref.success or len(traj.info["turns"]) != ref.turns:
                raise RuntimeError(f"task {i}: the replay differs from the reference episode: {traj.error or traj.info}")
            out.append(traj)
        return out

    try:
        return asyncio.run(run())
    finally:
        collector.close()
        env.close()


def sft(model: Any, trajs: list[Any], pixels: Any, *, pad_id: int, epochs: int, batch_size: int, lr: float,
        device: Any, autocast: Any) -> list[float]:
    """Fine-tune ``model`` in place on ``trajs`` (their loss masks); returns each step's loss."""
    import torch

    from chatgym.trainer.learner.batch import collate
    from chatgym.trainer.learner.forward import forward_logprobs

    params = [p for p in model.parameters() if p.requires_grad]
    optim = torch.optim.AdamW(params, lr=lr)
    losses: list[float] = []
    model.train()
    for _ in range(epochs):
        order = torch.randperm(len(trajs)).tolist()
        for b in range(0, len(order), batch_size):
            batch = collate([trajs[j] for j in order[b : b + batch_size]], pad_id, pixels).to(device)
            with autocast():
                logprobs, _ = forward_logprobs(model, batch, with_entropy=False)
            weight = batch.loss_mask.float()
            loss = -(logprobs.float() * weight).sum() / weight.sum()  # mean over the moves' tokens
            optim.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            optim.step()
            losses.append(loss.item())
            print(f"sft step {len(losses)}: loss {losses[-1]:.4f}", flush=True)
    return losses


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--config", default="examples/recipes/visual/cpu.yaml", help="recipe config (env kwargs, rollout)")
    p.add_argument("--out", required=True, type=Path, help="directory for the fine-tuned model")
    p.add_argument("--model", default="smolvlm", help="the VLM to start from (name or directory)")
    p.add_argument("--episodes", type=int, default=48, help="reference episodes")
    p.add_argument("--offset", type=int, default=1000, help="first training-split task (RL draws from task 0 on)")
    p.add_argument("--epochs", type=int, default=2, help="passes over the episodes")
    p.add_argument("--batch-size", type=int, default=8, help="episodes per AdamW step")
    p.add_argument("--lr", type=float, default=1e-4, help="AdamW learning rate (constant)")
    p.add_argument("--freeze-vision", action="store_true", help="keep the vision tower fixed (the connector trains)")
    p.add_argument("--device", default="auto", help="auto | cpu | cuda")
    p.add_argument("--seed", type=int, default=0, help="torch seed (the order of the episodes)")
    args = p.parse_args(argv)

    import torch
    from transformers import AutoModelForImageTextToText

    from chatgym.trainer.chat.tokenizer import get_tokenizer
    from chatgym.trainer.config.run import load_config
    from chatgym.trainer.learner.policy import autocast_context, resolve_compute_dtype
    from chatgym.trainer.models import vlm
    from chatgym.trainer.models.packaged import load_model_path

    torch.manual_seed(args.seed)
    device = torch.device(("cuda" if torch.cuda.is_available() else "cpu") if args.device == "auto" else args.device)
    cfg = load_config(args.config)
    path = load_model_path(args.model)
    tokenizer = get_tokenizer(path, cfg.rollout.chat_template or "auto")
    processor = vlm.load_processor(path, tokenizer)
    if processor is None:
        raise SystemExit(f"{args.model}: not a vision-language model")
    t0 = time.perf_counter()
    trajs = reference_trajectories(cfg, tokenizer, processor, args.episodes, args.offset)
    t_traces = time.perf_counter() - t0

    model = AutoModelForImageTextToText.from_pretrained(path, dtype=torch.float32).to(device)
    if args.freeze_vision:
        for module in vlm.vision_modules(model):
            module.requires_grad_(False)
    compute, _ = resolve_compute_dtype("auto", "float32", device)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    t1 = time.perf_counter()
    losses = sft(model, trajs, vlm.ImagePixels(processor.image_processor), pad_id=pad, epochs=args.epochs,
                 batch_size=args.batch_size, lr=args.lr, device=device,
                 autocast=lambda: autocast_context(device, compute, "float32"))
    t_train = time.perf_counter() - t1
    args.out.mkdir(parents=True, exist_ok=True)
    model.eval().save_pretrained(args.out)
    vlm.load_processor(path).save_pretrained(args.out)  # the model's own tokenizer files and image processor
    summary = {
        "config": args.config,
        "model": args.model,
        "episodes": len(trajs),
        "tasks": [args.offset, args.offset + args.episodes - 1],
        "moves": sum(len(t.info["turns"]) for t in trajs),
        "images": sum(len(t.images) for t in trajs),
        "trained_tokens": sum(sum(t.loss_mask) for t in trajs),
        "tokens": sum(len(t.token_ids) for t in trajs),
        "freeze_vision": args.freeze_vision,
        "compute_dtype": compute,
        "steps": len(losses),
        "loss_first": losses[0],
        "loss_last": losses[-1],
        "losses": losses,
        "traces_seconds": t_traces,
        "train_seconds": t_train,
        "seconds": time.perf_counter() - t0,
        "device": str(device),
    }
    (args.out / "sft_summary.json").write_text(json.dumps(summary, indent=1))
    print(json.dumps({k: v for k, v in summary.items() if k != "losses"}))
    return summary


if __name__ == "__main__":
    main()
