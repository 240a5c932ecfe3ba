"""Render a GGUF's own ``tokenizer.chat_template`` with jinja2, in a sandbox.

A chat template is code that ships inside a model file, and model files are untrusted input:
llama-cpp-python's CVE-2024-34359 was remote code execution through a template rendered by a
plain ``jinja2.Environment``. Here every template runs in an
:class:`jinja2.sandbox.ImmutableSandboxedEnvironment` (no ``_``-prefixed attributes, no
mutation of lists/dicts/sets, no unsafe callables) and, stricter than the stock sandbox, an
unsafe attribute access fails at once instead of rendering as an empty string. Huge
repetitions (``'a' * 10**12``) and outputs are capped.

The helpers real templates need are the ones Hugging Face ``transformers`` provides:
``raise_exception(msg)``, ``strftime_now(fmt)``, a ``tojson`` filter with Python ``json.dumps``
semantics (no HTML escaping, ``indent``/``separators``/``sort_keys``/``ensure_ascii``), the loop
controls extension (``{% break %}``/``{% continue %}``), ``trim_blocks``/``lstrip_blocks``, and
the variables ``messages``, ``add_generation_prompt``, ``bos_token``, ``eos_token``, ``tools``,
``enable_thinking`` (Qwen3), plus any extra keyword.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

import jinja2
import jinja2.ext
from jinja2.exceptions import SecurityError
from jinja2.sandbox import ImmutableSandboxedEnvironment

from ..errors import TemplateError

__all__ = [
    "CHATML_TEMPLATE",
    "MAX_OUTPUT_CHARS",
    "TemplateError",
    "compile_chat_template",
    "render_chat_template",
]

#: Largest rendered prompt (characters) and largest ``*`` repetition a template may produce.
MAX_OUTPUT_CHARS = 32 * 1024 * 1024
_MAX_REPEAT = MAX_OUTPUT_CHARS
_MAX_POW_EXP = 4096

#: Fallback for a model without a template: ChatML (what llama.cpp also falls back to).
CHATML_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + (message['content'] or '') + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


class _TemplateRaised(Exception):
    """``raise_exception(...)`` called by the template itself (its message is for the user)."""


def _raise_exception(message: Any = "") -> None:
    raise _TemplateRaised(str(message))


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(str(fmt))


def _tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None,
            separators: Sequence[str] | None = None, sort_keys: bool = False) -> str:
    """Hugging Face's ``tojson``: plain ``json.dumps`` (jinja2's own escapes <, >, & and ')."""
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent,
                      separators=(separators[0], separators[1]) if separators is not None else None,
                      sort_keys=sort_keys, default=_json_default)


def _json_default(o: Any) -> Any:
    if isinstance(o, jinja2.Undefined):
        return None
    if isinstance(o, Mapping):
        return dict(o)
    if isinstance(o, (set, frozenset, tuple)):
        return list(o)
    raise TypeError(f"Object of type {type(o).__name__} is not JSON serializable")


class _Sandbox(ImmutableSandboxedEnvironment):
    """The immutable sandbox, failing loudly on unsafe access and capping repetition."""

    intercepted_binops = frozenset(["*", "**"])

    def unsafe_undefined(self, obj: Any, attribute: str) -> jinja2.Undefined:
        # The stock sandbox returns an Undefined that renders as "" when printed: a template
        # probing `cycler.__init__` would pass silently. Refuse right away instead.
        raise SecurityError(
            f"access to attribute {attribute!r} of {type(obj).__name__!r} object is unsafe"
        )

    def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
        if operator == "*":
            for seq, n in ((left, right), (right, left)):
                if isinstance(seq, (str, bytes, list, tuple)) and isinstance(n, int) and not isinstance(n, bool):
                    if n > 0 and len(seq) * n > _MAX_REPEAT:
                        raise SecurityError(f"repetition of {len(seq)} items x {n} exceeds the limit")
        elif operator == "**":
            if isinstance(right, (int, float)) and abs(right) > _MAX_POW_EXP and isinstance(left, (int, float)) \
                    and abs(left) > 1:
                raise SecurityError(f"power with exponent {right} exceeds the limit")
        return super().call_binop(context, operator, left, right)


