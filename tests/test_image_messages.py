"""Messages with images: validation, the image store, rendering with placeholders, and token-exact
multi-turn image episodes (a scripted engine, SmolLM2's real tokenizer, transformers' real
Idefics3 processor with the image tokens added).

Expected ids are computed independently of the collector: the chat template's text of the whole
conversation (``apply_chat_template`` on the env's original messages, PIL images and data URLs as
given) tokenized by ``processor(text=..., images=...)``, the processor's own placeholder expansion.
"""

from __future__ import annotations

import base64
import hashlib
import io
import json
from typing import Any

import pytest
from rollout_helpers import ASSISTANT_HEADER, tool_call_text

from chatgym.envs import messages as M
from chatgym.envs.core import AssistantTurn, ChatEnv, StepOutcome
from chatgym.trainer.chat.delta import ChatRenderer, TemplateError
from chatgym.trainer.chat.images import ImageInputError, decode_image, image_sha256, intern_images
from chatgym.trainer.engines.base import SamplingParams
from chatgym.trainer.engines.replay import ReplayEngine, replay_logprob, turn_script
from chatgym.trainer.rollout.collector import Collector, RolloutConfig
from chatgym.trainer.rollout.trace import read_trace

Image = pytest.importorskip("PIL.Image")
transformers = pytest.importorskip("transformers")
IM_END = 2


def fresh_tokenizer():
    try:
        from chatgym.trainer.chat.tokenizer import get_tokenizer

        return get_tokenizer("smollm2")
    except ModuleNotFoundError as exc:  # the model package is a set-up step (scripts/setup.sh)
        pytest.skip(str(exc))


@pytest.fixture(scope="module")
def proc():
    # Image splitting on: a 64x40 image is cut into tiles (rows of "\n"-separated runs) plus a global
    # view, so expansions differ in length between images and hold plain-text tokens.
    image_processor = transformers.Idefics3ImageProcessor(
        do_image_splitting=True, max_image_size={"longest_edge": 32}, size={"longest_edge": 64}
    )
    return transformers.Idefics3Processor(image_processor, fresh_tokenizer(), image_seq_len=2)


@pytest.fixture(scope="module")
def tok(proc):
    return proc.tokenizer


def enc(tok, text: str) -> list[int]:
    return tok.encode(text, add_special_tokens=False)


def png_url(img) -> str:
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


RED = Image.new("RGB", (40, 30), (255, 0, 0))
GREEN = Image.new("RGB", (64, 40), (0, 200, 0))
BLUE = Image.new("RGB", (20, 20), (0, 0, 255))


def sha(img) -> str:
    # Independent of image_sha256's code path: the canonical bytes written out by hand.
    w, h = img.size
    return hashlib.sha256(f"RGB {w} {h}\n".encode() + img.convert("RGB").tobytes()).hexdigest()


# ---- messages and the store ----------------------------------------------------------------------


def test_message_validation_accepts_parts_and_refuses_network_urls():
    ok = M.user([M.text_part("see"), M.image_part(RED), M.image_url_part(png_url(BLUE)),
                 {"type": "image", "ref": "a" * 64}])
    assert M.message_errors(ok) == []
    assert M.message_errors(M.tool([M.image_part(RED)], "call_0")) == []
    [err] = M.message_errors(M.user([M.image_url_part("https://example.com/cat.png")]))
    assert "network URL" in err and "never downloads" in err
    assert M.message_errors(M.user([])) == ["content is an empty list of parts"]
    assert M.message_errors(M.user([{"type": "audio"}])) == [
        "content part 0 has type 'audio', not one of 'text', 'image_url', 'image'"
    ]
    assert "PIL.Image.Image" in M.message_errors(M.user([{"type": "image", "image": "cat.png"}]))[0]
    assert "sha256" in M.message_errors(M.user([{"type": "image", "ref": "xyz"}]))[0]
    assert M.message_errors(M.user([M.image_url_part("file:///etc/passwd")]))[0].startswith(
        "content part 0: image_url must be a data URL"
    )
    assert M.content_text([M.text_part("a"), M.image_part(RED), M.text_part("b")]) == "ab"


