"""A plain Gymnasium loop over Search-v0 with a scripted policy (no model needed).

The policy searches with the question itself, then answers with the title of the first passage it
got back — a retrieval-only baseline whose exact-match score is close to the retriever's recall@1
on one-hop questions. Replace ``scripted_policy`` with your model (render ``obs`` with its chat
template, send the reply to ``env.step``) to evaluate it.

    python examples/search_custom_loop.py [--mode tool|tags] [--episodes 20] [--retriever bm25]
    python examples/search_custom_loop.py --retriever-url http://127.0.0.1:8000   # a running
        # `chatgym serve-retriever --index wiki --kind bm25 --port 8000`
"""

from __future__ import annotations

import argparse
import json
import re

import gymnasium as gym

import chatgym  # noqa: F401  (registers the env ids)

_TITLE = re.compile(r"Doc 1 \(Title: (.*?)\) ")


def scripted_policy(question: str, observations: list[dict], mode: str) -> str:
    """First turn: search the question. Next turn: answer with the top passage's title."""
    if not observations:
        if mode == "tags":
            return f"<search>{question}</search>"
        call = {"name": "search", "arguments": {"query": question}}
        return f"<tool_call>{json.dumps(call)}</tool_call>"
    m = _TITLE.search(observations[-1]["content"])
    return f"<answer>{m.group(1) if m else 'unknown'}</answer>"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--mode", choices=["tool", "tags"], default="tool")
    p.add_argument("--episodes", type=int, default=20)
    p.add_argument("--retriever", choices=["bm25", "dense", "hybrid"], default="bm25")
    p.add_argument("--retriever-url", default=None)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()

    env = gym.make(
        "Search-v0",
        split="test",
        mode=args.mode,
        retriever=args.retriever,
        retriever_url=args.retriever_url,
        topk=3,
        max_passage_tokens=300,
    )
    total_em = total_f1 = 0.0
    for episode in range(args.episodes):
        obs, info = env.reset(seed=args.seed if episode == 0 else None)
        task = env.unwrapped.task
        seen: list[dict] = []
        terminated = truncated = False
        while not (terminated or truncated):
            action = scripted_policy(task["question"], seen, args.mode)
            obs, _, terminated, truncated, info = env.step(action)
            seen.extend(obs)
        total_em += info.get("em", 0.0)
        total_f1 += info.get("f1", 0.0)
        print(
            f"[{task['type']:>8}] EM {info.get('em', 0.0):.0f}  F1 {info.get('f1', 0.0):.2f}  "
            f"answer {info.get('answer')!r:40.40}  gold {task['answers'][0]!r}"
        )
    env.close()
    print(
        f"mean EM {total_em / args.episodes:.3f}, mean F1 {total_f1 / args.episodes:.3f} over {args.episodes} episodes"
    )


if __name__ == "__main__":
    main()
