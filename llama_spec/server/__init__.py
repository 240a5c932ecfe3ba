"""OpenAI-compatible HTTP server over the (batched) speculative generator: ``llama-spec serve``.

``create_app(engine, model, config)`` builds the starlette app; :class:`ServerEngine` owns the
worker thread that drives a batch generator (:class:`SerialBatchAdapter` until the batched
generator exists). Needs the ``[server]`` extra (starlette, uvicorn).
"""

from __future__ import annotations

from .app import ServerConfig, create_app
from .engine import GenerationRequest, SerialBatchAdapter, ServerEngine

__all__ = ["GenerationRequest", "SerialBatchAdapter", "ServerConfig", "ServerEngine", "create_app"]
