"""llama-spec: drive llama.cpp from Python and decode speculatively with an exact verifier.

Names are imported lazily, so ``import llama_spec.accept`` (the pure numpy/numba kernel) never
loads the compiled llama.cpp binding.
"""

from __future__ import annotations

import importlib

__version__ = "0.1.0"

_EXPORTS = {
    "Model": "model",
    "Context": "context",
    "MtpContext": "context",
    "SamplerParams": "sampling",
    "TargetSampler": "sampling",
    "ReasoningBudget": "sampling",
    "SpeculativeGenerator": "speculative",
    "GenerationResult": "speculative",
    "SpecStats": "speculative",
    "generate": "speculative",
    "TokenEvent": "speculative",
    "Drafter": "drafters.base",
    "Proposal": "drafters.base",
    "DraftModelDrafter": "drafters.draft_model",
    "MtpDrafter": "drafters.mtp",
    "TopKStats": "stats",
    "devices": "backends",
    "add_rpc_server": "backends",
    "perplexity": "evaluation",
    "local_rpc_servers": "rpc",
    "RpcConnectionError": "rpc",
    "chat": "chat_api",
    "ChatCompletion": "chat_api",
    "from_pretrained": "hub",
    "ModelLoadError": "errors",
    "DecodeError": "errors",
    "ContextError": "errors",
    "LlamaSpecError": "errors",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    mod = _EXPORTS.get(name)
    if mod is None:
        raise AttributeError(f"module 'llama_spec' has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{mod}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return __all__
