"""Chat with a model from Python: :func:`chat` and its OpenAI-shaped results.

One module per concept: :mod:`.results` (the ``chat.completion`` objects), :mod:`.thinking`
(splitting reasoning from the answer), :mod:`.tools` (tool calls in the answer),
:mod:`.prompt` (template rendering and the reasoning budget) and :mod:`.session` (one chat turn).
The terminal chat (``llama-spec chat``) lives in :mod:`llama_spec.cli.chat`.
"""

from __future__ import annotations

from ..errors import TemplateError
from .prompt import PreparedPrompt, make_budget, prepare_prompt
from .results import ChatCompletion, ChatCompletionChunk, ChatMessage, Choice, ChoiceDelta, ChunkChoice, Usage
from .session import DEFAULT_MAX_TOKENS, StopHold, chat
from .thinking import THINK_TAGS, ThinkSplitter, split_thinking, thinking_tags
from .tools import parse_tool_calls

# The names llama_spec.server used before the split (private then); kept until it moves to the public ones.
_StopHold = StopHold
_ThinkSplitter = ThinkSplitter

__all__ = [
    "DEFAULT_MAX_TOKENS",
    "THINK_TAGS",
    "ChatCompletion",
    "ChatCompletionChunk",
    "ChatMessage",
    "Choice",
    "ChoiceDelta",
    "ChunkChoice",
    "PreparedPrompt",
    "StopHold",
    "TemplateError",
    "ThinkSplitter",
    "Usage",
    "chat",
    "make_budget",
    "parse_tool_calls",
    "prepare_prompt",
    "split_thinking",
    "thinking_tags",
]
