"""masskv: sparse long-context attention over a paged KV cache.

Read only the part of the KV cache that carries attention mass; with alpha-entmax the
probabilities are exactly zero outside a support, so sparse decoding can be exact. The
kernels are C++ (and CUDA in a CUDA build: `has_cuda`); arrays cross without copies through DLPack / the buffer protocol.

See docs/python.md for a walkthrough.
"""

from ._masskv import _data_ptr  # noqa: F401  (tests: the pointer the bindings see)
from ._masskv import (
    KV,
    EntmaxThreshold,
    Error,
    Model,
    PagedKVCache,
    SelectResult,
    Session,
    Selection,
    decode,
    decode_reference,
    diagnose,
    engine_pages,
    entmax,
    entmax_threshold,
    has_cuda,
    prefill,
    prefill_reference,
    select,
    softmax,
)

from . import _masskv as _ext

# CUDA build: every `cuda_*` binding (selection, page stores, prefill, checks on CUDA tensors;
# decode dispatches on the KV's device). Taken from the extension by name, so a binding added
# in python/src is exported without a second list here to keep in step.
CUDA_FUNCTIONS = tuple(sorted(n for n in dir(_ext) if n.startswith("cuda_"))) if has_cuda else ()
globals().update({n: getattr(_ext, n) for n in CUDA_FUNCTIONS})

# The selector names accepted by `select(method=...)`.
METHODS = ("dense", "sink_recent", "quest", "top_p", "entmax_support", "gaussian_tau", "oracle",
           "token_codes", "two_stage")

__all__ = [
    "KV",
    "METHODS",
    "EntmaxThreshold",
    "Error",
    "Model",
    "PagedKVCache",
    "Session",
    "SelectResult",
    "Selection",
    "decode",
    "decode_reference",
    "diagnose",
    "engine_pages",
    "entmax",
    "entmax_threshold",
    "has_cuda",
    "prefill",
    "prefill_reference",
    "select",
    "softmax",
]
__all__ += list(CUDA_FUNCTIONS)
__version__ = "0.1.0"
