"""VisualGrid-v0 and ChartQA-v0: registration, the env contract, reference policies on seeded samples,
exact scores, the zoom tool's pixels, malformed turns, deterministic rendering, disjoint splits."""

from __future__ import annotations

import hashlib
import json
import random
import subprocess
import sys

import gymnasium as gym
import numpy as np
import pytest

pytest.importorskip("PIL")
pytest.importorskip("matplotlib")

from PIL import Image

import chatgym  # noqa: F401  (registers the env ids)
from chatgym.envs import ChatEnv, check_chat_env
from chatgym.envs import messages as M
from chatgym.envs.messages import message_errors
from chatgym.envs.visual import chartgen, sokoban
from chatgym.envs.visual.chart import ChartQAEnv, answers_match
from chatgym.envs.visual.grid import VisualGridEnv, read_move
from chatgym.envs.visual.images import from_data_url, part_images, part_text, zoom_crop
from chatgym.envs.visual.tasks import split_of

BOARD = [  # player left of a box, the goal right of it; a wall above the player
    "######",
    "##   #",
    "#@$ .#",
    "#    #",
    "######",
]


def _episode(env: ChatEnv, index: int) -> tuple[float, bool, int, bool | None]:
    env.reset(seed=0, options={"task_index": index})
    total, turns = 0.0, 0
    while True:
        _, reward, terminated, truncated, info = env.step(env.reference_action())
        total, turns = total + reward, turns + 1
        if terminated or truncated:
            return total, terminated, turns, info["success"]


def _colours(image: Image.Image) -> set[tuple[int, ...]]:
    return {tuple(int(v) for v in c) for c in np.asarray(image).reshape(-1, 3)}


def _sha(image: Image.Image) -> str:
    return hashlib.sha256(image.tobytes()).hexdigest()


# ---- registration and the contract -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("env_id", "kwargs"),
    [
        ("VisualGrid-v0", {}),
        ("VisualGrid-v0", {"board_size": 7, "n_boxes": 2, "text_board": True, "box_reward": 0.2}),
        ("ChartQA-v0", {}),
        ("ChartQA-v0", {"reference_zoom": False, "kinds": ["line"], "image_size": 128}),
        ("ChartQA-v0", {"max_zooms": 0}),
    ],
)
def test_gym_make_and_check_chat_env(env_id, kwargs):
    env = gym.make(env_id, **kwargs)
    try:
        assert isinstance(env.unwrapped, ChatEnv)
        # box_reward shaping raises the reference's return above 1 (1 + 0.2 per box brought home).
        check_chat_env(env)
    finally:
        env.close()


def test_observations_are_text_and_an_image_part():
    grid = VisualGridEnv(image_size=96)
    obs, _ = grid.reset(seed=3)
    system, user = obs
    assert isinstance(system["content"], str) and user["role"] == "user"
    assert [p["type"] for p in user["content"]] == ["text", "image_url"]
    assert user["content"][1]["image_url"]["url"].startswith("data:image/png;base64,")
    assert part_images(user["content"])[0].size == (96, 96)
    json.dumps(obs)  # plain JSON: traces and the eval store keep it as it is
    assert all(not message_errors(m) for m in obs)
    assert from_data_url(user["content"][1]["image_url"]["url"]).size == (96, 96)
    with pytest.raises(ValueError, match="not a base64 image data URL"):
        from_data_url("https://example.com/board.png")  # never fetched
    obs, *_ = grid.step(grid.reference_action())
    assert [p["type"] for p in obs[0]["content"]] == ["text", "image_url"]  # a new board image each move
    assert grid.render() is None
    chart = ChartQAEnv(render_mode="ansi")
    obs, _ = chart.reset(seed=3, options={"image_size": 160})  # the per-episode override
    assert part_images(obs[1]["content"])[0].size == (160, 160)
    assert chart.render().endswith("<image 160x160>")


# ---- reference policies on seeded samples ------------------------------------------------------------


def test_grid_reference_solves_every_sampled_board_in_the_optimal_number_of_moves():
    env = VisualGridEnv(split="test", num_tasks=40)
    results = [_episode(env, i) for i in range(40)]
    optimal = [env.tasks[i]["optimal_moves"] for i in range(40)]
    assert results == [(1.0, True, n, True) for n in optimal]
    assert all(2 <= n <= 10 for n in optimal)
    # Each row's stored solution solves its board (replayed by the board's own rules, not the env).
    for row in env.tasks[:40]:
        board = sokoban.Board.parse(row["board"])
        for move in row["solution"]:
            board, _ = board.move(move)
        assert board.solved


