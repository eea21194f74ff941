"""vLLM's sleep mode around the learner's update (``engine.options.sleep_level``).

Sleep mode cannot run on this machine (vLLM's CPU platform has none: it needs CUDA's cumem allocator),
so here: the refusals at config load with vLLM's real platform check, the bookkeeping that orders the
calls (:class:`SleepState`), and the order of the calls in real training steps (the Trainer, its
pipeline, LocalRollout, the learner and the collector all real) with :class:`FakeSleepModeEngine`, a
FAKE engine that records where vLLM's sleep / wake calls would go. What vLLM does with them on a GPU
(memory freed, the new weights sampled after waking) is ``tests/test_engines_vllm_gpu.py -m gpu``.
"""

from __future__ import annotations

import json
import time

import pytest
from test_pipeline import SeededScriptEngine, loop_config, smollm2_files  # noqa: F401 (a fixture)

from chatgym.trainer.config.run import ConfigError, load_config
from chatgym.trainer.engines.vllm_sleep import SleepState, fall_asleep, wake_vllm

pytest.importorskip("vllm", reason="needs vLLM (its platform check)")

CALL_S = 0.05  # what each of the fake's sleep / wake calls takes


def platform_has_sleep_mode() -> bool:
    from vllm.platforms import current_platform

    return current_platform.is_sleep_mode_available()


# ---- refused at config load, one line naming the field ------------------------------------------

REFUSED = [
    (["engine.options.sleep_level=3"], "engine.options.sleep_level must be 0 (off), 1 or 2, got 3"),
    (["engine.options.sleep_level=true"], "engine.options.sleep_level must be 0 (off), 1 or 2, got True"),
    (
        ["engine.backend=hf", "engine.options={sleep_level: 1}"],
        "engine.options.sleep_level: 1 is refused: sleep mode is the in-process vLLM engine's; engine.backend "
        "is 'hf' (set vllm)",
    ),
    (
        ["engine.backend=auto", "engine.options={sleep_level: 1}"],
        "engine.options.sleep_level: 1 is refused: sleep mode is the in-process vLLM engine's; engine.backend "
        "is 'auto' (set vllm)",
    ),
    (
        ["engine.backend=vllm-server", "engine.options={sleep_level: 2}"],
        "engine.options.sleep_level: 2 is refused: sleep mode is the in-process vLLM engine's; engine.backend "
        "is 'vllm-server' (set vllm)",
    ),
    (
        ["trainer.backend=ray", "engine.options.sleep_level=2"],
        "engine.options.sleep_level: 2 is refused: trainer.backend 'ray': its rollout workers' engines are "
        "never put to sleep (use local)",
    ),
    (
        ["trainer.pipeline=one_step_off", "engine.options.sleep_level=1"],
        "engine.options.sleep_level: 1 is refused: trainer.pipeline 'one_step_off' generates while the "
        "learner updates; the engine sleeps only in the sync pipeline",
    ),
    (
        ["trainer.pipeline=async", "engine.options.sleep_level=1"],
        "engine.options.sleep_level: 1 is refused: trainer.pipeline 'async' generates while the learner "
        "updates; the engine sleeps only in the sync pipeline",
    ),
    (
        ["reward.model=genrm", "reward.judge=smollm2", "reward.judge_options={sleep_level: 1}"],
        "reward.judge_options.sleep_level: 1 is refused: only the policy's engine sleeps "
        "(engine.options.sleep_level), and vLLM's sleep mode, one allocator per process, would put the "
        "judge's to sleep with it; leave it 0",
    ),
]


@pytest.mark.parametrize(("overrides", "message"), REFUSED, ids=[r[1][:48] for r in REFUSED])
def test_refused_at_config_load_naming_the_field(overrides, message):
    with pytest.raises(ConfigError) as err:
        load_config(None, overrides)
    assert str(err.value) == message


