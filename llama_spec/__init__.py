"""llama-spec: drive llama.cpp from Python and decode speculatively with an exact verifier.

Names are imported lazily, so ``import llama_spec.kernels.token`` (the pure numpy/numba kernel) never
loads the compiled llama.cpp binding.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from . import _moved

__version__ = "0.1.0"
_moved.install()  # old module paths (llama_spec.accept, .speculative, ...) keep working for one release

_EXPORTS = {
    "Model": "llama.model",
    "Context": "llama.context",
    "MtpContext": "llama.context",
    "SamplerParams": "llama.sampling",
    "TargetSampler": "llama.sampling",
    "ReasoningBudget": "llama.sampling",
    "SpeculativeGenerator": "generation.solo",
    "GenerationResult": "generation.solo",
    "SpecStats": "generation.solo",
    "generate": "generation.solo",
    "TokenEvent": "generation.solo",
    "BatchGenerator": "generation.batch",
    "GenerationRequest": "generation.batch",
    "generate_batch": "generation.batch",
    "Drafter": "drafters.base",
    "Proposal": "drafters.base",
    "DraftModelDrafter": "drafters.draft_model",
    "MtpDrafter": "drafters.mtp",
    "TopKStats": "observe.stats",
    "devices": "llama.devices",
    "add_rpc_server": "llama.devices",
    "perplexity": "generation.evaluation",
    "local_rpc_servers": "rpc",
    "RpcConnectionError": "errors",
    "chat": "chat_api",
    "ChatCompletion": "chat_api",
    "ModelLoadError": "errors",
    "DecodeError": "errors",
    "ContextError": "errors",
    "LlamaSpecError": "errors",
    "Llama": "compat.llama",
}

__all__ = sorted(_EXPORTS)

if TYPE_CHECKING:  # what type checkers see; at run time every name is imported on first use
    from .chat_api import ChatCompletion, chat
    from .compat.llama import Llama
    from .drafters.base import Drafter, Proposal
    from .drafters.draft_model import DraftModelDrafter
    from .drafters.mtp import MtpDrafter
    from .errors import ContextError, DecodeError, LlamaSpecError, ModelLoadError, RpcConnectionError
    from .generation.batch import BatchGenerator, GenerationRequest, generate_batch
    from .generation.evaluation import perplexity
    from .generation.solo import GenerationResult, SpecStats, SpeculativeGenerator, TokenEvent, generate
    from .llama.context import Context, MtpContext
    from .llama.devices import add_rpc_server, devices
    from .llama.model import Model
    from .llama.sampling import ReasoningBudget, SamplerParams, TargetSampler
    from .observe.stats import TopKStats
    from .rpc import local_rpc_servers


def __getattr__(name: str) -> Any:
    mod = _EXPORTS.get(name)
    if mod is None:
        raise AttributeError(f"module 'llama_spec' has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{mod}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return __all__