def test_decode_refuses_urls_and_broken_data():
    with pytest.raises(ImageInputError, match="never downloads"):
        decode_image("http://example.com/x.png")
    with pytest.raises(ImageInputError, match="base64"):
        decode_image("data:image/png,rawbytes")
    with pytest.raises(ImageInputError, match="readable image"):
        decode_image("data:image/png;base64," + base64.b64encode(b"not a png").decode())


def test_image_hash_is_canonical_and_each_image_is_stored_once():
    rgba = RED.convert("RGBA")
    assert image_sha256(decode_image(rgba)) == image_sha256(decode_image(png_url(RED)))
    expected = hashlib.sha256(b"RGB 40 30\n" + bytes([255, 0, 0]) * (40 * 30)).hexdigest()
    assert image_sha256(decode_image(RED)) == expected
    msgs = [M.user([M.image_part(RED), M.text_part("x")]), M.user("plain"),
            M.tool([M.image_url_part(png_url(RED)), M.image_part(BLUE)], "c")]
    out, new, refs = intern_images(msgs, {})
    h_blue = hashlib.sha256(b"RGB 20 20\n" + bytes([0, 0, 255]) * 400).hexdigest()
    assert refs == [expected, expected, h_blue]
    assert sorted(new) == sorted([expected, h_blue])
    assert out[1] is msgs[1]  # text-only messages are not copied
    assert out[0]["content"] == [{"type": "image", "ref": expected}, {"type": "text", "text": "x"}]
    assert msgs[0]["content"][0]["image"] is RED  # the env's own message is not changed
    _, again, _ = intern_images(out, new)  # refs resolve against the store, nothing new
    assert again == {}
    with pytest.raises(ImageInputError, match="not in the trajectory's image store"):
        intern_images(out, {})


# ---- rendering -----------------------------------------------------------------------------------


def test_rendering_writes_one_placeholder_per_image_and_ids_match_the_processor(proc, tok):
    renderer = ChatRenderer(tok, processor=proc)
    conv = [M.system("sys"), M.user([M.text_part("Two: "), M.image_part(RED), M.text_part(" and "),
                                     M.image_url_part(png_url(GREEN))])]
    text = renderer.render(conv, add_generation_prompt=True)
    assert text == "<|im_start|>system\nsys<|im_end|>\n<|im_start|>user\nTwo: <image> and <image><|im_end|>\n" + ASSISTANT_HEADER
    ids = renderer.prompt_ids(conv)
    want = proc(text=text, images=[RED, GREEN])["input_ids"][0]
    assert ids == list(want)
    runs = [i for i, t in enumerate(ids) if t == tok.convert_tokens_to_ids("<image>")]
    # image_seq_len (2) <image> ids per tile, the tiles of each image (rows x cols) and its global view.
    info = proc.image_processor([[RED], [GREEN]], return_row_col_info=True)
    rows = [r for per_sample in info["rows"] for r in per_sample]
    cols = [c for per_sample in info["cols"] for c in per_sample]
    tiles = [r * c + 1 for r, c in zip(rows, cols, strict=True)]
    assert len(runs) == 2 * sum(tiles) and min(tiles) > 1  # split into tiles


def test_template_that_cannot_render_images_is_refused(proc, tok):
    with pytest.raises(TemplateError, match="image content parts"):
        # SmolLM2's own template concatenates content as a str.
        from chatgym.trainer.chat.tokenizer import get_tokenizer

        own = get_tokenizer("smollm2", chat_template="model").chat_template
        ChatRenderer(tok, chat_template=own, processor=proc)


def test_text_only_renderer_refuses_images(tok):
    with pytest.raises(ImageInputError, match="no image processor"):
        ChatRenderer(tok).prompt_ids([M.user([M.image_part(RED)])])


# ---- the collector -------------------------------------------------------------------------------


