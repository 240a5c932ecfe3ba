"""Request validation for the OpenAI-compatible endpoints: JSON body -> a checked request.

Every check names the offending field (``RequestError.param``) so the server can answer a 400
in OpenAI's error shape. Unknown fields are ignored (clients send ``user``, ``logprobs`` ...);
known fields with a wrong type or value are refused. Sampling defaults are llama.cpp's
(``SamplerParams()``), as in ``llama-server``.
"""

from __future__ import annotations

import json
import math
import secrets
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ..errors import RequestError
from ..kernels.tree_shape import parse_tree_shape
from ..llama.sampling import SamplerParams

__all__ = ["ChatRequest", "CompletionRequest", "RequestError", "parse_chat", "parse_completion", "parse_json"]

MAX_STOP = 16  # OpenAI allows 4; llama-server any number; a bound keeps the stop scan cheap
RULES = ("token", "block", "exact-match")


@dataclass
class _Common:
    """Fields shared by both endpoints (already checked)."""

    model: str | None = None
    sampling: SamplerParams = field(default_factory=SamplerParams)
    seed: int = 0
    max_tokens: int | None = None   # None: until the slot's context is full
    stop: list[str] = field(default_factory=list)
    stream: bool = False
    include_usage: bool = False
    ignore_eos: bool = False
    n_max: int | None = None
    verify: str | None = None
    tree: tuple[int, ...] | None = None
    cache_prompt: bool = True       # llama-server's field: reuse the slot's common prompt prefix


@dataclass
class ChatRequest(_Common):
    messages: list[dict] = field(default_factory=list)
    tools: list[dict] | None = None
    enable_thinking: bool | None = None
    template_kwargs: dict = field(default_factory=dict)


@dataclass
class CompletionRequest(_Common):
    prompt: str | list[int] = ""


def parse_json(raw: bytes) -> dict:
    """The body as a JSON object, or a RequestError saying what is wrong with it."""
    try:
        body = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as e:
        raise RequestError(f"malformed JSON body: {e}", None, code="invalid_json") from None
    if not isinstance(body, dict):
        raise RequestError(f"the body must be a JSON object, got {type(body).__name__}", None)
    return body


# ------------------------------------------------------------------------------ field helpers
def _num(body: Mapping, name: str, lo: float, hi: float, *, integer: bool = False) -> float | int | None:
    """body[name] as a number in [lo, hi] (None when absent or null)."""
    v = body.get(name)
    if v is None:
        return None
    ok = isinstance(v, int) if integer else isinstance(v, int | float)
    if isinstance(v, bool) or not ok or (isinstance(v, float) and not math.isfinite(v)):
        kind = "an integer" if integer else "a number"
        raise RequestError(f"'{name}' must be {kind}, got {v!r}", name)
    if not lo <= v <= hi:
        raise RequestError(f"'{name}' must be in [{lo}, {hi}], got {v!r}", name)
    return v


def _bool(body: Mapping, name: str) -> bool | None:
    v = body.get(name)
    if v is None:
        return None
    if not isinstance(v, bool):
        raise RequestError(f"'{name}' must be true or false, got {v!r}", name)
    return v


def _stop(body: Mapping) -> list[str]:
    v = body.get("stop")
    if v is None:
        return []
    items = [v] if isinstance(v, str) else v
    if not isinstance(items, list) or not all(isinstance(s, str) for s in items):
        raise RequestError(f"'stop' must be a string or a list of strings, got {v!r}", "stop")
    if len(items) > MAX_STOP:
        raise RequestError(f"'stop' holds {len(items)} strings; at most {MAX_STOP}", "stop")
    return [s for s in items if s]


def _logit_bias(body: Mapping) -> tuple[tuple[int, float], ...]:
    v = body.get("logit_bias")
    if v is None:
        return ()
    if not isinstance(v, dict):
        raise RequestError("'logit_bias' must be an object {token id: bias}", "logit_bias")
    out = []
    for k, b in v.items():
        try:
            tok = int(k)
        except ValueError:
            raise RequestError(f"'logit_bias' key {k!r} is not a token id", "logit_bias") from None
        if isinstance(b, bool) or not isinstance(b, int | float) or not -100 <= b <= 100:
            raise RequestError(f"'logit_bias' value for {k} must be a number in [-100, 100]", "logit_bias")
        out.append((tok, float(b)))
    return tuple(out)


def _sampling(body: Mapping, n_vocab: int) -> SamplerParams:
    """SamplerParams from OpenAI's fields and llama.cpp's extras (llama-server's names)."""
    kw: dict[str, Any] = {}
    spec = {  # field -> (SamplerParams name, lo, hi, integer)
        "temperature": ("temp", 0.0, 100.0, False),
        "top_p": ("top_p", 0.0, 1.0, False),
        "top_k": ("top_k", 0, n_vocab, True),
        "min_p": ("min_p", 0.0, 1.0, False),
        "typical_p": ("typical_p", 1e-6, 1.0, False),
        "top_n_sigma": ("top_n_sigma", -1.0, 100.0, False),
        "repeat_penalty": ("penalty_repeat", 1e-6, 100.0, False),
        "repeat_last_n": ("penalty_last_n", -1, 1 << 20, True),
        "presence_penalty": ("penalty_present", -2.0, 2.0, False),
        "frequency_penalty": ("penalty_freq", -2.0, 2.0, False),
        "min_keep": ("min_keep", 0, n_vocab, True),
    }
    for name, (attr, lo, hi, integer) in spec.items():
        v = _num(body, name, lo, hi, integer=integer)
        if v is not None:
            kw[attr] = v
    bias = _logit_bias(body)
    for tok, _ in bias:
        if not 0 <= tok < n_vocab:
            raise RequestError(f"'logit_bias' token {tok} is outside the vocabulary (0..{n_vocab - 1})", "logit_bias")
    if bias:
        kw["logit_bias"] = bias
    g = body.get("grammar")
    if g is not None:
        if not isinstance(g, str):
            raise RequestError("'grammar' must be a GBNF string", "grammar")
        kw["grammar"] = g or None
    return SamplerParams(**kw)


