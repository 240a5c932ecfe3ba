"""Deprecated path (one release): the batched generator lives in llama_spec.generation.batch."""

from .generation.batch import BatchGenerator, BatchItem, GenerationRequest, generate_batch, stream_batch

__all__ = ["BatchGenerator", "BatchItem", "GenerationRequest", "generate_batch", "stream_batch"]