def test_grid_two_boxes_and_larger_boards_are_solved_too():
    env = VisualGridEnv(num_tasks=10, board_size=8, n_boxes=2, min_moves=4, max_moves=16)
    assert [_episode(env, i)[::3] for i in range(10)] == [(1.0, True)] * 10


def test_chart_reference_answers_every_sampled_question():
    env = ChartQAEnv(split="test", num_tasks=16)
    assert [_episode(env, i) for i in range(16)] == [(1.0, True, 2, True)] * 16  # a zoom, then the answer
    # The gold answers follow from the chart data (computed here, independently of the generator).
    for row in env.tasks[:16]:
        cats, vals = row["chart"]["categories"], row["chart"]["values"]
        expected = {
            "max": cats[int(np.argmax(vals))],
            "min": cats[int(np.argmin(vals))],
            "value": str(vals[cats.index(row["targets"][0])]) if row["targets"] else None,
            "diff": str(abs(np.subtract(*[vals[cats.index(t)] for t in row["targets"]]))) if len(row["targets"]) == 2 else None,
        }[row["question_type"]]
        assert row["answer"] == expected, row
    assert {r["question_type"] for r in env.tasks[:16]} == set(chartgen.QUESTION_TYPES)
    assert {r["chart"]["kind"] for r in env.tasks[:16]} == {"bar", "line"}


def test_grid_reference_replans_after_a_move_of_its_own():
    env = VisualGridEnv()
    env.reset(options={"task": {"board": BOARD}})
    assert env.reference_action() == "<move>right</move>"
    env.step("<move>down</move>")  # off the plan: now below the player's start
    assert env.reference_action() == "<move>up</move>"
    with pytest.raises(RuntimeError, match="reset"):
        VisualGridEnv().reference_action()
    with pytest.raises(RuntimeError, match="reset"):
        ChartQAEnv().reference_action()


# ---- exact scores -----------------------------------------------------------------------------------


def test_grid_moves_pushes_blocks_and_shaped_rewards():
    env = VisualGridEnv(box_reward=0.5, step_penalty=0.1, max_turns=5)
    env.reset(options={"task": {"board": BOARD}})
    _, r, term, trunc, info = env.step("<move>up</move>")  # a wall
    assert (r, term, info["result"], info["success"]) == (-0.1, False, "blocked", None)
    assert env.board.player == (2, 1)
    _, r, term, _, info = env.step("<think>push it</think> <move>RIGHT</move>")
    assert (r, info["result"], env.board.boxes) == (-0.1, "pushed", frozenset({(2, 3)}))
    obs, r, term, trunc, info = env.step("<move>right</move>")  # the box onto the goal: solved
    assert (round(r, 9), term, trunc, info["success"]) == (1.4, True, False, True)  # 1 + 0.5 - 0.1
    assert info["reward_components"] == {"solved": 1.0, "shaping": pytest.approx(0.2)}
    assert "Solved" in part_text(obs[0]["content"])


def test_grid_unsolved_episode_is_truncated_with_success_false():
    env = VisualGridEnv(max_turns=3)
    env.reset(options={"task": {"board": BOARD}})
    steps = [env.step(a) for a in ("<move>left</move>", "<move>down</move>", "no move here")]
    assert [s[1:4] for s in steps] == [(0.0, False, False), (0.0, False, False), (0.0, False, True)]
    assert [s[4]["success"] for s in steps] == [None, None, False]
    assert steps[-1][4]["reward_components"] == {"solved": 0.0, "shaping": 0.0}


def test_chart_wrong_answers_score_zero_and_right_ones_one():
    env = ChartQAEnv(num_tasks=40)
    seen = set()
    for i in range(40):
        row = env.tasks[i]
        if row["question_type"] in seen:
            continue
        seen.add(row["question_type"])
        gold = row["answer"]
        wrong = str(int(gold) + 1) if gold.isdigit() else next(c for c in row["chart"]["categories"] if c != gold)
        for text, reward, fmt in [
            (f"<answer>{wrong}</answer>", 0.0, 1.0),
            (f"<answer>{gold}</answer>", 1.0, 1.0),
            (f"<think><answer>{gold}</answer></think> <answer>{wrong}</answer>", 0.0, 1.0),
            (f"{gold.lower()}.", 1.0, 0.0),  # no tag: the whole reply, normalised
            ("", 0.0, 0.0),
        ]:
            env.reset(options={"task_index": i})
            _, r, term, _, info = env.step(text)
            assert (r, term, info["success"], info["reward_components"]) == (
                reward, True, reward == 1.0, {"correct": reward, "format": fmt}
            ), (text, gold)
    assert seen == set(chartgen.QUESTION_TYPES)