def _common(body: Mapping, n_vocab: int, out: _Common) -> None:
    """Fill the fields both endpoints share; every refusal names its field."""
    m = body.get("model")
    if m is not None and not isinstance(m, str):
        raise RequestError("'model' must be a string", "model")
    out.model = m
    n = _num(body, "n", 1, 1, integer=True)  # only one choice per request
    del n
    seed = _num(body, "seed", -(1 << 63), (1 << 64) - 1, integer=True)
    # A request without a seed gets a fresh random one (both the dist and the accept RNG).
    out.seed = secrets.randbits(32) if seed is None or seed == -1 else int(seed) & 0xFFFFFFFF
    out.sampling = _sampling(body, n_vocab).replace(seed=out.seed)
    mt = None
    for name in ("max_tokens", "max_completion_tokens", "n_predict"):
        v = _num(body, name, -1, 1 << 31, integer=True)
        if v is not None and v != -1:
            if v == 0:
                raise RequestError(f"'{name}' must be >= 1 (or -1 for no limit)", name)
            mt = int(v)
            break
    out.max_tokens = mt
    out.stop = _stop(body)
    out.stream = bool(_bool(body, "stream"))
    so = body.get("stream_options")
    if so is not None:
        if not isinstance(so, dict):
            raise RequestError("'stream_options' must be an object", "stream_options")
        out.include_usage = bool(_bool(so, "include_usage"))
    out.ignore_eos = bool(_bool(body, "ignore_eos"))
    cp = _bool(body, "cache_prompt")
    out.cache_prompt = True if cp is None else cp
    nm = _num(body, "speculative.n_max", 1, 64, integer=True)  # llama-server's name
    out.n_max = None if nm is None else int(nm)
    rule = body.get("verify")
    if rule is not None and rule not in RULES:
        raise RequestError(f"'verify' must be one of {', '.join(RULES)}, got {rule!r}", "verify")
    out.verify = rule
    tree = body.get("tree")
    if tree is not None:
        try:
            out.tree = parse_tree_shape(tree, "tree")
        except (TypeError, ValueError) as e:
            raise RequestError(str(e), "tree") from None


def _message(i: int, m: Any) -> dict:
    if not isinstance(m, dict):
        raise RequestError(f"'messages[{i}]' must be an object", f"messages[{i}]")
    role = m.get("role")
    if role not in ("system", "developer", "user", "assistant", "tool"):
        raise RequestError(f"'messages[{i}].role' must be system, developer, user, assistant or tool, got {role!r}",
                           f"messages[{i}].role")
    content = m.get("content")
    if isinstance(content, list):  # OpenAI content parts: keep the text parts
        texts = []
        for j, part in enumerate(content):
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise RequestError(f"'messages[{i}].content[{j}]' must be a text part (images are not supported)",
                                   f"messages[{i}].content")
            texts.append(part["text"])
        content = "".join(texts)
    if content is not None and not isinstance(content, str):
        raise RequestError(f"'messages[{i}].content' must be a string or a list of text parts",
                           f"messages[{i}].content")
    out = {k: v for k, v in m.items() if k != "content"}
    out["content"] = content
    return out


def parse_chat(body: Mapping, n_vocab: int) -> ChatRequest:
    """Check a /v1/chat/completions body."""
    req = ChatRequest()
    msgs = body.get("messages")
    if not isinstance(msgs, list) or not msgs:
        raise RequestError("'messages' must be a non-empty list", "messages")
    req.messages = [_message(i, m) for i, m in enumerate(msgs)]
    tools = body.get("tools")
    if tools is not None and (not isinstance(tools, list) or not all(isinstance(t, dict) for t in tools)):
        raise RequestError("'tools' must be a list of objects", "tools")
    req.tools = tools
    kw = body.get("chat_template_kwargs")
    if kw is not None and not isinstance(kw, dict):
        raise RequestError("'chat_template_kwargs' must be an object", "chat_template_kwargs")
    req.template_kwargs = dict(kw or {})
    et = req.template_kwargs.pop("enable_thinking", None)
    if et is not None and not isinstance(et, bool):
        raise RequestError("'chat_template_kwargs.enable_thinking' must be true or false", "chat_template_kwargs")
    req.enable_thinking = et
    _common(body, n_vocab, req)
    return req


def parse_completion(body: Mapping, n_vocab: int) -> CompletionRequest:
    """Check a /v1/completions body: ``prompt`` is a string, a list of token ids, or a list of one string."""
    req = CompletionRequest()
    p = body.get("prompt")
    if isinstance(p, list) and len(p) == 1 and isinstance(p[0], str):
        p = p[0]
    if isinstance(p, str):
        if not p:
            raise RequestError("'prompt' is empty", "prompt")
        req.prompt = p
    elif isinstance(p, list) and p and all(isinstance(t, int) and not isinstance(t, bool) for t in p):
        bad = [t for t in p if not 0 <= t < n_vocab]
        if bad:
            raise RequestError(f"'prompt' token {bad[0]} is outside the vocabulary (0..{n_vocab - 1})", "prompt")
        req.prompt = [int(t) for t in p]
    else:
        raise RequestError("'prompt' must be a non-empty string or a list of token ids (one prompt per request)",
                           "prompt")
    _common(body, n_vocab, req)
    return req
