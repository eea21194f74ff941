"""One turn of a token-level episode: its budget, the checks of the engine's completion, the
stop-string cut and the finish reason (the rules are in :mod:`chatgym.trainer.rollout.collector`'s
docstring). Pure functions of the completion: no engine, env or trajectory is touched here.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Any

from chatgym.trainer.engines.common import first_stop_cut
from chatgym.trainer.rollout.episode import EpisodeFailure


@dataclass(frozen=True)
class TurnBudget:
    """The tokens the next turn may generate, from the three budgets (all in tokens).

    Attributes:
        max_tokens: the per-turn budget (``RolloutConfig.max_tokens``).
        response_left: ``max_response_tokens`` minus the tokens the trajectory has generated.
        context_left: ``max_model_len`` minus the trajectory's length.
    """

    max_tokens: int
    response_left: int
    context_left: int

    @property
    def limit(self) -> int:
        """The turn's ``max_tokens`` request: the smallest budget (<= 0: no turn fits)."""
        return min(self.max_tokens, self.response_left, self.context_left)

    def spent(self) -> str:
        """The budget that leaves no token for a turn (``max_model_len`` when both are spent)."""
        return "max_model_len" if self.context_left <= 0 else "max_response_tokens"

    def cut_by(self) -> str:
        """The budget that set :attr:`limit`, for a completion that reached it (the per-turn one on
        a tie)."""
        if self.limit == self.max_tokens:
            return "max_tokens"
        return "max_response_tokens" if self.limit == self.response_left else "max_model_len"


@dataclass
class Turn:
    """One sampled turn, checked and cut at its stop string.

    Attributes:
        index: the turn's number in the episode (0-based).
        budget: the budget it was sampled under (``budget.limit`` was its ``max_tokens``).
        token_ids, logprobs, weight_versions: the kept sampled ids, their engine logprobs and the
            weight version of each (1:1, length ``<= budget.limit``).
        finish_reason: ``stop`` (EOS or stop string), ``length`` or the engine's reason.
        stop_reason: the EOS id or the stop string that ended it (None otherwise).
        stop_cut_tokens: ids the engine sampled past a stop string, dropped (0: none).
        ended_eos: the last kept id is an EOS id.
        generate_s: seconds the engine took.
    """

    index: int
    budget: TurnBudget
    token_ids: list[int]
    logprobs: list[float]
    weight_versions: list[int]
    finish_reason: str
    stop_reason: int | str | None
    stop_cut_tokens: int
    ended_eos: bool
    generate_s: float

    @property
    def text_ids(self) -> list[int]:
        """The ids whose text the env gets: all but a closing EOS."""
        return self.token_ids[:-1] if self.ended_eos else self.token_ids

    def record(self, start: int) -> dict[str, Any]:
        """The turn's entry of ``info["turns"]`` (``start``: its first id's position)."""
        record: dict[str, Any] = {
            "turn": self.index,
            "start": start,
            "completion_tokens": len(self.token_ids),
            "max_tokens": self.budget.limit,
            "finish_reason": self.finish_reason,
            "stop_reason": self.stop_reason,
            "generate_s": self.generate_s,
        }
        if self.stop_cut_tokens:
            record["stop_cut_tokens"] = self.stop_cut_tokens
        if self.finish_reason == "length":
            record["cut_by"] = self.budget.cut_by()
        return record


def checked_completion(completion: Any, limit: int, version: int) -> tuple[list[int], list[float], list[int]]:
    """The completion's ids, logprobs and weight versions (``version`` for each id when the engine
    gives none).

    Raises:
        EpisodeFailure: ``engine_error`` when the three are not 1:1 or there are more than ``limit`` ids.
    """
    ids = [int(i) for i in completion.token_ids]
    lps = [float(x) for x in completion.logprobs]
    if len(lps) != len(ids):
        raise EpisodeFailure("engine_error", f"engine returned {len(lps)} logprobs for {len(ids)} tokens")
    if len(ids) > limit:
        raise EpisodeFailure("engine_error", f"engine returned {len(ids)} tokens for max_tokens={limit}")
    versions = list(completion.weight_versions or [version] * len(ids))
    if len(versions) != len(ids):
        raise EpisodeFailure(
            "engine_error", f"engine returned {len(versions)} weight versions for {len(ids)} tokens"
        )
    return ids, lps, versions


def sampled_turn(
    completion: Any,
    *,
    index: int,
    budget: TurnBudget,
    version: int,
    generate_s: float,
    tokenizer: Any,
    stop_strings: Sequence[str],
    eos: Collection[int],
) -> Turn:
    """The :class:`Turn` of an engine's ``completion`` (``version``: the engine's weight version when
    the request was sent).

    Raises:
        EpisodeFailure: ``engine_error`` for a malformed completion (:func:`checked_completion`).
    """
    limit = budget.limit
    ids, lps, versions = checked_completion(completion, limit, version)
    stop_cut = 0
    cut = first_stop_cut(tokenizer, ids, stop_strings) if stop_strings else None
    if cut is not None and cut[0] < len(ids):
        # The engine went past a stop string: the turn ends where the rule says.
        stop_cut = len(ids) - cut[0]
        ids, lps, versions = ids[: cut[0]], lps[: cut[0]], versions[: cut[0]]
    ended_eos = bool(ids) and ids[-1] in eos
    stop_reason: int | str | None = None
    if ended_eos:
        finish, stop_reason = "stop", ids[-1]
    elif cut is not None:
        finish, stop_reason = "stop", cut[1]
    elif len(ids) >= limit:
        finish = "length"
    else:
        finish = completion.finish_reason
        stop_reason = completion.stop_reason if finish == "stop" else None
    return Turn(index, budget, ids, lps, versions, finish, stop_reason, stop_cut, ended_eos, generate_s)