def test_refused_where_vllm_has_no_sleep_mode_by_vllms_own_platform_check(tmp_path, capsys):
    if platform_has_sleep_mode():
        pytest.skip("vLLM has sleep mode on this machine")
    from chatgym.trainer.train_cli import main

    message = (
        "engine.options.sleep_level: 2 is refused: vLLM's cpu platform has no sleep mode (it needs a CUDA GPU: "
        "vLLM's cumem allocator)"
    )
    with pytest.raises(ConfigError) as err:
        load_config(None, ["engine.options.sleep_level=2"])
    assert str(err.value) == message
    out = tmp_path / "run"
    assert main(["engine.options.sleep_level=2", "--output-dir", str(out)]) == 2
    assert capsys.readouterr().err == f"chatgym train: {message}\n"
    assert not out.exists()
    # The engine refuses on its own too, before vLLM starts (a direct user; no model is loaded).
    from chatgym.trainer.engines.vllm_inproc import VLLMEngine

    with pytest.raises(ValueError) as err:
        VLLMEngine("smollm2", sleep_level=1)
    assert str(err.value) == "sleep_level 1 is refused: " + message.split("is refused: ")[1]
    with pytest.raises(ValueError, match=r"^sleep_level must be 0 \(off\), 1 or 2, got 5$"):
        VLLMEngine("smollm2", sleep_level=5)


def test_off_loads_and_the_vllm_engine_takes_the_option():
    from chatgym.trainer.engines import check_options

    cfg = load_config(None, ["engine.options={sleep_level: 0}"])
    assert cfg.engine.options == {"sleep_level": 0}
    check_options(cfg.engine)  # sleep_level is a keyword of VLLMEngine: no "not taken" refusal


def test_cotrain_refuses_it_before_loading_anything(monkeypatch):
    # A FAKE platform with sleep mode (this machine has none), so the config loads and co-training's
    # own refusal is reached: its party's engine, built from the same options, would share vLLM's
    # one allocator per process with the policy's.
    from pathlib import Path

    import chatgym.trainer.engines.vllm_sleep as vllm_sleep
    from chatgym.trainer.config.cotrain import load_cotrain_config
    from chatgym.trainer.cotrain.loop import CoTrainer

    monkeypatch.setattr(vllm_sleep, "sleep_mode_unavailable", lambda: None)
    path = Path(__file__).resolve().parent.parent / "examples" / "configs" / "cotrain_judge_cpu.yaml"
    config, co = load_cotrain_config(path, ["engine.backend=vllm", "engine.options={sleep_level: 1}"])
    with pytest.raises(ConfigError) as err:
        CoTrainer(config, co)
    assert str(err.value) == (
        "engine.options.sleep_level: cotrain runs the party's vLLM engine in this process too, and vLLM's "
        "sleep mode (one allocator per process) would put it to sleep with the policy's; leave it 0"
    )


# ---- the bookkeeping that orders the calls --------------------------------------------------------


def test_sleep_state_orders_the_calls():
    calls: list[tuple] = []
    state = SleepState(2)
    state.check_awake()  # awake at start
    with pytest.raises(RuntimeError, match=r"^wake_up: \['weights'\] not asleep \(asleep: nothing\)$"):
        state.wake(["weights"], calls.append)
    state.sleep(lambda level: calls.append(("sleep", level)))
    assert (state.asleep, state.discarded) == ({"kv_cache", "weights"}, True)
    with pytest.raises(RuntimeError, match=r"^sleep: already asleep \(kv_cache, weights\)$"):
        state.sleep(lambda level: calls.append(("sleep", level)))
    with pytest.raises(RuntimeError, match=r"^update_weights: the weights are asleep; wake_up\(\['weights'\]\) first$"):
        state.load(lambda: calls.append("load"))
    with pytest.raises(RuntimeError, match=r"^the engine is asleep \(kv_cache, weights\); wake_up\(\) first$"):
        state.check_awake()
    state.wake(["weights"], lambda tags: calls.append(("wake", tags)))
    with pytest.raises(RuntimeError, match=r"^wake_up: \['weights'\] not asleep \(asleep: \['kv_cache'\]\)$"):
        state.wake(["weights"], calls.append)
    state.load(lambda: calls.append("load"))
    assert not state.discarded
    state.wake(None, lambda tags: calls.append(("wake", tags)))
    state.check_awake()
    state.wake(None, lambda tags: calls.append(("never", tags)))  # nothing asleep: no call
    assert calls == [("sleep", 2), ("wake", ["weights"]), "load", ("wake", ["kv_cache"])]


