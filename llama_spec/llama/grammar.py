"""Grammars: llama.cpp's JSON-schema converter, and a grammar state a drafter can advance.

* :func:`json_schema_to_grammar` turns a JSON schema into GBNF with llama.cpp's own converter
  (``common/json-schema-to-grammar.cpp``, through the shim) — what ``--json-schema`` does in
  llama.cpp's tools. A schema it cannot convert raises ``ValueError`` (never aborts).
* :class:`GrammarState` owns one llama.cpp grammar sampler. ``TargetSampler.grammar_clone()``
  hands a drafter a copy of the target's grammar state at the start of a draft; the drafter masks
  its q with it and advances it by each token it drafts, so p and q are both grammar-masked and
  the rejection rules stay exact under a grammar (docs/design.md invariant 3).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import numpy as np

from .._ffi import ffi, lib
from .._handle import NativeHandle

__all__ = ["GrammarState", "json_schema_to_grammar"]

_OUT_CAP = 1 << 16  # first try; a longer grammar is fetched with a second call of the right size


def json_schema_to_grammar(schema: str | Mapping[str, Any] | bool) -> str:
    """GBNF for a JSON schema (JSON text, or a decoded dict / bool schema), by llama.cpp's converter.

    Raises ValueError naming `schema` when it is not JSON or the converter rejects it.
    """
    if isinstance(schema, bool | Mapping):
        text = json.dumps(schema)
    elif isinstance(schema, str):
        text = schema
    else:
        raise TypeError(f"schema must be a JSON string or a dict, got {type(schema).__name__}")
    if "\x00" in text:
        raise ValueError("schema contains a NUL character")
    if not text.strip():
        raise ValueError("schema is empty")
    raw = text.encode("utf-8", errors="strict")
    cap = _OUT_CAP
    for _ in range(2):
        out = ffi.new("char[]", cap)
        n = lib.lsp_json_schema_to_grammar(raw, out, cap)
        if n < 0:
            raise ValueError(f"schema: {ffi.string(out).decode('utf-8', errors='replace')}")
        if n < cap:
            return str(ffi.string(out, n).decode("utf-8"))
        cap = n + 1
    raise RuntimeError("json_schema_to_grammar: the grammar changed length between two calls")


class GrammarState(NativeHandle):
    """One llama.cpp grammar sampler (owned): mask candidates, test tokens, accept a token.

    ``accept`` must only get a token the grammar allows now (llama.cpp aborts otherwise), so it
    checks first and raises ValueError; a drafter only accepts tokens it drew from a masked q.
    Freed once by ``close()`` (idempotent; also the context manager and the finalizer); any
    use after that raises ValueError.
    """

    _kind = "GrammarState"
    _SMALL = 256  # the small candidate array `allowed` works on, grown when needed

    def __init__(self, ptr: Any) -> None:
        if ptr == ffi.NULL:
            raise ValueError("no grammar sampler")
        self._adopt(ptr)
        self._buf = ffi.new("llama_token_data[]", self._SMALL)
        self._cap = self._SMALL
        self._cur = ffi.new("llama_token_data_array *")

    def _free(self, ptr: Any) -> None:
        lib.llama_sampler_free(ptr)

    def clone(self) -> GrammarState:
        return GrammarState(lib.llama_sampler_clone(self.ptr))

    def apply(self, cur: Any) -> None:
        """Set the logit of every token the grammar forbids now to -inf in `cur`
        (a llama_token_data_array *)."""
        lib.llama_sampler_apply(self.ptr, cur)

    def allowed(self, ids: np.ndarray) -> np.ndarray:
        """bool (n,): which of the token ids (int32 (n,)) the grammar allows as the next token."""
        ptr = self.ptr
        n = len(ids)
        if n > self._cap:
            self._cap = max(n, 2 * self._cap)
            self._buf = ffi.new("llama_token_data[]", self._cap)
        for i, t in enumerate(ids.tolist()):
            self._buf[i].id, self._buf[i].logit, self._buf[i].p = t, 0.0, 0.0
        cur = self._cur
        cur.data, cur.size, cur.selected, cur.sorted = self._buf, n, -1, False
        lib.llama_sampler_apply(ptr, cur)
        return np.array([self._buf[i].logit != float("-inf") for i in range(n)], dtype=bool)

    def accept(self, token: int) -> None:
        """Advance the grammar by `token` (ValueError if the grammar does not allow it now)."""
        if not self.allowed(np.array([token], dtype=np.int32))[0]:
            raise ValueError(f"token {token} is not allowed by the grammar here")
        lib.llama_sampler_accept(self.ptr, int(token))
