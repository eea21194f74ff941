"""A Sokoban board: parsing, moves, a seeded generator of solvable boards, a BFS solver, the renderer.

Boards are lists of equal-length strings in the standard Sokoban notation: ``#`` wall, `` `` floor,
``.`` goal, ``$`` box, ``*`` box on a goal, ``@`` player, ``+`` player on a goal. The border is wall.

Generation plays the game backwards (as gym-sokoban does): boxes start on their goals and the player
walks at random, pulling a box behind it now and then. Every backward move is undone by a forward
move, so each generated board is solvable; the solver then finds a shortest solution and boards whose
shortest solution is outside ``[min_moves, max_moves]`` are redrawn.
"""

from __future__ import annotations

import random
from collections import deque
from dataclasses import dataclass

from PIL import Image, ImageDraw

Cell = tuple[int, int]
# Fixed order: the solver's tie-breaking (and so the reference policy) depends on it.
DIRECTIONS: dict[str, Cell] = {"up": (-1, 0), "down": (1, 0), "left": (0, -1), "right": (0, 1)}
MAX_SOLVER_STATES = 500_000
# The smallest side (border walls included) a pushable board has: a 4x4 board's floor is 2x2, every
# square of it a corner, and a box in a corner can never be pushed, so no unsolved 4x4 board is solvable.
MIN_SIZE = 5

COLORS = {
    "background": (30, 30, 36),
    "wall": (96, 96, 108),
    "floor": (232, 226, 210),
    "goal": (214, 48, 48),
    "box": (184, 122, 52),
    "box_on_goal": (58, 168, 72),
    "player": (44, 92, 214),
}


@dataclass
class Board:
    """A board's state. ``walls``/``goals`` never change; ``boxes`` and ``player`` do."""

    rows: int
    cols: int
    walls: frozenset[Cell]
    goals: frozenset[Cell]
    boxes: frozenset[Cell]
    player: Cell

    @classmethod
    def parse(cls, lines: list[str]) -> Board:
        """A board from its text lines.

        Raises:
            ValueError: ragged or empty lines, an unknown character, not exactly one player, no box,
                boxes and goals of different counts, or an open border.
        """
        if not lines or not all(isinstance(s, str) for s in lines) or len({len(s) for s in lines}) != 1:
            raise ValueError(f"a board is a non-empty list of equal-length strings, got {lines!r:.200}")
        walls, goals, boxes, players = set(), set(), set(), []
        for r, line in enumerate(lines):
            for c, ch in enumerate(line):
                if ch not in "# .$*@+":
                    raise ValueError(f"board: unknown character {ch!r} at row {r}, column {c}")
                if ch == "#":
                    walls.add((r, c))
                if ch in ".*+":
                    goals.add((r, c))
                if ch in "$*":
                    boxes.add((r, c))
                if ch in "@+":
                    players.append((r, c))
        rows, cols = len(lines), len(lines[0])
        border = {(r, c) for r in range(rows) for c in range(cols) if r in (0, rows - 1) or c in (0, cols - 1)}
        if len(players) != 1:
            raise ValueError(f"board: needs exactly one player (@ or +), found {len(players)}")
        if not boxes or len(boxes) != len(goals):
            raise ValueError(f"board: needs as many goals as boxes (>= 1), found {len(boxes)} boxes, {len(goals)} goals")
        if not border <= walls:
            raise ValueError("board: the border must be wall (#)")
        return cls(rows, cols, frozenset(walls), frozenset(goals), frozenset(boxes), players[0])

    def lines(self) -> list[str]:
        """The board's text lines (the inverse of :meth:`parse`)."""
        out = []
        for r in range(self.rows):
            row = []
            for c in range(self.cols):
                p, g, b = (r, c) == self.player, (r, c) in self.goals, (r, c) in self.boxes
                row.append("#" if (r, c) in self.walls else "+" if p and g else "@" if p else "*" if b and g else "$" if b else "." if g else " ")
            out.append("".join(row))
        return out

    @property
    def solved(self) -> bool:
        return self.boxes == self.goals

    @property
    def boxes_on_goals(self) -> int:
        return len(self.boxes & self.goals)

    def move(self, direction: str) -> tuple[Board, str]:
        """The board after the player moves ``direction`` (a key of :data:`DIRECTIONS`), and what
        happened: ``"moved"``, ``"pushed"`` (a box moved too) or ``"blocked"`` (a wall, or a box that
        cannot move; the board is unchanged)."""
        dr, dc = DIRECTIONS[direction]
        pr, pc = self.player
        target = (pr + dr, pc + dc)
        if target in self.walls:
            return self, "blocked"
        if target in self.boxes:
            beyond = (target[0] + dr, target[1] + dc)
            if beyond in self.walls or beyond in self.boxes:
                return self, "blocked"
            boxes = (self.boxes - {target}) | {beyond}
            return Board(self.rows, self.cols, self.walls, self.goals, frozenset(boxes), target), "pushed"
        return Board(self.rows, self.cols, self.walls, self.goals, self.boxes, target), "moved"