def test_level_two_without_a_load_cannot_generate_and_level_one_can():
    two, one = SleepState(2), SleepState(1)
    for state in (two, one):
        state.sleep(lambda level: None)
        state.wake(None, lambda tags: None)
    assert (two.discarded, one.discarded) == (True, False)
    one.check_awake()
    with pytest.raises(RuntimeError, match=r"^sleep level 2 discarded the weights; update_weights\(\) before generating$"):
        two.check_awake()


def test_a_failed_vllm_call_records_nothing_and_level_zero_never_sleeps():
    state = SleepState(1)

    def fails(*args):
        raise OSError("cuMemMap failed")

    with pytest.raises(OSError):
        state.sleep(fails)
    assert state.asleep == frozenset()
    state.sleep(lambda level: None)
    with pytest.raises(OSError):
        state.wake(None, fails)
    assert state.asleep == {"kv_cache", "weights"}
    with pytest.raises(RuntimeError, match=r"^sleep: sleep_level is 0, so vLLM was started without sleep mode$"):
        SleepState(0).sleep(lambda level: None)
    with pytest.raises(ValueError, match=r"^sleep_level must be 0 \(off\), 1 or 2, got 1.0$"):
        SleepState(1.0)


def test_one_sleep_may_take_another_level():
    # vLLM takes the level per call: an engine started with sleep mode may sleep at 1 once (the GPU
    # test runs both levels on one engine this way); the level decides what is discarded.
    state, levels = SleepState(2), []
    state.sleep(levels.append, level=1)
    assert (levels, state.discarded) == ([1], False)
    state.wake(None, lambda tags: None)
    state.sleep(levels.append)
    assert (levels, state.discarded) == ([1, 2], True)
    for bad in (0, 3, True):
        with pytest.raises(ValueError, match=rf"^sleep: level must be 1 or 2, got {bad}$"):
            SleepState(1).sleep(levels.append, level=bad)
    assert levels == [1, 2]


class RecordingLLM:
    """A FAKE ``vllm.LLM`` (no sleep mode on a CPU): records the sleep / wake calls it gets."""

    def __init__(self):
        self.calls: list[tuple] = []

    def sleep(self, level):
        self.calls.append(("sleep", level))

    def wake_up(self, tags):
        self.calls.append(("wake_up", tags))


def test_the_engine_never_sleeps_with_requests_in_flight():
    llm = RecordingLLM()
    with pytest.raises(RuntimeError, match=r"^sleep: 3 requests in flight; sleep between rollouts$"):
        fall_asleep(llm, 2, 3)
    fall_asleep(llm, 2, 0)
    wake_vllm(llm, ["weights"])
    assert llm.calls == [("sleep", 2), ("wake_up", ["weights"])]


# ---- the order of the calls in real training steps ---------------------------------------------------


