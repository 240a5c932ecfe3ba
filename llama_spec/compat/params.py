"""The constructor keywords of llama-cpp-python's ``Llama`` and what llama-spec does with each.

Every keyword of llama-cpp-python 0.3.36's ``Llama.__init__`` is in exactly one of three groups:

* **supported**: a parameter of :class:`llama_spec.Llama` with the same meaning (``SUPPORTED``);
* **default only**: accepted with llama-cpp-python's default value, which is what llama-spec
  does anyway; any other value raises ``TypeError`` naming the keyword (``DEFAULT_ONLY``);
* nothing else: an unknown keyword raises ``TypeError`` as Python does (llama-cpp-python
  silently swallows unknown keywords in ``**kwargs``; llama-spec never ignores one).

The converters below turn llama-cpp-python's values (ggml enum integers, booleans) into the
names :class:`~llama_spec.Model` and :class:`~llama_spec.Context` take.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ..types import FlashAttn, SplitMode

__all__ = ["DEFAULT_ONLY", "LLAMA_CPP_PYTHON_INIT_KEYWORDS", "SUPPORTED", "check_default_only", "flash_attn_mode",
           "kv_cache_type", "load_mode", "rpc_list", "split_mode_name"]

#: llama-cpp-python 0.3.36's ``Llama.__init__`` keywords, in its order (plus ``rpc_servers``,
#: a keyword of earlier 0.3.x releases).
LLAMA_CPP_PYTHON_INIT_KEYWORDS = (
    "model_path", "n_gpu_layers", "split_mode", "main_gpu", "tensor_split", "rpc_servers", "vocab_only",
    "use_mmap", "use_mlock", "kv_overrides", "seed", "n_ctx", "n_batch", "n_ubatch", "n_threads",
    "n_threads_batch", "rope_scaling_type", "pooling_type", "attention_type", "rope_freq_base",
    "rope_freq_scale", "yarn_ext_factor", "yarn_attn_factor", "yarn_beta_fast", "yarn_beta_slow",
    "yarn_orig_ctx", "logits_all", "embedding", "offload_kqv", "flash_attn", "op_offload", "swa_full",
    "no_perf", "last_n_tokens_size", "lora_base", "lora_scale", "lora_path", "numa", "chat_format",
    "chat_handler", "draft_model", "tokenizer", "type_k", "type_v", "spm_infill", "verbose",
)

#: Keywords llama-spec implements (parameters of ``llama_spec.Llama.__init__``).
SUPPORTED = frozenset({
    "model_path", "n_gpu_layers", "split_mode", "main_gpu", "tensor_split", "rpc_servers", "use_mmap",
    "use_mlock", "seed", "n_ctx", "n_batch", "n_ubatch", "n_threads", "n_threads_batch", "flash_attn",
    "no_perf", "last_n_tokens_size", "chat_format", "draft_model", "type_k", "type_v", "verbose",
})

_UNSPECIFIED = -1  # llama.cpp's LLAMA_ROPE_SCALING_TYPE/POOLING_TYPE/ATTENTION_TYPE_UNSPECIFIED

#: Keyword -> (llama-cpp-python's default, why no other value is possible here).
DEFAULT_ONLY: dict[str, tuple[Any, str]] = {
    "vocab_only": (False, "a vocabulary-only model cannot generate"),
    "kv_overrides": (None, "GGUF metadata overrides are not implemented"),
    "rope_scaling_type": (_UNSPECIFIED, "RoPE settings are read from the GGUF"),
    "pooling_type": (_UNSPECIFIED, "embeddings are out of scope"),
    "attention_type": (_UNSPECIFIED, "embeddings are out of scope"),
    "rope_freq_base": (0.0, "RoPE settings are read from the GGUF"),
    "rope_freq_scale": (0.0, "RoPE settings are read from the GGUF"),
    "yarn_ext_factor": (-1.0, "YaRN settings are read from the GGUF"),
    "yarn_attn_factor": (1.0, "YaRN settings are read from the GGUF"),
    "yarn_beta_fast": (32.0, "YaRN settings are read from the GGUF"),
    "yarn_beta_slow": (1.0, "YaRN settings are read from the GGUF"),
    "yarn_orig_ctx": (0, "YaRN settings are read from the GGUF"),
    "logits_all": (False, "logits of every position (and logprobs) are out of scope"),
    "embedding": (False, "embeddings are out of scope"),
    "offload_kqv": (True, "the KV cache always follows its layers"),
    "op_offload": (None, "llama.cpp's default host-op offload is always used"),
    "swa_full": (None, "llama.cpp's default SWA cache size is always used"),
    "lora_base": (None, "LoRA adapters are not implemented"),
    "lora_scale": (1.0, "LoRA adapters are not implemented"),
    "lora_path": (None, "LoRA adapters are not implemented"),
    "numa": (False, "NUMA policies are not implemented"),
    "chat_handler": (None, "Python chat handlers are not implemented: use chat_format or the GGUF template"),
    "tokenizer": (None, "the GGUF's own tokenizer is always used"),
    "spm_infill": (False, "infill (suffix) prompts are not implemented"),
}

# ggml_type enum values (ggml.h; part of the ABI) -> llama-spec's KV cache type names
_GGML_TYPES = {0: "f32", 1: "f16", 2: "q4_0", 3: "q4_1", 6: "q5_0", 7: "q5_1", 8: "q8_0", 20: "iq4_nl", 30: "bf16"}
# llama_split_mode enum values (llama.h) -> names
_SPLIT_MODES: dict[int, SplitMode] = {0: "none", 1: "layer", 2: "row", 3: "tensor"}


def _same(value: Any, default: Any) -> bool:
    if default is None:
        return value is None
    if value is None and default == _UNSPECIFIED:  # llama-cpp-python treats None as unspecified here
        return True
    return bool(type(value) is not bool or type(default) is bool) and bool(value == default)


def check_default_only(kwargs: Mapping[str, Any]) -> None:
    """TypeError naming the first keyword that is unknown or given a value other than its default."""
    for name, value in kwargs.items():
        if name not in DEFAULT_ONLY:
            raise TypeError(f"Llama.__init__() got an unexpected keyword argument {name!r}")
        default, why = DEFAULT_ONLY[name]
        if not _same(value, default):
            raise TypeError(f"Llama(): keyword {name!r} is not supported by llama-spec ({why}); only "
                            f"{name}={default!r} (llama-cpp-python's default) is accepted, got {value!r}")


def split_mode_name(value: int | str) -> SplitMode:
    """llama_split_mode (0 none, 1 layer, 2 row, 3 tensor) or its name -> the name."""
    if isinstance(value, str) and value in _SPLIT_MODES.values():
        return value  # type: ignore[return-value]  # checked just above
    if isinstance(value, int) and not isinstance(value, bool) and value in _SPLIT_MODES:
        return _SPLIT_MODES[value]
    raise ValueError(f"split_mode must be 0-3 (llama_cpp.LLAMA_SPLIT_MODE_*) or a name "
                     f"({', '.join(_SPLIT_MODES.values())}), got {value!r}")


def kv_cache_type(name: str, value: int | str | None) -> str:
    """type_k / type_v: a ggml_type integer (llama-cpp-python) or a name; None = f16 (the default)."""
    if value is None:
        return "f16"
    if isinstance(value, str) and value in _GGML_TYPES.values():
        return value
    if isinstance(value, int) and not isinstance(value, bool) and value in _GGML_TYPES:
        return _GGML_TYPES[value]
    known = ", ".join(f"{k} ({v})" for k, v in _GGML_TYPES.items())
    raise ValueError(f"{name} must be a ggml type of the KV cache: {known}; got {value!r}")


def flash_attn_mode(value: bool | str) -> FlashAttn:
    """flash_attn: llama-cpp-python's bool (False, its default, = off) or llama.cpp's on/off/auto."""
    if isinstance(value, bool):
        return "on" if value else "off"
    if value in ("on", "off", "auto"):
        return value  # type: ignore[return-value]  # checked just above
    raise ValueError(f"flash_attn must be a bool or one of 'on', 'off', 'auto', got {value!r}")


def load_mode(use_mmap: bool, use_mlock: bool) -> str:
    """llama-cpp-python's use_mmap/use_mlock pair -> llama.cpp's load mode name."""
    if use_mmap and use_mlock:
        return "mmap+mlock"
    if use_mlock:
        return "mlock"
    return "mmap" if use_mmap else "none"


def rpc_list(value: str | Sequence[str] | None) -> list[str] | None:
    """rpc_servers: llama-cpp-python's comma-separated string, or a list of host:port."""
    if value is None:
        return None
    items = value.split(",") if isinstance(value, str) else list(value)
    out = [s.strip() for s in items if s.strip()]
    return out or None