class PictureEnv(ChatEnv):
    """Three turns: a picture in the prompt; a ``zoom`` call answered by a tool message whose content
    is an image; then a user turn with two images (one repeated); then the answer ends it."""

    def __init__(self, **kwargs: Any):
        kwargs.setdefault("max_turns", 8)
        super().__init__(**kwargs)

    def load_tasks(self, split: str) -> list[dict[str, Any]]:
        return [{"task_id": "pic-0"}]

    def initial_messages(self, task: dict[str, Any]) -> list[M.Message]:
        return [M.system("Look at pictures."), M.user([M.text_part("What is this? "), M.image_part(RED)])]

    async def react(self, turn: AssistantTurn) -> StepOutcome:
        if self.turn == 1:
            return StepOutcome([M.tool([M.text_part("zoomed: "), M.image_url_part(png_url(BLUE))], "call_0", "zoom")])
        if self.turn == 2:
            return StepOutcome([M.user([M.image_part(GREEN), M.text_part("and"), M.image_url_part(png_url(RED))])])
        return StepOutcome(reward=1.0, terminated=True)


def test_check_chat_env_accepts_image_observations():
    from chatgym.envs import check_chat_env
    from chatgym.envs.env_checker import ChatEnvCheckError, check_message

    check_chat_env(PictureEnv())  # PIL image parts are the one non-JSON value a message may hold
    with pytest.raises(ChatEnvCheckError, match="not JSON-serialisable"):
        check_message({**M.user("x"), "extra": object()}, "reset")


class VisionReplay(ReplayEngine):
    """A ReplayEngine that takes images (the engine contract's keyword) and records them."""

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.images: list[list[Any]] = []

    async def generate(self, prompt_ids: list[int], params: SamplingParams, *, images=()):
        self.images.append(list(images))
        return await super().generate(prompt_ids, params)


def image_collector(tok, proc, turns, engine_cls=VisionReplay, **cfg) -> Collector:
    engine = engine_cls(turn_script(turns, enc(tok, ASSISTANT_HEADER)), tok)
    cfg.setdefault("episode_timeout_s", 60.0)
    return Collector(engine, tok, RolloutConfig(**cfg), processor=proc)


async def test_multi_turn_image_episode_is_token_exact(proc, tok, tmp_path):
    # The last turn is sampled as ids a tokenizer would never write for its text ("d" + "one"):
    # they are kept exactly; every other id equals the processor's own full rendering.
    odd_done = enc(tok, "d") + enc(tok, "one") + [IM_END]
    assert enc(tok, "done") != odd_done[:-1]
    turns = [[*enc(tok, tool_call_text("zoom")), IM_END], [*enc(tok, "A green one?"), IM_END], odd_done]
    col = image_collector(tok, proc, turns, trace_path=str(tmp_path / "trace.jsonl"))
    [traj] = await col.collect(PictureEnv, [0])
    col.close()
    assert traj.error is None and traj.terminated and traj.reward == 1.0

    # The conversation as the env wrote it (PIL images and data URLs), rendered by the template.
    history = [
        *PictureEnv().initial_messages({}),
        M.assistant(tool_call_text("zoom")),
        M.tool([M.text_part("zoomed: "), M.image_url_part(png_url(BLUE))], "call_0", "zoom"),
        M.assistant("A green one?"),
        M.user([M.image_part(GREEN), M.text_part("and"), M.image_url_part(png_url(RED))]),
    ]
    text = tok.apply_chat_template(history, tokenize=False, add_generation_prompt=True)
    images = [RED, BLUE, GREEN, RED]
    prefix = list(proc(text=text, images=images)["input_ids"][0])
    assert traj.token_ids == prefix + odd_done

    starts = [r["start"] for r in traj.info["turns"]]
    mask = [0] * len(traj.token_ids)
    for start, ids in zip(starts, turns, strict=True):
        assert traj.token_ids[start : start + len(ids)] == ids
        mask[start : start + len(ids)] = [1] * len(ids)
    assert traj.loss_mask == mask
    assert traj.engine_logprobs == [replay_logprob(t) if m else 0.0 for t, m in zip(traj.token_ids, mask, strict=True)]

    # Refs in placeholder order; each distinct image stored once; the engine got them every turn.
    refs = [sha(i) for i in images]
    assert traj.images == refs and sorted(traj.image_store) == sorted(set(refs))
    got = [[image_sha256(i) for i in call] for call in col.engine.images]
    assert got == [refs[:1], refs[:2], refs]
    assert all(col.engine.images[2][k] is traj.image_store[r] for k, r in enumerate(refs))
    assert [r.get("observation_images") for r in traj.info["turns"]] == [1, 2, None]

    # The trace holds refs, not pixels.
    [rec] = read_trace(tmp_path / "trace.jsonl")
    assert rec["images"] == refs and "image_store" not in rec
    assert rec["messages"][1]["content"][1] == {"type": "image", "ref": refs[0]}
    assert rec["messages"][3]["content"][1] == {"type": "image", "ref": refs[1]}
    assert "base64" not in (tmp_path / "trace.jsonl").read_text()
    json.dumps(traj.to_json())  # the trajectory itself stays JSON