class FakeSleepModeEngine(SeededScriptEngine):
    """A FAKE of vLLM's sleep mode, which cannot run on a CPU: test_pipeline's scripted engine with the
    in-process vLLM engine's sleep surface — ``sleep_state`` (the real :class:`SleepState`, so a call out
    of order raises as it does in ``VLLMEngine``), ``sleep()``, ``wake_up(tags)``, and ``generate`` /
    ``update_weights`` checked against it. Where ``VLLMEngine`` calls vLLM, it appends to ``events``
    (``generate`` once per run of generate calls) after ``CALL_S`` seconds for a sleep or wake."""

    def __init__(self, level: int, events: list[str], replies: tuple | None = None):
        super().__init__()
        self.sleep_state = SleepState(level)
        self.events = events
        if replies is not None:
            self.REPLIES = replies

    async def generate(self, prompt_ids, params):
        self.sleep_state.check_awake()
        if self.events[-1:] != ["generate"]:
            self.events.append("generate")
        return await super().generate(prompt_ids, params)

    def update_weights(self, weights) -> None:
        def load() -> None:
            SeededScriptEngine.update_weights(self, weights)
            self.events.append("load")

        self.sleep_state.load(load)

    def sleep(self) -> None:
        self.sleep_state.sleep(lambda level: self._vllm(f"sleep({level})"))

    def wake_up(self, tags=None) -> None:
        self.sleep_state.wake(tags, lambda woken: self._vllm(f"wake({','.join(woken)})"))

    def _vllm(self, event: str) -> None:
        time.sleep(CALL_S)
        self.events.append(event)


def train(out, engine, events, *extra, steps=2):
    """``steps`` real sync steps of the tiny model with ``engine``; each learner update is an
    ``update`` event. Returns the metrics rows and the learner's final version."""
    from chatgym.trainer.train import Trainer

    trainer = Trainer(loop_config(out, *extra, steps=steps), engine=engine)
    train_on = trainer.learner.train_on

    def recording(trajs):
        events.append("update")
        return train_on(trajs)

    trainer.learner.train_on = recording
    try:
        trainer.train()
        version = trainer.learner.version
    finally:
        trainer.close()
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()], version


@pytest.mark.usefixtures("smollm2_files")
@pytest.mark.parametrize("level", [1, 2])
def test_each_step_sleeps_through_the_update_and_wakes_weights_load_kv_cache(tmp_path, level):
    events: list[str] = []
    rows, version = train(tmp_path, FakeSleepModeEngine(level, events), events)
    # The start's sync loads the learner's weights into the awake engine; then per step: the rollout,
    # sleep, the learner's update, and at the weight sync the weights woken, the new ones loaded, the
    # KV cache woken after them — before the next step's first generate.
    step = ["generate", f"sleep({level})", "update", "wake(weights)", "load", "wake(kv_cache)"]
    assert events == ["load", *step, *step]
    assert version == 2 and len(rows) == 2
    for row in rows:
        # The fake's calls take CALL_S each: one sleep, two wakes, the weights' inside the sync.
        assert row["timing/engine_sleep_s"] >= CALL_S
        assert row["timing/engine_wake_s"] >= 2 * CALL_S
        assert row["timing/sync_s"] >= CALL_S
        assert row["timing/step_s"] >= row["timing/engine_sleep_s"] + row["timing/engine_wake_s"]


@pytest.mark.usefixtures("smollm2_files")
@pytest.mark.parametrize(
    ("level", "after"),
    [
        (1, ["wake(kv_cache,weights)"]),  # no weights due: both come back as they were
        (2, ["wake(weights)", "load", "wake(kv_cache)"]),  # discarded: the sync sends them anyway
    ],
)
def test_a_step_without_an_update_still_wakes_the_engine(tmp_path, level, after):
    # Every sample the same reply: equal rewards in each group, so dynamic sampling drops every group
    # and the learner's version stays 0 (no weights are due by version).
    events: list[str] = []
    engine = FakeSleepModeEngine(level, events, replies=([64, 65, 66],) * 3)
    rows, version = train(tmp_path, engine, events, "algo.dynamic_sampling=true", steps=1)
    assert version == 0
    assert events == ["load", "generate", f"sleep({level})", "update", *after]
    assert engine.sleep_state.asleep == frozenset() and not engine.sleep_state.discarded
    assert rows[0]["timing/engine_wake_s"] >= len([e for e in after if e.startswith("wake")]) * CALL_S


@pytest.mark.usefixtures("smollm2_files")
def test_an_engine_without_sleep_mode_logs_no_sleep_timings(tmp_path):
    rows, version = train(tmp_path, SeededScriptEngine(), [], steps=1)
    assert version == 1
    assert [k for k in rows[0] if k.startswith("timing/engine_")] == []
