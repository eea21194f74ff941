"""The log filter that hides vLLM's expected "Failed to load weights" warnings after a weight sync.

Pure logging: no vLLM needed (the engine module imports vLLM lazily).
"""

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
