"""VisualGrid-v0: Sokoban played over several turns on a rendered board.

Each episode is one seeded, solvable board (:mod:`chatgym.envs.visual.sokoban`). The opening user
message holds the board as an image; each turn the model gives one move, ``<move>up</move>``
(``down``/``left``/``right``; the first ``<move>`` tag outside ``<think>`` counts, case-insensitive),
and the env answers with a user message holding what happened (moved, pushed a box, blocked) and a new
image of the board. A turn without a valid move gets a hint (text only) and the episode goes on.
``env.stop_strings`` is ``["</move>"]``: generation can stop after the move.

Reward: 1.0 on the move that puts the last box on its goal (the episode terminates, ``success`` True);
optional shaping adds ``box_reward`` for each push of a box onto a goal (minus the same for a push off
one: the shaping sums to ``box_reward`` × the boxes gained) and subtracts ``step_penalty`` each turn.
With both at 0 (the default) the return is 1.0 when solved and 0.0 otherwise. An episode that reaches
``max_turns`` unsolved is truncated with ``success`` False. The final step's
``info["reward_components"]`` holds ``solved`` and ``shaping`` (the shaped rewards' sum).

The reference policy (``reference_action``) plays a shortest solution from the current board
(breadth-first search), so it also recovers after moves that were not its own, while the board can
still be solved.
"""

from __future__ import annotations

import functools
import math
import numbers
import re
from collections.abc import Sequence
from typing import Any

from chatgym.envs.core import AssistantTurn, ChatEnv, StepOutcome, load_prompt
from chatgym.envs.parsers import PlainText
from chatgym.envs.parsers.reasoning import DEFAULT_REASONING_TAGS, reasoning_spans
from chatgym.envs.visual import sokoban
from chatgym.envs.visual.images import image_part, text_part, transcript
from chatgym.envs.visual.tasks import DEFAULT_SIZES, SeededTasks, check_split

_MOVE = re.compile(r"<move>\s*([A-Za-z]+)\s*</move>", re.I)


def outside_reasoning(text: str) -> str:
    """``text`` without its ``<think>`` blocks (a turn's reasoning never holds its action)."""
    out, pos = [], 0
    for start, end in reasoning_spans(text, DEFAULT_REASONING_TAGS):
        out.append(text[pos:start])
        pos = end
    out.append(text[pos:])
    return "".join(out)


def read_move(text: str) -> str | None:
    """The direction of the first ``<move>`` tag outside reasoning (lower case), or None when there is
    no tag or it names no direction."""
    m = _MOVE.search(outside_reasoning(text))
    if m is None or m.group(1).lower() not in sokoban.DIRECTIONS:
        return None
    return m.group(1).lower()


@functools.lru_cache(maxsize=16)
def grid_tasks(
    split: str, n: int, seed: int, board_size: int, n_boxes: int, min_moves: int, max_moves: int
) -> SeededTasks:
    """The seeded board rows of a split (made lazily, shared by every env of the process)."""

    def make(rng):
        board, solution = sokoban.generate(rng, board_size, n_boxes, min_moves, max_moves)
        row = {
            "board": board.lines(),
            "board_size": board_size,
            "n_boxes": n_boxes,
            "solution": solution,
            "optimal_moves": len(solution),
        }
        return row, "\n".join(board.lines())

    return SeededTasks("visual_grid", split, n, seed, make)


