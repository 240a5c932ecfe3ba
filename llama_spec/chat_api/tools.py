"""Tool calls in a model's answer (Hermes / Qwen ``<tool_call>{json}</tool_call>`` blocks)."""

from __future__ import annotations

import json
import re
import uuid
from typing import Any

__all__ = ["parse_tool_calls"]

_TOOL_CALL_RE = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)


def parse_tool_calls(answer: str) -> tuple[str | None, list[dict[str, Any]]]:
    """Hermes/Qwen ``<tool_call>{json}</tool_call>`` blocks -> OpenAI tool_calls (others kept as text)."""
    calls: list[dict[str, Any]] = []
    for m in _TOOL_CALL_RE.finditer(answer):
        try:
            obj = json.loads(m.group(1))
        except ValueError:
            continue
        if not isinstance(obj, dict) or "name" not in obj:
            continue
        args = obj.get("arguments", {})
        calls.append({"id": "call_" + uuid.uuid4().hex[:24], "type": "function",
                      "function": {"name": str(obj["name"]),
                                   "arguments": args if isinstance(args, str) else json.dumps(args, ensure_ascii=False)}})
    if not calls:
        return answer, []
    rest = _TOOL_CALL_RE.sub("", answer).strip()
    return (rest or None), calls