def solve(board: Board, max_moves: int | None = None) -> list[str] | None:
    """A shortest solution of ``board`` (direction names), ``[]`` when it is solved, or None when there
    is none within ``max_moves`` moves (or within :data:`MAX_SOLVER_STATES` states). Breadth-first over
    (player, boxes); ties go to the :data:`DIRECTIONS` order, so the result is deterministic."""
    if board.solved:
        return []
    start = (board.player, board.boxes)
    parent: dict[tuple[Cell, frozenset[Cell]], tuple[tuple[Cell, frozenset[Cell]], str] | None] = {start: None}
    frontier = deque([(board, 0)])
    while frontier:
        b, depth = frontier.popleft()
        if max_moves is not None and depth >= max_moves:
            continue
        for name in DIRECTIONS:
            nb, what = b.move(name)
            key = (nb.player, nb.boxes)
            if what == "blocked" or key in parent:
                continue
            parent[key] = ((b.player, b.boxes), name)
            if nb.solved:
                path = []
                while parent[key] is not None:
                    key, step = parent[key]
                    path.append(step)
                return path[::-1]
            if len(parent) > MAX_SOLVER_STATES:
                return None
            frontier.append((nb, depth + 1))
    return None


def _connected(floor: set[Cell]) -> bool:
    start = next(iter(floor))
    seen, todo = {start}, [start]
    while todo:
        r, c = todo.pop()
        for dr, dc in DIRECTIONS.values():
            n = (r + dr, c + dc)
            if n in floor and n not in seen:
                seen.add(n)
                todo.append(n)
    return len(seen) == len(floor)