@pytest.mark.parametrize(
    ("answer", "gold", "match"),
    [
        ("42", "42", True), (" 42. ", "42", True), ("42.0", "42", True), ("1,234", "1234", True),
        ("43", "42", False), ("42 boxes", "42", False), ("about 42", "42", False), ("", "42", False),
        ("apples", "Apples", True), ("'Apples.'", "Apples", True), ("Apple", "Apples", False),
        ("", "Apples", False), ("Q1", "Q1", True), ("q 1", "Q1", True), ("Q2", "Q1", False),
    ],
)
def test_answer_normalisation(answer, gold, match):
    assert answers_match(answer, gold) is match


# ---- the zoom tool ----------------------------------------------------------------------------------


def test_zoom_crop_returns_the_requested_region_upscaled():
    img = Image.new("RGB", (100, 80), (0, 0, 255))
    img.paste((255, 0, 0), (0, 0, 50, 80))  # left half red
    left = zoom_crop(img, (5, 10, 45, 30), 120)
    assert left.size == (120, 60)  # the longer side is out_size; the aspect ratio is kept
    assert _colours(left) == {(255, 0, 0)}
    right = zoom_crop(img, (60, 0, 100, 80), 160)
    assert right.size == (80, 160) and _colours(right) == {(0, 0, 255)}
    with pytest.raises(ValueError, match="outside"):
        zoom_crop(img, (50, 0, 101, 10), 64)


def _zoom(env: ChartQAEnv, bbox) -> tuple[list, dict]:
    call = M.assistant("", [M.make_tool_call("zoom", {"bbox": bbox}, "z1")])
    obs, reward, term, _, info = env.step(call)
    assert (reward, term) == (0.0, False)
    return obs, info


def test_chart_zoom_result_is_an_image_of_the_requested_region():
    env = ChartQAEnv(kinds=["bar"], question_types=["value"])
    obs, _ = env.reset(seed=0, options={"task_index": 0})
    shown = part_images(obs[1]["content"])[0]
    target = env.task["targets"][0]
    x0, y0, x1, y1 = env.chart.regions[target]
    [msg], info = _zoom(env, [x0, y0, x1, y1])
    assert msg["role"] == "tool" and msg["tool_call_id"] == "z1" and info["zooms"] == 1
    assert [p["type"] for p in msg["content"]] == ["text", "image_url"]
    zoomed = part_images(msg["content"])[0]
    assert max(zoomed.size) == 256
    assert zoomed.size[0] / zoomed.size[1] == pytest.approx((x1 - x0) / (y1 - y0), rel=0.05)
    # Shrunk back to the region's size it is the shown image's crop of that region (the shown image is
    # the large render downscaled; only resampling differs).
    back = np.asarray(zoomed.resize((x1 - x0, y1 - y0), Image.Resampling.LANCZOS), dtype=float)
    crop = np.asarray(shown.crop((x0, y0, x1, y1)), dtype=float)
    assert np.abs(back - crop).mean() < 3.0  # a crop 10 px to the side differs by ~60
    # The region holds the target's bar: the bar colour fills a good share of it; a region of empty
    # plot area above the tallest bar holds none of it.
    bar = np.array([int(chartgen.BAR_COLOR[i : i + 2], 16) for i in (1, 3, 5)])
    is_bar = np.abs(np.asarray(zoomed, dtype=float) - bar).max(axis=-1) < 30
    assert is_bar.mean() > 0.15


