"""Exceptions raised by llama-spec (one place, so callers can catch the family)."""


class LlamaSpecError(Exception):
    """Base class of llama-spec's own errors."""


class ModelLoadError(LlamaSpecError):
    """A model could not be loaded: missing file, not a GGUF, truncated, unsupported."""

    def __init__(self, path: str, reason: str):
        super().__init__(f"cannot load model {path!r}: {reason}")
        self.path = path
        self.reason = reason


class ContextError(LlamaSpecError):
    """llama.cpp refused to create a context with the given parameters."""


class DecodeError(LlamaSpecError):
    """llama_decode/llama_process returned a non-zero code."""

    MEANING = {
        1: "no KV slot for the batch (context full: reduce the batch or raise n_ctx)",
        2: "aborted",
        -1: "invalid input batch",
    }

    def __init__(self, code: int, what: str = "decode"):
        meaning = self.MEANING.get(code, "fatal error" if code < -1 else "error")
        super().__init__(f"{what} failed with llama.cpp code {code}: {meaning}")
        self.code = code