def _room(rng: random.Random, size: int, n_boxes: int) -> tuple[set[Cell], set[Cell]] | None:
    """Walls (border + a few inner ones) and the connected floor, or None for a bad draw."""
    interior = [(r, c) for r in range(1, size - 1) for c in range(1, size - 1)]
    inner = set(rng.sample(interior, rng.randint(0, len(interior) // 6)))
    floor = set(interior) - inner
    if len(floor) < n_boxes + 3 or not _connected(floor):
        return None
    border = {(r, c) for r in range(size) for c in range(size) if r in (0, size - 1) or c in (0, size - 1)}
    return border | inner, floor


def _pull_back(rng: random.Random, floor: set[Cell], boxes: set[Cell], player: Cell, steps: int) -> Cell:
    """Walk the player backwards ``steps`` times, pulling the box behind it with probability 0.6;
    ``boxes`` is updated in place. Returns the player's cell."""
    moves = list(DIRECTIONS.values())
    for _ in range(steps):
        dr, dc = rng.choice(moves)
        nxt = (player[0] + dr, player[1] + dc)
        if nxt not in floor or nxt in boxes:
            continue
        behind = (player[0] - dr, player[1] - dc)
        if behind in boxes and rng.random() < 0.6:
            boxes.remove(behind)
            boxes.add(player)
        player = nxt
    return player


def generate(
    rng: random.Random, size: int, n_boxes: int, min_moves: int, max_moves: int, attempts: int = 500
) -> tuple[Board, list[str]]:
    """A solvable ``size`` x ``size`` board (border included) with ``n_boxes`` boxes, not solved at
    the start, whose shortest solution has ``min_moves``..``max_moves`` moves; and that solution.

    Raises:
        ValueError: settings no board can meet (``size`` < :data:`MIN_SIZE`, too many boxes,
            ``min_moves`` > ``max_moves``).
        RuntimeError: no such board in ``attempts`` draws.
    """
    if size < MIN_SIZE or n_boxes < 1 or (size - 2) ** 2 < n_boxes + 3 or not 1 <= min_moves <= max_moves:
        raise ValueError(
            f"no board: size={size} (>= {MIN_SIZE}: a smaller floor is all corners, where no box can be "
            f"pushed), n_boxes={n_boxes} (>= 1, room for them), min_moves={min_moves} <= max_moves={max_moves}"
        )
    for _ in range(attempts):
        room = _room(rng, size, n_boxes)
        if room is None:
            continue
        walls, floor = room
        goals = set(rng.sample(sorted(floor), n_boxes))
        boxes = set(goals)
        player = rng.choice(sorted(floor - boxes))
        player = _pull_back(rng, floor, boxes, player, steps=4 * max_moves)
        if boxes == goals:
            continue
        board = Board(size, size, frozenset(walls), frozenset(goals), frozenset(boxes), player)
        solution = solve(board, max_moves)
        if solution is not None and len(solution) >= min_moves:
            return board, solution
    raise RuntimeError(f"no {size}x{size} board with {n_boxes} box(es) solvable in {min_moves}-{max_moves} moves found")


def render(board: Board, image_size: int) -> Image.Image:
    """The board as an ``image_size`` x ``image_size`` RGB image: square cells of
    ``image_size // max(rows, cols)`` pixels, centred. Walls grey, floor beige, goals red rings,
    boxes brown (green on a goal), the player a blue disc. Deterministic (no anti-aliasing).

    Raises:
        ValueError: cells would be under 4 pixels.
    """
    cell = image_size // max(board.rows, board.cols)
    if cell < 4:
        raise ValueError(f"image_size {image_size} is too small for a {board.rows}x{board.cols} board (4 px a cell)")
    img = Image.new("RGB", (image_size, image_size), COLORS["background"])
    draw = ImageDraw.Draw(img)
    ox, oy = (image_size - cell * board.cols) // 2, (image_size - cell * board.rows) // 2
    pad = max(1, cell // 8)
    for r in range(board.rows):
        for c in range(board.cols):
            x, y = ox + c * cell, oy + r * cell
            box = (x, y, x + cell - 1, y + cell - 1)
            if (r, c) in board.walls:
                draw.rectangle(box, fill=COLORS["wall"], outline=COLORS["background"])
                continue
            draw.rectangle(box, fill=COLORS["floor"])
            inset = (x + pad, y + pad, x + cell - 1 - pad, y + cell - 1 - pad)
            if (r, c) in board.goals:
                draw.ellipse(inset, outline=COLORS["goal"], width=max(1, cell // 10))
            if (r, c) in board.boxes:
                color = COLORS["box_on_goal"] if (r, c) in board.goals else COLORS["box"]
                draw.rectangle(inset, fill=color, outline=COLORS["background"])
            if (r, c) == board.player:
                p2 = 2 * pad
                draw.ellipse((x + p2, y + p2, x + cell - 1 - p2, y + cell - 1 - p2), fill=COLORS["player"])
    return img