def test_chart_zoom_errors_are_tool_messages_and_the_limit_holds():
    env = ChartQAEnv(max_zooms=1, max_turns=8)
    env.reset(seed=0)
    for bbox, expected in [
        ([10, 10, 12, 40], "covers less than 4x4 pixels"),
        ([50, 50, 20, 90], "covers less than 4x4 pixels"),  # x0 > x1
        ([300, 300, 400, 400], "covers less than 4x4 pixels"),  # all outside: clipped to nothing
    ]:
        [msg], info = _zoom(env, bbox)
        assert msg["role"] == "tool" and msg["content"].startswith("Error: bbox") and expected in msg["content"]
        assert info["tool_error_kinds"] == {"tool_error": 1}
    [msg], info = _zoom(env, [-20, -20, 64, 64])  # reaches past the image: clipped to [0, 0, 64, 64]
    assert isinstance(msg["content"], list) and "Zoom of [0, 0, 64, 64]" in part_text(msg["content"])
    assert part_images(msg["content"])[0].size == (256, 256)
    [msg], _ = _zoom(env, [0, 0, 64, 64])
    assert msg["content"] == "Error: zoom limit reached (1 per question); answer now."
    obs, *_ = env.step('<tool_call>{"name": "zoom", "arguments": {"bbox": [1, 2]}}</tool_call>')
    assert "Error: zoom: invalid arguments" in obs[0]["content"]
    obs, *_ = env.step('<tool_call>{"name": "zoom", "arguments": {bbox}</tool_call>')
    assert obs[0]["content"].startswith("Error: could not parse tool call")
    obs, r, term, trunc, info = env.step('<tool_call>{"name": "crop", "arguments": {}}</tool_call>')
    assert "unknown tool 'crop'" in obs[0]["content"]
    assert (r, term, trunc, info["success"]) == (0.0, False, True, False)  # max_turns spent on tools


def test_grid_malformed_moves_get_a_hint_and_leave_the_board():
    env = VisualGridEnv()
    env.reset(options={"task": {"board": BOARD}})
    for text in ["<move>north</move>", "I will go right", "<think><move>right</move></think>", "<move></move>"]:
        obs, r, term, trunc, info = env.step(text)
        assert (r, term, trunc, info["invalid_action"]) == (0.0, False, False, True)
        assert obs == [{"role": "user", "content": obs[0]["content"]}] and "<move>up</move>" in obs[0]["content"]
        assert env.board.player == (2, 1)
    assert [read_move(t) for t in ("<move> Left </move>", "<move>up</move><move>down</move>")] == ["left", "up"]


def test_bad_rows_and_settings_are_clear_errors():
    env = VisualGridEnv()
    with pytest.raises(ValueError, match="equal-length"):
        env.reset(options={"task": {"board": ["####", "#@"]}})
    with pytest.raises(ValueError, match="exactly one player"):
        env.reset(options={"task": {"board": ["#####", "#$. #", "#####"]}})
    with pytest.raises(ValueError, match="image_size"):
        env.reset(options={"task": {"board": BOARD}, "image_size": 8})
    with pytest.raises(ValueError, match="missing"):
        ChartQAEnv().reset(options={"task": {"chart": {"kind": "bar"}, "question": "?", "answer": "1"}})
    with pytest.raises(ValueError, match="board_size"):
        VisualGridEnv(board_size=3)
    with pytest.raises(ValueError, match="kinds"):
        ChartQAEnv(kinds=["pie"])
    with pytest.raises(ValueError, match="value_range"):
        ChartQAEnv(value_range=(0, 3))


BOARD_SIZE_ERROR = (
    "VisualGrid-v0: board_size must be an int in 5..16 (squares a side, border walls included; 5 is the "
    "smallest with a pushable box: a 4x4 board's 2x2 floor is all corners, where no box can be pushed), got {!r}"
)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        # The failure: a bare TypeError ('<=' not supported between 'int' and 'str') from gym.make.
        ({"board_size": "5"}, BOARD_SIZE_ERROR.format("5")),
        ({"board_size": 5.0}, BOARD_SIZE_ERROR.format(5.0)),  # used to pass, then fail in range()
        ({"board_size": True}, BOARD_SIZE_ERROR.format(True)),
        ({"n_boxes": "1"}, "VisualGrid-v0: n_boxes must be an int in 1..13 (room for them and the player on a "
                           "6x6 board), got '1'"),  # (6 - 2) ** 2 - 3 = 13
        ({"min_moves": "2"}, "VisualGrid-v0: min_moves must be an int >= 1, got '2'"),
        ({"min_moves": 3, "max_moves": 2}, "VisualGrid-v0: max_moves must be an int >= 3 (at least min_moves=3), got 2"),
        ({"box_reward": "1"}, "VisualGrid-v0: box_reward must be a finite number >= 0, got '1'"),
        ({"step_penalty": float("nan")}, "VisualGrid-v0: step_penalty must be a finite number >= 0, got nan"),
        ({"max_turns": 0}, "VisualGrid-v0: max_turns must be an int >= 1, got 0"),  # used to mean the default
        ({"num_tasks": "10"}, "VisualGrid-v0: num_tasks must be an int >= 1, got '10'"),
        ({"seed": "0"}, "VisualGrid-v0: seed must be an int, got '0'"),
        ({"text_board": "yes"}, "VisualGrid-v0: text_board must be a bool, got 'yes'"),
        # The failure: the parser given was replaced by the env's own, silently.
        ({"parser": "json"}, "VisualGrid-v0 takes no parser (got 'json'): it reads each move from the raw text "
                             "(<move>up</move>) and offers no tools, so there are no tool calls to parse; leave it out"),
    ],
)
def test_grid_settings_of_the_wrong_type_and_a_parser_are_refused_naming_the_argument(kwargs, message):
    with pytest.raises(ValueError) as caught:
        gym.make("VisualGrid-v0", **kwargs)
    assert str(caught.value) == message


