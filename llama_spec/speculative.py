"""Deprecated path (one release): the solo generator lives in llama_spec.generation.solo."""

from .generation.request import _ACCEPT_SEED_SALT, ENV_DRAFT_SAMPLE, GenerationStream  # noqa: F401
from .generation.solo import (
           GenerationResult,
           SpecStats,
           SpeculativeGenerator,
           TokenEvent,
           VerifyName,
           generate,
)

__all__ = ["ENV_DRAFT_SAMPLE", "GenerationResult", "GenerationStream", "SpecStats", "SpeculativeGenerator",
           "TokenEvent", "VerifyName", "generate"]
