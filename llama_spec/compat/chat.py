"""``create_chat_completion`` of :class:`llama_spec.Llama`: prompt, constraints and result shapes.

As llama-cpp-python 0.3.x's template chat handler (``llama_chat_format.py``): the messages are
rendered into one prompt, the completion runs with the template's EOS text as an extra stop
string, and the ``text_completion`` result becomes a ``chat.completion`` (id ``"chat" +
completion id`` = ``"chatcmpl-..."``; stream: ``chat.completion.chunk``, a first delta with the
role, content deltas, a last delta ``{}`` with the finish reason).

* **chat_format**: ``None`` / ``"chat_template.default"`` = the GGUF's jinja template (in a
  sandbox; ChatML when the GGUF has none, where llama-cpp-python falls back to ``llama-2``),
  ``"chat_template.<name>"`` = a named GGUF template, ``"chatml"``, or one of
  :data:`BUILTIN_CHAT_FORMATS`, rendered by llama.cpp's own built-in template of that family
  (llama-cpp-python renders these with its own Python formatters; whitespace may differ).
* **response_format**: ``{"type": "json_object"}`` (any JSON object), ``{"type": "json_object",
  "schema": S}`` (llama-cpp-python's form) or OpenAI's ``{"type": "json_schema", "json_schema":
  {"schema": S}}``: a grammar from llama.cpp's JSON-schema converter.
* **tools / tool_choice**: the tools go to the template. ``tool_choice={"type": "function",
  "function": {"name": N}}`` forces that tool as llama-cpp-python does (the arguments are
  constrained by its parameter schema; ``message.tool_calls`` and ``function_call``, finish reason
  ``tool_calls``). Otherwise, when tools are given, ``<tool_call>{...}</tool_call>`` blocks in the
  answer (Hermes / Qwen style) become ``tool_calls`` in a non-streamed result.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from ..chat_api import parse_tool_calls, prepare_prompt
from ..chat_api.template import CHATML_TEMPLATE
from ..llama.grammar import json_schema_to_grammar
from ..llama.model import Model

__all__ = ["BUILTIN_CHAT_FORMATS", "ChatPlan", "check_chat_format", "chat_chunks", "chat_result",
           "plan_chat", "response_format_grammar"]

#: llama-cpp-python chat_format names -> llama.cpp's built-in template of the same family.
BUILTIN_CHAT_FORMATS = {
    "llama-2": "llama2", "llama-3": "llama3", "mistral-instruct": "mistral-v1", "zephyr": "zephyr",
    "gemma": "gemma", "vicuna": "vicuna", "openchat": "openchat", "chatglm3": "chatglm3",
}


def check_chat_format(model: Model, chat_format: str | None) -> str | None:
    """The chat_format, checked against what this model and llama-spec can render (ValueError)."""
    if chat_format is None or chat_format in ("chat_template.default", "chatml") or chat_format in BUILTIN_CHAT_FORMATS:
        return chat_format
    if isinstance(chat_format, str) and chat_format.startswith("chat_template."):
        if model.meta("tokenizer." + chat_format) is not None:
            return chat_format
        raise ValueError(f"chat_format {chat_format!r}: the GGUF has no tokenizer.{chat_format}")
    known = ", ".join(["chat_template.default", "chatml", *BUILTIN_CHAT_FORMATS])
    raise ValueError(f"chat_format {chat_format!r} is not supported by llama-spec (known: {known})")


def _template(model: Model, chat_format: str | None) -> str | None:
    if chat_format == "chatml":
        return CHATML_TEMPLATE
    if chat_format is not None and chat_format.startswith("chat_template.") and chat_format != "chat_template.default":
        return model.meta("tokenizer." + chat_format)
    return None  # prepare_prompt: the GGUF's template, else ChatML


def render_tokens(model: Model, messages: Sequence[Mapping[str, Any]], chat_format: str | None,
                  tools: Sequence[Mapping[str, Any]] | None, tool_choice: Any) -> list[int]:
    """The prompt tokens of `messages` (special tokens parsed; BOS where the vocabulary wants it)."""
    if chat_format in BUILTIN_CHAT_FORMATS:
        if tools:
            raise ValueError(f"tools need a jinja chat template; chat_format {chat_format!r} has none")
        msgs = [{"role": str(m["role"]), "content": str(m.get("content") or "")} for m in messages]
        text = model.apply_builtin_chat_template(msgs, template=BUILTIN_CHAT_FORMATS[chat_format])
        toks = model.tokenize(text, add_special=False, parse_special=True)
        bos = model.token_bos
        if model.add_bos and bos is not None and (not toks or toks[0] != bos):
            toks.insert(0, bos)
        return toks
    extra = {"tool_choice": tool_choice} if tool_choice is not None else {}
    return prepare_prompt(model, messages, tools=tools, chat_template=_template(model, chat_format), **extra).tokens


def response_format_grammar(response_format: Mapping[str, Any] | None) -> str | None:
    """GBNF for a response_format (None: unconstrained); ValueError naming what is wrong."""
    if response_format is None:
        return None
    if not isinstance(response_format, Mapping):
        raise TypeError(f"response_format must be a dict, got {type(response_format).__name__}")
    kind = response_format.get("type")
    if kind == "text":
        return None
    if kind == "json_object":
        schema = response_format.get("schema")
        return json_schema_to_grammar(schema if schema is not None else {"type": "object"})
    if kind == "json_schema":
        spec = response_format.get("json_schema")
        schema = spec.get("schema") if isinstance(spec, Mapping) else None
        if schema is None:
            raise ValueError("response_format: type 'json_schema' needs json_schema.schema")
        return json_schema_to_grammar(schema)
    raise ValueError(f"response_format type must be 'text', 'json_object' or 'json_schema', got {kind!r}")


class ChatPlan:
    """What one chat request becomes: prompt tokens, extra stop strings, a grammar, the tool forced."""

    def __init__(self, tokens: list[int], stops: list[str], grammar: str | None, tool: str | None,
                 parse_tools: bool) -> None:
        self.tokens = tokens
        self.stops = stops
        self.grammar = grammar
        self.tool = tool                # the name of the forced tool (tool_choice), else None
        self.parse_tools = parse_tools  # look for <tool_call> blocks in the answer


def _legacy_tools(functions: Sequence[Mapping[str, Any]] | None, function_call: Any, tools: Any,
                  tool_choice: Any) -> tuple[Any, Any]:
    """llama-cpp-python's conversion of the legacy functions/function_call to tools/tool_choice."""
    if functions is not None:
        tools = [{"type": "function", "function": f} for f in functions]
    if isinstance(function_call, str) and function_call in ("none", "auto"):
        tool_choice = function_call
    elif isinstance(function_call, Mapping) and "name" in function_call:
        tool_choice = {"type": "function", "function": {"name": function_call["name"]}}
    return tools, tool_choice