@pytest.mark.parametrize("env_id", ["VisualGrid-v0", "ChartQA-v0"])
@pytest.mark.parametrize("split", ["dev", "Train", None])
def test_an_unknown_split_is_refused_at_construction_naming_the_keyword(env_id, split):
    # The failure: gym.make(..., split="dev") built the env, and only the first reset refused it.
    with pytest.raises(ValueError) as caught:
        gym.make(env_id, split=split)
    assert str(caught.value) == f"{env_id}: split must be one of ('train', 'test'), got {split!r}"


def test_board_size_4_is_refused_at_construction_and_5_is_the_smallest_that_generates():
    # The failure: board_size=4 passed construction, then every reset raised RuntimeError after 500
    # draws. Checked exhaustively: on a 4x4 board (2x2 floor) no placement of player, box and goal that
    # is not already solved has a solution, so no size-4 board could ever be generated.
    floor = [(1, 1), (1, 2), (2, 1), (2, 2)]
    walls = frozenset((r, c) for r in range(4) for c in range(4)) - set(floor)
    unsolvable = [
        sokoban.solve(sokoban.Board(4, 4, walls, frozenset({goal}), frozenset({box}), player))
        for box in floor for goal in floor if goal != box for player in floor if player != box
    ]
    assert len(unsolvable) == 36 and set(unsolvable) == {None}  # 4 boxes x 3 goals x 3 players
    with pytest.raises(ValueError) as caught:
        VisualGridEnv(board_size=4)
    assert str(caught.value) == BOARD_SIZE_ERROR.format(4)
    with pytest.raises(ValueError, match=r"^no board: size=4 \(>= 5: a smaller floor is all corners"):
        sokoban.generate(random.Random(0), 4, 1, 2, 10)
    env = VisualGridEnv(board_size=5, num_tasks=3)
    try:
        for i in range(3):
            env.reset(options={"task_index": i})
            board, solution = env.board, env.task["solution"]
            assert (board.rows, board.cols) == (5, 5) and not board.solved
            assert sokoban.solve(board) == solution and 2 <= len(solution) <= 10
    finally:
        env.close()


# ---- determinism and splits ----------------------------------------------------------------------------

_HASHES = """
import hashlib, json
from chatgym.envs.visual.chart import ChartQAEnv
from chatgym.envs.visual.grid import VisualGridEnv
out = {}
for cls in (VisualGridEnv, ChartQAEnv):
    env = cls(split="test")
    obs, _ = env.reset(seed=7)
    out[cls.__name__] = hashlib.sha256(json.dumps(obs).encode()).hexdigest()
print(json.dumps(out))
"""


def test_same_seed_same_pixels_in_this_process_and_another():
    hashes = {}
    for cls in (VisualGridEnv, ChartQAEnv):
        a, b = cls(split="test"), cls(split="test")
        obs_a, _ = a.reset(seed=7)
        chartgen._render_cached.cache_clear()  # b draws the chart again rather than reusing a's
        obs_b, _ = b.reset(seed=7)
        assert _sha(part_images(obs_a[1]["content"])[0]) == _sha(part_images(obs_b[1]["content"])[0])
        assert obs_a == obs_b
        hashes[cls.__name__] = hashlib.sha256(json.dumps(obs_a).encode()).hexdigest()
        other, _ = a.reset(seed=8)
        assert other != obs_a
    out = subprocess.run([sys.executable, "-c", _HASHES], capture_output=True, text=True, check=True, timeout=120)
    assert json.loads(out.stdout) == hashes


