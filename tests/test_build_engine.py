"""build_engine names an engine.options key the backend does not take (it was a raw TypeError from the
engine's constructor, e.g. the main job's vLLM options with engine.backend=hf)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from chatgym.trainer.engines import build_engine


def test_an_option_the_backend_does_not_take_is_named():
    cfg = SimpleNamespace(backend="hf", options={"gpu_memory_utilization": 0.25, "kv_cache_gib": 2}, dtype="auto")
    with pytest.raises(ValueError) as err:
        build_engine(cfg, "unused", tokenizer=None, seed=0, max_model_len=512)
    message = str(err.value)
    assert message.startswith(
        "engine.options: 'gpu_memory_utilization', 'kv_cache_gib' not taken by the 'hf' engine (TransformersEngine); "
        "it takes ["
    )
    assert "'decode'" in message and "'max_batch_size'" in message