def _forced_tool(tools: Sequence[Mapping[str, Any]] | None, tool_choice: Any) -> tuple[str, str] | None:
    """(name, GBNF of its arguments) when tool_choice names one of `tools`."""
    if not isinstance(tool_choice, Mapping) or tools is None:
        return None
    name = tool_choice["function"]["name"]
    tool = next((t for t in tools if t["function"]["name"] == name), None)
    if tool is None:
        raise ValueError(f"Tool choice '{name}' not found in tools.")
    try:
        grammar = json_schema_to_grammar(tool["function"].get("parameters") or {"type": "object"})
    except ValueError:  # as llama-cpp-python: a schema the converter refuses falls back to any JSON object
        grammar = json_schema_to_grammar({"type": "object"})
    return str(name), grammar


def plan_chat(model: Model, messages: Sequence[Mapping[str, Any]], *, chat_format: str | None,
              functions: Sequence[Mapping[str, Any]] | None, function_call: Any, tools: Any, tool_choice: Any,
              response_format: Mapping[str, Any] | None, grammar: str | None) -> ChatPlan:
    """Render the prompt and pick the constraint of one chat request."""
    tools, tool_choice = _legacy_tools(functions, function_call, tools, tool_choice)
    tokens = render_tokens(model, messages, chat_format, tools, tool_choice)
    eos = model.token_eos
    stops = [model.token_text(eos)] if eos is not None else []
    rf = response_format_grammar(response_format)
    if rf is not None and grammar is not None:
        raise ValueError("give either grammar or response_format, not both")
    forced = _forced_tool(tools, tool_choice)
    if forced is not None and (rf or grammar):
        raise ValueError("tool_choice forces a tool's argument schema: no grammar or response_format with it")
    tool, g = (forced[0], forced[1]) if forced is not None else (None, rf or grammar)
    parse = bool(tools) and forced is None and tool_choice != "none"
    return ChatPlan(tokens, [s for s in stops if s], g, tool, parse)