def test_train_and_test_rows_are_disjoint_by_construction():
    for cls in (VisualGridEnv, ChartQAEnv):
        test, train = cls(split="test", num_tasks=30).tasks, cls(split="train", num_tasks=30).tasks
        assert [r["task_id"] for r in test[:2]] == [f"{test.name}/test/0", f"{test.name}/test/1"]
        keys = {
            "VisualGridEnv": lambda r: "\n".join(r["board"]),
            "ChartQAEnv": lambda r: json.dumps([r["chart"], r["question"]], sort_keys=True),
        }[cls.__name__]
        assert {split_of(keys(r)) for r in test} == {"test"}
        assert {split_of(keys(r)) for r in train} == {"train"}


def test_rendered_board_shows_each_piece_in_its_cell():
    board = sokoban.Board.parse(BOARD)
    img = sokoban.render(board, 120)  # 6 columns: 20 px cells, 10 px top and bottom margins
    assert img.size == (120, 120)

    def centre(r, c):
        return img.getpixel((c * 20 + 10, 10 + r * 20 + 10))

    assert centre(2, 1) == sokoban.COLORS["player"]
    assert centre(2, 2) == sokoban.COLORS["box"]
    assert centre(0, 0) == sokoban.COLORS["wall"]
    assert centre(3, 3) == sokoban.COLORS["floor"]
    ring = img.getpixel((4 * 20 + 10, 10 + 2 * 20 + 3))  # the goal ring's top edge
    assert ring == sokoban.COLORS["goal"]
    moved, what = board.move("right")
    assert what == "pushed" and _sha(sokoban.render(moved, 120)) != _sha(img)


# ---- content parts in messages and tool results ------------------------------------------------------


def _snapshot(region: list[int]) -> list:
    img = Image.new("RGB", (region[2] - region[0], region[3] - region[1]), (255, 0, 0))
    return [{"type": "text", "text": "the region:"}, {"type": "image", "image": img}]


def test_a_plain_function_tool_returning_parts_reaches_the_model_as_parts():
    import asyncio

    from chatgym.envs.tools import Tool, run_tool_call

    call = M.make_tool_call("_snapshot", {"region": [0, 0, 4, 3]}, "c0")
    schema = {"type": "object", "properties": {"region": {"type": "array", "items": {"type": "integer"}}}}
    outcome = asyncio.run(run_tool_call(call, {"_snapshot": Tool("_snapshot", "A red region.", schema, _snapshot)}))
    content = outcome.message["content"]
    # Was str(list): "[{'type': 'text', ..., <PIL.Image.Image ...>}]", an image the model never saw.
    assert isinstance(content, list) and content[0] == {"type": "text", "text": "the region:"}
    assert content[1]["image"].size == (4, 3) and not outcome.error


def test_message_errors_accept_content_parts_and_name_a_bad_one():
    parts = [{"type": "text", "text": "hi"}, {"type": "image_url", "image_url": {"url": "data:image/png;base64,AA"}}]
    assert message_errors({"role": "user", "content": parts}) == []
    assert message_errors({"role": "user", "content": [{"type": "audio"}]}) == [
        "content part 0 has type 'audio', not one of 'text', 'image_url', 'image'"
    ]
    assert message_errors({"role": "user", "content": [{"type": "text", "text": 3}]}) == [
        "content part 0 (text) has no str 'text'"
    ]
    assert message_errors({"role": "user", "content": 3}) == ["content must be a str or a list of content parts, got int"]


def test_reference_episodes_are_whole_conversations_for_sft():
    from chatgym.envs.visual.episodes import reference_episode

    grid = VisualGridEnv(split="test")
    ep = reference_episode(grid, options={"task_index": 0})
    n = grid.task["optimal_moves"]
    assert (ep.total_reward, ep.success, ep.turns) == (1.0, True, n)
    assert [m["role"] for m in ep.messages] == ["system", "user"] + ["assistant", "user"] * n
    assert sum(len(part_images(m["content"])) for m in ep.messages) == n + 1  # the opening board + one per move
    assert [m["content"] for m in ep.messages[2::2]] == [f"<move>{d}</move>" for d in grid.task["solution"]]
    chart = ChartQAEnv(split="test")
    ep = reference_episode(chart, options={"task_index": 0})
    assert [m["role"] for m in ep.messages] == ["system", "user", "assistant", "tool", "assistant"]
    assert ep.messages[2]["tool_calls"][0]["function"]["name"] == "zoom" and ep.tools[0]["function"]["name"] == "zoom"
    assert ep.messages[-1]["content"] == f"<answer>{chart.task['answer']}</answer>"
