"""Every exception llama-spec raises on purpose, all under :class:`LlamaSpecError`.

One module, so a caller can catch the whole family (``except LlamaSpecError``) or one kind,
and so that no layer has to import another layer just to name its errors. Classes that also
derive from a builtin (``ValueError``, ``ConnectionError``, ``RuntimeError``) keep working
for callers that catch the builtin.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any


class LlamaSpecError(Exception):
    """Base class of llama-spec's own errors."""


class ModelLoadError(LlamaSpecError):
    """A model could not be loaded: missing file, not a GGUF, truncated, unsupported."""

    def __init__(self, path: str, reason: str) -> None:
        super().__init__(f"cannot load model {path!r}: {reason}")
        self.path = path
        self.reason = reason


class GeneratorBusyError(LlamaSpecError, RuntimeError):
    """A generator was used from a second thread while a request of another thread was running."""


class ContextError(LlamaSpecError):
    """llama.cpp refused to create a context with the given parameters, or a memory op failed."""


class DecodeError(LlamaSpecError):
    """llama_decode/llama_process returned a non-zero code."""

    MEANING = {
        1: "no KV slot for the batch (context full: reduce the batch or raise n_ctx)",
        2: "aborted",
        -1: "invalid input batch",
    }

    def __init__(self, code: int, what: str = "decode") -> None:
        meaning = self.MEANING.get(code, "fatal error" if code < -1 else "error")
        super().__init__(f"{what} failed with llama.cpp code {code}: {meaning}")
        self.code = code


class RpcConnectionError(LlamaSpecError, ConnectionError):
    """An RPC server could not be reached, or was lost while in use.

    Also raised by every use of a model or context that lived on a lost server.
    """

    def __init__(self, endpoint: str, message: str) -> None:
        super().__init__(f"RPC server {endpoint} {message}")
        self.endpoint = endpoint
        self.reason = message


class TemplateError(LlamaSpecError, ValueError):
    """A chat template failed to compile or render, raised on purpose, or tried unsafe access."""


class HubError(LlamaSpecError):
    """A model could not be found or fetched from the Hugging Face hub."""


class ModelNotCachedError(HubError):
    """Offline (or the hub unreachable) and the requested file is not in the local cache."""

    def __init__(self, repo_id: str, filename: str, cache_dir: Path, reason: str | None = None) -> None:
        why = reason or "HF_HUB_OFFLINE=1"
        super().__init__(f"{why} and {repo_id}/{filename} is not in the cache ({cache_dir})")
        self.repo_id = repo_id
        self.filename = filename
        self.cache_dir = cache_dir


class ModelFetchError(LlamaSpecError, RuntimeError):
    """A named test model could not be fetched or did not verify (the message names URL and reason)."""


class RequestError(LlamaSpecError, ValueError):
    """A server request refused: HTTP status, message, the field at fault (``param``), an error code."""

    def __init__(self, message: str, param: str | None = None, *, status: int = 400,
                 code: str | None = None, type: str = "invalid_request_error") -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.status = status
        self.code = code
        self.type = type

    def body(self) -> dict[str, Any]:
        """OpenAI's error shape."""
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


class SequenceError(LlamaSpecError, RuntimeError):
    """One sequence of a batched run failed; the batch dropped it (its slot is free) and goes on."""

    def __init__(self, request_id: int, cause: BaseException) -> None:
        super().__init__(f"request {request_id} failed: {type(cause).__name__}: {cause}")
        self.request_id = request_id
        self.cause = cause


class UnnormalizedError(LlamaSpecError, ValueError):
    """p (or q) does not sum to 1 +- tol; the loop should use the exact-match rule instead."""

    def __init__(self, which: str, total: float, tol: float) -> None:
        super().__init__(f"{which} sums to {total!r}, not 1 +- {tol}")
        self.which = which
        self.total = total