class VisualGridEnv(ChatEnv):
    """VisualGrid-v0 (see the module docstring).

    Args:
        split: ``train`` or ``test`` (disjoint boards, see :mod:`chatgym.envs.visual.tasks`).
        num_tasks: rows in the split (default 5000 train / 200 test; made on first access).
        seed: base seed of the generator.
        board_size: the board's side in squares, border walls included (an int in 5..16; default
            6). 5 is the smallest: a 4x4 board's 2x2 floor is all corners, where no box can be pushed.
        n_boxes: boxes (and goals) per board (an int >= 1, at most ``(board_size - 2) ** 2 - 3``;
            default 1).
        min_moves, max_moves: the range of a board's shortest solution length (ints,
            1 <= min_moves <= max_moves; default 2..10).
        image_size: the side of each board image in pixels (an int in ``4 * board_size``..2048;
            default 128); ``reset(options={"image_size": n})`` overrides it for one episode.
        text_board: also give the board as text (the Sokoban notation) next to each image (a bool).
        box_reward, step_penalty: the shaping (finite numbers >= 0; default 0; see the module docstring).
        max_turns: assistant turns before truncation (an int >= 1; default ``2 * max_moves``).
        kwargs: the rest of :class:`~chatgym.envs.core.ChatEnv`'s arguments, except ``parser``: the
            env reads each move from the raw text (``<move>…</move>``) and offers no tools, so a
            tool-call parser would have nothing to do.

    Raises:
        ValueError: a setting of the wrong type or out of range, or a ``parser``; the message names
            the argument and what it accepts.
    """

    image_observations = True
    reset_options = ChatEnv.reset_options | {"image_size"}

    def __init__(
        self,
        *,
        split: str = "train",
        num_tasks: int | None = None,
        seed: int = 0,
        board_size: int = 6,
        n_boxes: int = 1,
        min_moves: int = 2,
        max_moves: int = 10,
        image_size: int = 128,
        text_board: bool = False,
        box_reward: float = 0.0,
        step_penalty: float = 0.0,
        max_turns: int | None = None,
        **kwargs: Any,
    ):
        check_split("VisualGrid-v0", split)  # here: the tasks load only at the first reset
        _check_int("board_size", board_size, sokoban.MIN_SIZE, 16,
                   f" (squares a side, border walls included; {sokoban.MIN_SIZE} is the smallest with a pushable "
                   "box: a 4x4 board's 2x2 floor is all corners, where no box can be pushed)")
        most = (board_size - 2) ** 2 - 3
        _check_int("n_boxes", n_boxes, 1, most, f" (room for them and the player on a {board_size}x{board_size} board)")
        _check_int("min_moves", min_moves, 1)
        _check_int("max_moves", max_moves, min_moves, None, f" (at least min_moves={min_moves})")
        _check_image_size(image_size, board_size)
        for name, value in (("box_reward", box_reward), ("step_penalty", step_penalty)):
            if isinstance(value, bool) or not isinstance(value, numbers.Real) or not 0 <= value < math.inf:
                raise ValueError(f"VisualGrid-v0: {name} must be a finite number >= 0, got {value!r}")
        if num_tasks is not None:
            _check_int("num_tasks", num_tasks, 1)
        if max_turns is not None:
            _check_int("max_turns", max_turns, 1)
        if isinstance(seed, bool) or not isinstance(seed, numbers.Integral):
            raise ValueError(f"VisualGrid-v0: seed must be an int, got {seed!r}")
        if not isinstance(text_board, bool):
            raise ValueError(f"VisualGrid-v0: text_board must be a bool, got {text_board!r}")
        if "parser" in kwargs:
            raise ValueError(
                f"VisualGrid-v0 takes no parser (got {kwargs['parser']!r}): it reads each move from the raw "
                "text (<move>up</move>) and offers no tools, so there are no tool calls to parse; leave it out"
            )
        super().__init__(split=split, max_turns=max_turns or 2 * max_moves, parser=PlainText(), **kwargs)
        self.num_tasks, self.seed = num_tasks, seed
        self.board_size, self.n_boxes, self.min_moves, self.max_moves = board_size, n_boxes, min_moves, max_moves
        self.image_size, self.text_board = image_size, text_board
        self.box_reward, self.step_penalty = float(box_reward), float(step_penalty)
        self.stop_strings = ["</move>"]
        self.system_prompt = load_prompt(__package__, "grid_system.txt")
        self.board: sokoban.Board | None = None
        self.shaping = 0.0
        self._episode_image_size = image_size
        self._plans: dict[tuple[Any, ...], list[str] | None] = {}

    def load_tasks(self, split: str) -> Sequence[dict[str, Any]]:
        n = self.num_tasks or DEFAULT_SIZES.get(split, 1)
        args = (self.board_size, self.n_boxes, self.min_moves, self.max_moves)
        return grid_tasks(split, n, self.seed, *args)

    async def areset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        self._check_options(options)  # before reading one: a list here was an AttributeError
        size = (options or {}).get("image_size", self.image_size)
        _check_image_size(size, self.board_size)
        self._episode_image_size = int(size)
        return await super().areset(seed=seed, options=options)

    async def on_reset(self, task: dict[str, Any]) -> None:
        self.board = sokoban.Board.parse(task["board"])
        _check_image_size(self._episode_image_size, max(self.board.rows, self.board.cols))
        self.shaping = 0.0
        self._plans.clear()  # plans are per board; an env lives through many episodes

    def _board_parts(self, text: str) -> list[dict[str, Any]]:
        assert self.board is not None
        if self.text_board:
            text += "\n" + "\n".join(self.board.lines())
        return [text_part(text), image_part(sokoban.render(self.board, self._episode_image_size))]

    def initial_messages(self, task: dict[str, Any]) -> list[dict[str, Any]]:
        assert self.board is not None
        n = len(self.board.boxes)
        intro = f"The board ({self.board.rows}x{self.board.cols} squares, {n} box{'es' if n > 1 else ''}):"
        return [{"role": "system", "content": self.system_prompt}, {"role": "user", "content": self._board_parts(intro)}]

    async def react(self, turn: AssistantTurn) -> StepOutcome:
        assert self.board is not None
        direction = read_move(turn.raw_text)
        reward = -self.step_penalty
        if direction is None:
            out = StepOutcome(
                messages=[{"role": "user", "content": load_prompt(__package__, "grid_invalid.txt")}],
                info={"invalid_action": True},
            )
        else:
            before = self.board.boxes_on_goals
            self.board, what = self.board.move(direction)
            reward += self.box_reward * (self.board.boxes_on_goals - before)
            status = {
                "moved": f"You moved {direction}.",
                "pushed": f"You pushed a box {direction}.",
                "blocked": f"Blocked: you cannot move {direction} (a wall, or a box that cannot move).",
            }[what]
            status += f" Boxes on goals: {self.board.boxes_on_goals}/{len(self.board.goals)}."
            if self.board.solved:
                status += " Solved: every box is on a goal."
            out = StepOutcome(
                messages=[{"role": "user", "content": self._board_parts(status)}],
                terminated=self.board.solved,
                info={"invalid_action": False, "move": direction, "result": what},
            )
        self.shaping += reward
        out.reward = reward + (1.0 if out.terminated else 0.0)
        out.info["boxes_on_goals"] = self.board.boxes_on_goals
        if out.terminated or self.turn >= self.max_turns:
            out.info["success"] = out.terminated
            out.info["reward_components"] = {"solved": float(out.terminated), "shaping": self.shaping}
        return out

    def reference_action(self) -> str:
        """The next move of a shortest solution from the current board, as ``<move>…</move>``.

        Raises:
            RuntimeError: called before ``reset``, or the board can no longer be solved (a box stuck)
                within ``max_moves`` × 4 moves.
        """
        if self.board is None:
            raise RuntimeError("call reset() before reference_action()")
        key = (self.board.player, self.board.boxes, self.board.goals, self.board.walls)
        if key not in self._plans:
            self._plans[key] = sokoban.solve(self.board, 4 * self.max_moves)
        plan = self._plans[key]
        if not plan:
            raise RuntimeError("the board cannot be solved from here (a box is stuck)")
        return f"<move>{plan[0]}</move>"

    def render(self) -> str | None:
        if self.render_mode != "ansi":
            return None
        return transcript(self.messages)


def _check_int(name: str, value: Any, lo: int, hi: int | None = None, why: str = "") -> None:
    """ValueError unless ``value`` is an integer (not a bool) in ``lo..hi`` (``hi`` None: no upper bound)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < lo or (hi is not None and value > hi):
        accepts = f"an int >= {lo}" if hi is None else f"an int in {lo}..{hi}"
        raise ValueError(f"VisualGrid-v0: {name} must be {accepts}{why}, got {value!r}")


def _check_image_size(image_size: Any, board_size: int) -> None:
    if isinstance(image_size, bool) or not isinstance(image_size, numbers.Integral) or not 4 * board_size <= image_size <= 2048:
        raise ValueError(
            f"VisualGrid-v0: image_size must be an int in {4 * board_size}..2048 (4 px a square), got {image_size!r}"
        )
