"""``otfuse.ascend_ep``: the public name (README) of :mod:`otfuse.run.ascend`, which runs fused
models on Ascend NPUs through ONNX Runtime's CANN execution provider."""

from otfuse.run.ascend import *  # noqa: F403 - this module is an alias
from otfuse.run.ascend import (  # noqa: F401 - the session config keys, named in docs/ops.md
    FAKE_MODE_ENV,
    FAKE_MODE_KEY,
    FP32_ATTENTION,
    FP32_ATTENTION_KEY,
    __all__,
)
