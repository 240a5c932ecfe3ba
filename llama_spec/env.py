"""Environment switches shared by the API, the CLI and the server (llama.cpp's LLAMA_ARG_* style)."""

from __future__ import annotations

import os

_TRUE = ("1", "true", "on", "yes")
_FALSE = ("0", "false", "off", "no")


def env_flag(name: str, default: bool) -> bool:
    """Read a boolean environment switch: 1/true/on/yes or 0/false/off/no (any case).

    Unset or blank gives `default`; anything else is a ValueError naming the variable.
    """
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    v = raw.strip().lower()
    if v in _TRUE:
        return True
    if v in _FALSE:
        return False
    raise ValueError(f"environment variable {name}={raw!r}: expected one of {'/'.join(_TRUE + _FALSE)}")


ENV_THREADS = "LLAMA_SPEC_THREADS"


def default_threads() -> int:
    """llama-spec's default thread count: $LLAMA_SPEC_THREADS (a positive integer), else every core.

    The variable lets several processes share the cores without oversubscribing them (llama.cpp's
    threads spin while they wait: two 2-thread processes on 2 cores run many times slower)."""
    raw = os.environ.get(ENV_THREADS, "").strip()
    if raw:
        try:
            n = int(raw)
        except ValueError:
            n = 0
        if n <= 0:
            raise ValueError(f"environment variable {ENV_THREADS}={raw!r}: expected a positive integer")
        return n
    return max(1, os.cpu_count() or 1)
