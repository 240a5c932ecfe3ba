"""Environment switches shared by the API, the CLI and the server (llama.cpp's LLAMA_ARG_* style)."""

from __future__ import annotations

import os

_TRUE = ("1", "true", "on", "yes")
_FALSE = ("0", "false", "off", "no")


def parse_flag(value: str) -> bool | None:
    """1/true/on/yes -> True, 0/false/off/no -> False (any case, spaces ignored), else None."""
    v = value.strip().lower()
    return True if v in _TRUE else False if v in _FALSE else None


def env_flag(name: str, default: bool) -> bool:
    """Read a boolean environment switch: 1/true/on/yes or 0/false/off/no (any case).

    Unset or blank gives `default`; anything else is a ValueError naming the variable.
    """
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    flag = parse_flag(raw)
    if flag is None:
        raise ValueError(f"environment variable {name}={raw!r}: expected one of {'/'.join(_TRUE + _FALSE)}")
    return flag


def env_value_or_off(name: str) -> str | None:
    """A variable that is a value or a switch: None where it says off (0/false/off/no), else its
    stripped value ("" when unset or blank: the caller's default)."""
    raw = os.environ.get(name, "").strip()
    return None if parse_flag(raw) is False else raw


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
