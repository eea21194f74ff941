"""The learner's logprob head, plain vs chunked (``model.logprob_chunk_tokens``): the bytes autograd
keeps for the backward, the peak memory and the forward+backward time of lm head -> float32
log-softmax at the sampled token (+ entropy as a metric, the update's default) over N positions,
at SmolLM2's vocabulary (49,152 x hidden 576) and Qwen2.5-1.5B's (151,936 x hidden 1536). Random
lm-head weights that train (as a tied embedding does), fp32, CPU.

    python benchmarks/logprob_memory.py --tokens 256 --chunk 64 --repeats 3

Memory: each (vocabulary, head) runs once in a fresh process, which reports what autograd saved
(distinct storages other than the weight and the hidden states, which exist anyway) and its peak
RSS (``VmHWM``) above its RSS before the forward; that peak includes the weight's gradient (V x H x 4
bytes) in both heads. Time: both heads alternate in this process (a busy shared machine drifts),
medians of ``--repeats``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import torch

from chatgym.trainer.learner.logprobs import head_token_logprobs, token_logprobs

VOCABS = {"SmolLM2": (49152, 576), "Qwen2.5-1.5B": (151936, 1536)}
MB = 1e6


def inputs(vocab: int, hidden: int, tokens: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(1, tokens + 1, H) hidden states (requires grad), a (V, H) weight (requires grad), (1, tokens + 1)
    ids: ``tokens`` scored positions."""
    gen = torch.Generator().manual_seed(0)
    h = torch.randn(1, tokens + 1, hidden, generator=gen).requires_grad_()
    w = (torch.randn(vocab, hidden, generator=gen) * hidden**-0.5).requires_grad_()
    ids = torch.randint(0, vocab, (1, tokens + 1), generator=gen)
    return h, w, ids


def head(h: torch.Tensor, w: torch.Tensor, ids: torch.Tensor, chunk: int | None) -> torch.Tensor:
    """The summed logprobs of the plain head (``chunk`` None) or the chunked one; entropy as a metric."""
    if chunk is None:
        lp, _ = token_logprobs(torch.nn.functional.linear(h, w), ids, with_entropy=True, entropy_grad=False)
    else:
        lp, _ = head_token_logprobs(
            h, ids, w, None, chunk_tokens=chunk, with_entropy=True, entropy_grad=False
        )
    return lp.sum()


def _status_kb(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"{field} not in /proc/self/status")


def measure_memory(vocab: int, hidden: int, tokens: int, chunk: int | None) -> dict[str, float]:
    """In this (fresh) process: bytes saved for the backward, and the peak RSS of one forward+backward
    above the RSS before it."""
    h, w, ids = inputs(vocab, hidden, tokens)
    existing = {h.untyped_storage().data_ptr(), w.untyped_storage().data_ptr()}
    saved: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        if storage.data_ptr() not in existing:
            saved[storage.data_ptr()] = storage.nbytes()
        return t

    before = _status_kb("VmRSS")
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = head(h, w, ids, chunk)
    loss.backward()
    peak = _status_kb("VmHWM")
    return {"saved_bytes": sum(saved.values()), "peak_above_start_bytes": (peak - before) * 1024}


def memory_in_child(vocab: int, hidden: int, tokens: int, chunk: int | None) -> dict[str, float]:
    cmd = [sys.executable, __file__, "--child", json.dumps([vocab, hidden, tokens, chunk])]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def fwd_bwd_seconds(h: torch.Tensor, w: torch.Tensor, ids: torch.Tensor, chunk: int | None) -> float:
    t0 = time.perf_counter()
    head(h, w, ids, chunk).backward()
    h.grad = w.grad = None
    return time.perf_counter() - t0


def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown CPU"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=256, help="scored positions")
    parser.add_argument("--chunk", type=int, default=64, help="model.logprob_chunk_tokens")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--vocab", choices=sorted(VOCABS), action="append", help="default: both")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(measure_memory(*json.loads(args.child))))
        return

    load = os.getloadavg()
    print(
        f"{cpu_name()}, {torch.get_num_threads()} torch threads, torch {torch.__version__}, "
        f"load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}"
    )
    print(f"{args.tokens} scored positions, chunks of {args.chunk}, fp32, entropy as a metric")
    for name in args.vocab or list(VOCABS):
        vocab, hidden = VOCABS[name]
        logits_mb = args.tokens * vocab * 4 / MB
        print(f"\n{name}: V={vocab}, H={hidden}; one copy of the float32 logits = {logits_mb:.1f} MB")
        mem = {c: memory_in_child(vocab, hidden, args.tokens, c) for c in (None, args.chunk)}
        h, w, ids = inputs(vocab, hidden, args.tokens)
        fwd_bwd_seconds(h, w, ids, None), fwd_bwd_seconds(h, w, ids, args.chunk)  # warm-up
        times: dict[int | None, list[float]] = {None: [], args.chunk: []}
        for _ in range(args.repeats):
            for c in times:
                times[c].append(fwd_bwd_seconds(h, w, ids, c))
        for c, label in ((None, "plain  "), (args.chunk, "chunked")):
            m = mem[c]
            print(
                f"  {label}: saved for backward {m['saved_bytes'] / MB:9.3f} MB, "
                f"peak RSS above start {m['peak_above_start_bytes'] / MB:8.1f} MB, "
                f"forward+backward {statistics.median(times[c]):.3f} s"
            )
        ratio = statistics.median(times[args.chunk]) / statistics.median(times[None])
        print(f"  time chunked/plain: {ratio:.2f}x")


if __name__ == "__main__":
    main()
