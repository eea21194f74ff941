"""``ReplayEngine``: a deterministic, scripted policy behind the Engine contract.

It emits fixed token ids chosen by a function of the prompt, so tests can assert exact token
streams (ids the model "sampled" that a tokenizer would never produce, cut completions, EOS
variants) and benchmarks can measure the collector without model compute. It honours
``max_tokens``, ``stop_token_ids`` and ``stop`` strings like a real engine: the output is cut at the
first stop id (kept), after the first id that completes a stop string (kept whole, the rule of
``common.StopStringChecker``; needs ``tokenizer``), or after ``max_tokens`` ids.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from chatgym.trainer.engines.base import Completion, SamplingParams
from chatgym.trainer.engines.common import StopStringChecker, refuse_images

Script = Callable[[list[int]], Sequence[int]]


def replay_logprob(token_id: int) -> float:
    """The logprob ReplayEngine reports for ``token_id``: ``-(token_id % 997 + 1) / 1000``.

    A fixed function of the id, so a test can check logprob/token alignment position by position.
    """
    return -(token_id % 997 + 1) / 1000


class ReplayEngine:
    """Scripted engine.

    Args:
        script: ``script(prompt_ids) -> ids`` the "model" would write next, before cutting; e.g.
            :func:`turn_script` picks the i-th scripted turn by counting assistant headers.
        tokenizer: optional, used only to fill ``Completion.text``.
        delay_s: seconds each ``generate`` call waits before answering (0: answer at once).

    ``Completion.finish_reason``: ``stop`` when the output ends on a stop id, a stop string (or the
    script ended), ``length`` when it was cut at ``max_tokens``; ``stop_reason`` names the stop id or
    string (None when the script simply ended).

    Raises (from ``generate``):
        ValueError: ``params.stop`` is set and the engine has no tokenizer.
    """

    def __init__(self, script: Script, tokenizer: Any = None, delay_s: float = 0.0):
        self.script = script
        self.tokenizer = tokenizer
        self.delay_s = delay_s
        self.calls: list[tuple[list[int], SamplingParams]] = []

    async def generate(self, prompt_ids: list[int], params: SamplingParams, *, images: Any = ()) -> Completion:
        """The script's ids for ``prompt_ids``, cut as the class doc says; ``images`` must be empty
        (``ValueError``: a script reads ids, not pixels; a test that sends images overrides this)."""
        refuse_images(type(self).__name__, images, "a scripted engine reads token ids only")
        self.calls.append((list(prompt_ids), params))
        if self.delay_s:
            await asyncio.sleep(self.delay_s)
        wanted = list(self.script(list(prompt_ids)))
        stops = set(params.stop_token_ids)
        checker = StopStringChecker(self.tokenizer, params.stop) if params.stop else None
        out: list[int] = []
        finish = "stop"
        reason: int | str | None = None
        for tid in wanted:
            if len(out) == params.max_tokens:
                finish = "length"
                break
            out.append(int(tid))
            if tid in stops:
                reason = int(tid)
                break
            if checker is not None:
                reason = checker(out)
                if reason is not None:
                    break
        text = self.tokenizer.decode(out, skip_special_tokens=True) if self.tokenizer is not None else ""
        logprobs = [replay_logprob(t) for t in out] if params.logprobs else []
        return Completion(out, logprobs, finish, text, stop_reason=reason)  # type: ignore[arg-type]

    def update_weights(self, weights: Mapping[str, Any] | Iterable[tuple[str, Any]]) -> None:
        raise TypeError("ReplayEngine is a scripted policy and has no weights to update")

    async def close(self) -> None:
        return None


def count_subsequence(ids: Sequence[int], pattern: Sequence[int]) -> int:
    """Non-overlapping occurrences of ``pattern`` in ``ids``."""
    n, m, i, count = len(ids), len(pattern), 0, 0
    while m and i + m <= n:
        if list(ids[i : i + m]) == list(pattern):
            count += 1
            i += m
        else:
            i += 1
    return count


def turn_script(turns: Sequence[Sequence[int]], header_ids: Sequence[int]) -> Script:
    """A script that answers the k-th assistant turn of an episode with ``turns[k]``.

    ``k`` is the number of ``header_ids`` (the template's assistant header, e.g. the ids of
    ``"<|im_start|>assistant\\n"``) in the prompt minus one; past the last scripted turn the last one
    is repeated.
    """

    def script(prompt_ids: list[int]) -> Sequence[int]:
        k = max(count_subsequence(prompt_ids, header_ids) - 1, 0)
        return turns[min(k, len(turns) - 1)]

    return script
