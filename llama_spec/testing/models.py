"""The named test models (re-exported from :mod:`llama_spec.models.registry`, where they live so
that the CLI can resolve the names without importing the testing package)."""

from __future__ import annotations

from ..models.registry import (
    MODELS,
    ModelFetchError,
    ModelSpec,
    cache_dir,
    model_path,
    resolve_model,
    sha256_file,
)

__all__ = ["MODELS", "ModelFetchError", "ModelSpec", "cache_dir", "model_path", "resolve_model", "sha256_file"]
