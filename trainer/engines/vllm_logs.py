"""Log filters of the in-process vLLM engine: vLLM's expected warnings at load and at each weight
reload, dropped so the trainer's own lines are not buried (any other warning still shows)."""

from __future__ import annotations

import logging

RELOAD_LOGGER = "vllm.model_executor.model_loader.reload.layerwise"
LOAD_LOGGER = "vllm.model_executor.models.utils"


class QuietRequestedCast(logging.Filter):
    """Drops vLLM's "Attempted to load weight <name> with dtype float32 into parameter with dtype
    <dtype>" warning when ``<dtype>`` is the dtype the engine was asked for.

    The packaged SmolLM2 (and every checkpoint the trainer writes) is fp32; an engine in bf16 on a GPU
    or a native-bf16 CPU casts each tensor on load, as asked, and vLLM warned once per tensor (122
    lines at every start, burying the trainer's own lines). Any other dtype mismatch still shows.
    """

    MESSAGE = "Attempted to load weight %s with dtype %s into parameter with dtype %s"

    def __init__(self, dtype: str) -> None:
        super().__init__()
        self.dtype = dtype

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args if isinstance(record.args, tuple) else ()
        requested = len(args) == 3 and str(args[1]) == "torch.float32" and str(args[2]) == f"torch.{self.dtype}"
        return not (record.msg == self.MESSAGE and requested)


class QuietExpectedReloadWarnings(logging.Filter):
    """Drops vLLM's "<Layer>: Failed to load weights" warning for layers no checkpoint holds.

    On an in-place reload vLLM warns for every layer that received no tensor. A Hugging Face
    checkpoint never holds the rotary cos/sin cache (a buffer computed at start-up), nor the LM head
    when it is tied to the embeddings, so those warnings after each weight sync are noise; any other
    layer's warning still shows.
    """

    MESSAGE = "%s: Failed to load weights"

    def __init__(self, layers: set[str]) -> None:
        super().__init__()
        self.layers = frozenset(layers)

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args if isinstance(record.args, tuple) else ()
        return not (record.msg == self.MESSAGE and args and args[0] in self.layers)


def quiet_vllm_logs(dtype: str, *, tied: bool) -> None:
    """Install :class:`QuietExpectedReloadWarnings` (the rotary cache; the LM head when ``tied``) and
    :class:`QuietRequestedCast` for ``dtype`` on vLLM's loggers, each once per process."""
    quiet = QuietExpectedReloadWarnings({"RotaryEmbedding"} | ({"ParallelLMHead"} if tied else set()))
    reload_logger = logging.getLogger(RELOAD_LOGGER)
    if not any(getattr(f, "layers", None) == quiet.layers for f in reload_logger.filters):
        reload_logger.addFilter(quiet)
    load_logger = logging.getLogger(LOAD_LOGGER)
    if not any(getattr(f, "dtype", None) == dtype for f in load_logger.filters):
        load_logger.addFilter(QuietRequestedCast(dtype))
