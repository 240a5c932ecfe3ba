"""Compatibility layers for code written against other bindings.

:class:`Llama` is llama-cpp-python 0.3.x's high-level ``Llama`` over llama-spec's engine
(exact speculative decoding included); see :mod:`llama_spec.compat.llama`.
"""

from __future__ import annotations

from .drafting import CallableDrafter
from .llama import Llama
from .params import DEFAULT_ONLY, LLAMA_CPP_PYTHON_INIT_KEYWORDS, SUPPORTED

__all__ = ["DEFAULT_ONLY", "LLAMA_CPP_PYTHON_INIT_KEYWORDS", "SUPPORTED", "CallableDrafter", "Llama"]
