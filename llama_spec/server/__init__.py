"""OpenAI-compatible HTTP server over the (batched) speculative generator: ``llama-spec serve``.

``create_app(engine, model, config)`` builds the starlette app; :class:`ServerEngine` owns the
worker thread that drives a :class:`~llama_spec.generation.batch.BatchGenerator`. Needs the ``[server]`` extra (starlette, uvicorn).
"""

from __future__ import annotations

from .app import ServerConfig, create_app
from .engine import GenerationRequest, ServerEngine

__all__ = ["GenerationRequest", "ServerConfig", "ServerEngine", "create_app"]