def _environment() -> _Sandbox:
    env = _Sandbox(
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=False,
        extensions=[jinja2.ext.loopcontrols],
        undefined=jinja2.Undefined,
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env


_ENV = _environment()


@functools.lru_cache(maxsize=16)
def compile_chat_template(template: str) -> jinja2.Template:
    """Compile (and cache) a template; a syntax error becomes a :class:`TemplateError`."""
    if not isinstance(template, str):
        raise TemplateError(f"chat template must be a string, got {type(template).__name__}")
    try:
        return _ENV.from_string(template)
    except jinja2.TemplateSyntaxError as e:
        raise TemplateError(f"chat template does not compile: line {e.lineno}: {e.message}") from None
    except SecurityError as e:
        raise TemplateError(f"chat template refused by the sandbox: {e}") from None
    except Exception as e:  # noqa: BLE001 - anything else jinja2 may raise on odd input
        raise TemplateError(f"chat template does not compile: {type(e).__name__}: {e}") from None


def _normalize_content(content: Any) -> Any:
    """OpenAI content parts [{"type": "text", "text": ...}, ...] -> one string (text only)."""
    if isinstance(content, list) and content and all(
        isinstance(p, Mapping) and p.get("type") == "text" for p in content
    ):
        return "".join(str(p.get("text", "")) for p in content)
    return content


def _normalize_messages(messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m, Mapping):
            raise TypeError(f"messages[{i}] must be a mapping with 'role' and 'content', got {type(m).__name__}")
        if "role" not in m:
            raise ValueError(f"messages[{i}] has no 'role'")
        d = dict(m)
        d["content"] = _normalize_content(d.get("content"))
        out.append(d)
    return out


def render_chat_template(
    template: str,
    messages: Sequence[Mapping[str, Any]],
    *,
    add_generation_prompt: bool = True,
    bos_token: str = "",
    eos_token: str = "",
    enable_thinking: bool | None = None,
    tools: Sequence[Mapping[str, Any]] | None = None,
    **extra: Any,
) -> str:
    """Render ``template`` for ``messages`` in the sandbox and return the prompt text.

    ``enable_thinking`` is passed only when not ``None`` (templates test ``is defined``);
    ``tools`` is passed as given (``None`` renders the no-tools branch). Raises
    :class:`TemplateError` with a one-line reason on any failure, unsafe access included.
    """
    tmpl = compile_chat_template(template)
    variables: dict[str, Any] = {
        "messages": _normalize_messages(messages),
        "add_generation_prompt": bool(add_generation_prompt),
        "bos_token": bos_token,
        "eos_token": eos_token,
        "tools": [dict(t) for t in tools] if tools is not None else None,
        **extra,
    }
    if enable_thinking is not None:
        variables["enable_thinking"] = bool(enable_thinking)
    parts: list[str] = []
    size = 0
    try:
        for chunk in tmpl.generate(**variables):
            size += len(chunk)
            if size > MAX_OUTPUT_CHARS:
                raise SecurityError(f"rendered prompt exceeds {MAX_OUTPUT_CHARS} characters")
            parts.append(chunk)
    except SecurityError as e:
        raise TemplateError(f"chat template refused by the sandbox (unsafe operation): {e}") from None
    except _TemplateRaised as e:
        raise TemplateError(f"chat template raised an exception: {e}") from None
    except jinja2.TemplateError as e:
        raise TemplateError(f"chat template failed: {type(e).__name__}: {e}") from None
    except RecursionError:
        raise TemplateError("chat template failed: recursion too deep") from None
    except MemoryError:
        raise TemplateError("chat template failed: out of memory") from None
    except Exception as e:  # noqa: BLE001 - a template is untrusted code: report, never crash
        raise TemplateError(f"chat template failed: {type(e).__name__}: {e}") from None
    return "".join(parts)