async def test_text_only_episode_calls_the_engine_as_before(proc, tok):
    # A plain ReplayEngine has no `images` keyword: passing one would fail the episode.
    from rollout_helpers import OkEnv

    col = image_collector(tok, proc, [[*enc(tok, "fine"), IM_END]] * 2, engine_cls=ReplayEngine)
    [traj] = await col.collect(lambda: OkEnv(max_turns=2), [0])
    assert traj.error is None and len(col.engine.calls) == 2
    assert traj.images == [] and traj.image_store == {}


async def test_observation_image_over_max_model_len_is_dropped_whole(proc, tok):
    turns = [[*enc(tok, tool_call_text("zoom")), IM_END]] * 3
    probe = image_collector(tok, proc, turns, max_model_len=4096)
    [full] = await probe.collect(PictureEnv, [0])
    end_of_turn0 = full.info["turns"][1]["start"]  # prompt + turn 0 + closing + tool result delta
    # A context that holds the first turn but not the tool result with its image (nor any part of it).
    limit = full.info["turns"][0]["start"] + len(turns[0]) + 5
    col = image_collector(tok, proc, turns, max_model_len=limit)
    [traj] = await col.collect(PictureEnv, [0])
    assert traj.truncated and traj.info["truncated_by"] == "max_model_len"
    kept = full.info["turns"][0]["start"] + len(turns[0])
    assert traj.token_ids == full.token_ids[:kept]
    assert traj.info["dropped_observation_tokens"] == end_of_turn0 - kept
    assert traj.images == [sha(RED)] and list(traj.image_store) == [sha(RED)]


async def test_observation_budget_keeps_whole_images(proc, tok):
    blue_len = len(proc(text="<image>", images=[BLUE], add_special_tokens=False)["input_ids"][0])
    zoomed = len(enc(tok, "zoomed: "))
    turns = [[*enc(tok, tool_call_text("zoom")), IM_END], [*enc(tok, "ok"), IM_END]]
    # Room for the text part and less than the image: the image is left out whole, with a marker.
    col = image_collector(tok, proc, turns, max_observation_tokens=zoomed + blue_len - 1)
    [traj] = await col.collect(lambda: PictureEnv(max_turns=2), [0])
    assert traj.error is None
    tool_msg = traj.messages[3]
    assert tool_msg["content"] == [
        {"type": "text", "text": "zoomed: "},
        {"type": "text", "text": f"\n[... {blue_len} more tokens truncated, 1 image(s) left out]"},
    ]
    assert traj.info["observation_tokens_cut"] == blue_len and traj.info["observation_images_dropped"] == 1
    assert traj.images == [sha(RED)] and sha(BLUE) not in traj.image_store


async def test_prompt_image_over_max_model_len_is_prompt_too_long(proc, tok):
    col = image_collector(tok, proc, [[*enc(tok, "x"), IM_END]], max_model_len=40)
    [traj] = await col.collect(PictureEnv, [0])
    assert traj.info["error_kind"] == "prompt_too_long" and col.engine.images == []
    assert traj.prompt_len > 40


async def test_image_to_a_text_only_model_fails_the_episode(tok):
    engine = ReplayEngine(turn_script([[*enc(tok, "x"), IM_END]], enc(tok, ASSISTANT_HEADER)), tok)
    col = Collector(engine, fresh_tokenizer(), RolloutConfig(episode_timeout_s=30.0))
    [traj] = await col.collect(PictureEnv, [0])
    assert traj.info["error_kind"] == "image_error" and "reads no images" in traj.error
    assert engine.calls == []
