"""Parts of the in-process vLLM engine that need no vLLM: the reload-warning log filter and the CPU
memory defaults (the engine module imports vLLM lazily)."""

from __future__ import annotations

import logging

from chatgym.trainer.engines.vllm_inproc import RELOAD_LOGGER, QuietExpectedReloadWarnings


def test_only_expected_layers_are_silenced(caplog):
    logger = logging.getLogger(RELOAD_LOGGER + ".test")
    logger.addFilter(QuietExpectedReloadWarnings({"RotaryEmbedding", "ParallelLMHead"}))
    with caplog.at_level(logging.WARNING, logger=logger.name):
        logger.warning("%s: Failed to load weights", "RotaryEmbedding")
        logger.warning("%s: Failed to load weights", "ParallelLMHead")
        logger.warning("%s: Failed to load weights", "QKVParallelLinear")  # a real problem: kept
        logger.warning("%s: something else", "RotaryEmbedding")  # another message: kept
    assert [r.getMessage() for r in caplog.records] == [
        "QKVParallelLinear: Failed to load weights",
        "RotaryEmbedding: something else",
    ]


def test_cpu_memory_defaults_fill_only_what_is_unset():
    # Regression: on CPU vLLM's default reservation (0.92 x RAM) refused to start the README's
    # `make_engine("vllm", "smollm2")` whenever other processes held a couple of GiB.
    from chatgym.trainer.engines.vllm_inproc import cpu_memory_defaults

    assert cpu_memory_defaults(None, {}, cuda=False, environ={}) == (2, {"gpu_memory_utilization": 0.25})
    assert cpu_memory_defaults(4, {"gpu_memory_utilization": 0.5, "x": 1}, cuda=False, environ={}) == (
        4,
        {"gpu_memory_utilization": 0.5, "x": 1},
    )
    # The environment's KV cache size wins over the default.
    assert cpu_memory_defaults(None, {}, cuda=False, environ={"VLLM_CPU_KVCACHE_SPACE": "6"}) == (
        None,
        {"gpu_memory_utilization": 0.25},
    )
    assert cpu_memory_defaults(None, {}, cuda=True, environ={}) == (None, {})  # GPUs: vLLM's own defaults
