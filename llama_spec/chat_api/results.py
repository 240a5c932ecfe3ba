"""The OpenAI-shaped result objects of :func:`llama_spec.chat` (``chat.completion`` and its chunks)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from ..types import FinishReason

__all__ = ["ChatCompletion", "ChatCompletionChunk", "ChatMessage", "Choice", "ChoiceDelta", "ChunkChoice", "Usage"]


@dataclass
class ChatMessage:
    role: str = "assistant"
    content: str | None = ""
    reasoning_content: str | None = None
    tool_calls: list[dict[str, Any]] | None = None

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"role": self.role, "content": self.content}
        if self.reasoning_content is not None:
            d["reasoning_content"] = self.reasoning_content
        if self.tool_calls:
            d["tool_calls"] = self.tool_calls
        return d


@dataclass
class Choice:
    index: int
    message: ChatMessage
    finish_reason: FinishReason

    def to_dict(self) -> dict[str, Any]:
        return {"index": self.index, "message": self.message.to_dict(), "logprobs": None,
                "finish_reason": self.finish_reason}


@dataclass
class Usage:
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    reasoning_tokens: int = 0
    cached_tokens: int = 0     # prompt tokens served from the prompt cache (OpenAI's prompt_tokens_details)

    def to_dict(self) -> dict[str, Any]:
        return {"prompt_tokens": self.prompt_tokens, "completion_tokens": self.completion_tokens,
                "total_tokens": self.total_tokens,
                "prompt_tokens_details": {"cached_tokens": self.cached_tokens},
                "completion_tokens_details": {"reasoning_tokens": self.reasoning_tokens}}


@dataclass
class ChatCompletion:
    """OpenAI's ``chat.completion`` object, plus ``speculative`` (``SpecStats.as_dict()``).

    ``generation`` is the raw :class:`~llama_spec.generation.solo.GenerationResult` (tokens, raw text,
    stop reason) and ``prompt`` the rendered prompt; neither goes into ``to_dict()``.
    """

    id: str
    created: int
    model: str
    choices: list[Choice]
    usage: Usage
    speculative: dict[str, Any]
    object: str = "chat.completion"
    prompt: str = field(default="", repr=False)
    generation: Any = field(default=None, repr=False)

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.id, "object": self.object, "created": self.created, "model": self.model,
                "choices": [c.to_dict() for c in self.choices], "usage": self.usage.to_dict(),
                "speculative": self.speculative}

    def to_json(self, **kw: Any) -> str:
        return json.dumps(self.to_dict(), ensure_ascii=False, **kw)


@dataclass
class ChoiceDelta:
    role: str | None = None
    content: str | None = None
    reasoning_content: str | None = None
    tool_calls: list[dict[str, Any]] | None = None

    def to_dict(self) -> dict[str, Any]:
        return {k: v for k, v in (("role", self.role), ("content", self.content),
                                  ("reasoning_content", self.reasoning_content),
                                  ("tool_calls", self.tool_calls)) if v is not None}


@dataclass
class ChunkChoice:
    index: int
    delta: ChoiceDelta
    finish_reason: FinishReason | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"index": self.index, "delta": self.delta.to_dict(), "logprobs": None,
                "finish_reason": self.finish_reason}


@dataclass
class ChatCompletionChunk:
    """One streamed piece (``chat.completion.chunk``); the last one carries finish_reason and usage."""

    id: str
    created: int
    model: str
    choices: list[ChunkChoice]
    usage: Usage | None = None
    speculative: dict[str, Any] | None = None
    object: str = "chat.completion.chunk"
    #: On the last chunk: the raw GenerationResult (tokens, raw text, stop reason).
    generation: Any = field(default=None, repr=False)
    _meta: Any = field(default=None, repr=False, compare=False)

    def to_dict(self) -> dict[str, Any]:
        d = {"id": self.id, "object": self.object, "created": self.created, "model": self.model,
             "choices": [c.to_dict() for c in self.choices]}
        if self.usage is not None:
            d["usage"] = self.usage.to_dict()
        if self.speculative is not None:
            d["speculative"] = self.speculative
        return d