def _chat_head(c: Mapping[str, Any]) -> dict[str, Any]:
    return {"id": "chat" + c["id"], "object": "chat.completion", "created": c["created"], "model": c["model"]}


def chat_result(c: dict[str, Any], plan: ChatPlan) -> dict[str, Any]:
    """A ``text_completion`` dict -> ``chat.completion`` (tool calls as the plan says)."""
    ch = c["choices"][0]
    text, finish = ch["text"], ch["finish_reason"]
    msg: dict[str, Any] = {"role": "assistant", "content": text}
    if plan.tool is not None:
        call_id = "call__0_" + plan.tool + "_" + c["id"]
        fn = {"name": plan.tool, "arguments": text}
        msg = {"role": "assistant", "content": None, "function_call": fn,
               "tool_calls": [{"id": call_id, "type": "function", "function": dict(fn)}]}
        finish = "tool_calls"
    elif plan.parse_tools:
        content, calls = parse_tool_calls(text)
        if calls:
            msg = {"role": "assistant", "content": content, "tool_calls": calls}
            finish = "tool_calls"
    out = _chat_head(c)
    out["choices"] = [{"index": 0, "message": msg, "logprobs": None, "finish_reason": finish}]
    out["usage"] = c["usage"]
    out["speculative"] = c["speculative"]
    return out


def _chunk(head: Mapping[str, Any], delta: dict[str, Any], finish: str | None) -> dict[str, Any]:
    return {**head, "object": "chat.completion.chunk",
            "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}]}


def chat_chunks(chunks: Iterator[dict[str, Any]], plan: ChatPlan) -> Iterator[dict[str, Any]]:
    """``text_completion`` chunks -> ``chat.completion.chunk`` dicts (the last carries ``speculative``)."""
    head: dict[str, Any] | None = None
    call_id = ""
    for c in chunks:
        ch = c["choices"][0]
        if head is None:
            head = _chat_head(c)
            call_id = "call__0_" + (plan.tool or "") + "_" + c["id"]
            first: dict[str, Any] = {"role": "assistant"}
            if plan.tool is not None:
                first.update(content=None, function_call=None, tool_calls=None)
            yield _chunk(head, first, None)
        if ch["finish_reason"] is not None:
            finish = "tool_calls" if plan.tool is not None else ch["finish_reason"]
            last = _chunk(head, {}, finish)
            if plan.tool is not None:
                last["choices"][0]["delta"] = {"role": None, "content": None, "function_call": None, "tool_calls": None}
            last["speculative"] = c.get("speculative")
            yield last
        elif plan.tool is not None:
            fn = {"name": plan.tool, "arguments": ch["text"]}
            yield _chunk(head, {"role": None, "content": None, "function_call": fn,
                                "tool_calls": [{"index": 0, "id": call_id, "type": "function", "function": dict(fn)}]},
                         None)
        else:
            yield _chunk(head, {"content": ch["text"]}, None)
