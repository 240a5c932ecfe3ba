"""A GGUF's header and metadata checked in Python before llama.cpp reads the file.

llama.cpp's own reader rejects most damaged files cleanly, but some inputs reach a
``GGML_ASSERT`` and abort the process (found by scripts/fuzz_gguf.py: a vocabulary with a
repeated token). :func:`check_gguf` walks the header and the key/value section with bounds
checks and refuses those inputs with a :class:`ValueError` that says what is wrong; the tensor
infos and the data are left to llama.cpp, which checks them.
"""

from __future__ import annotations

import mmap
import struct
from pathlib import Path

__all__ = ["check_gguf"]

_SCALAR = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9
_MAX_COUNT = 1 << 40  # no real GGUF has more metadata entries or array elements than this


class _Reader:
    """Bounds-checked little-endian reads over a memory map."""

    def __init__(self, buf: mmap.mmap | bytes) -> None:
        self.buf, self.pos, self.size = buf, 0, len(buf)

    def take(self, n: int, what: str) -> int:
        if n < 0 or self.pos + n > self.size:
            raise ValueError(f"{what} runs past the end of the file (offset {self.pos}, {n} bytes, size {self.size})")
        p = self.pos
        self.pos += n
        return p

    def u(self, fmt: str, what: str) -> int:
        return struct.unpack_from(fmt, self.buf, self.take(struct.calcsize(fmt), what))[0]

    def string(self, what: str, *, keep: bool = False) -> bytes | None:
        n = self.u("<Q", what + " length")
        p = self.take(n, what)
        return bytes(self.buf[p : p + n]) if keep else None


def _skip_value(r: _Reader, vtype: int, key: str, *, keep: bool) -> list[bytes] | None:
    """Skip (or with keep=True collect the strings of) one value of type `vtype`."""
    if vtype in _SCALAR:
        r.take(struct.calcsize(_SCALAR[vtype]), key)
        return None
    if vtype == _STRING:
        s = r.string(key, keep=keep)
        return [s] if s is not None else None
    if vtype != _ARRAY:
        raise ValueError(f"metadata {key!r}: unknown value type {vtype}")
    etype = r.u("<I", key + " element type")
    n = r.u("<Q", key + " element count")
    if n > _MAX_COUNT:
        raise ValueError(f"metadata {key!r}: absurd array length {n}")
    if etype in _SCALAR:
        r.take(n * struct.calcsize(_SCALAR[etype]), key)
        return [b""] * 0 if not keep else [b""] * n  # only the length matters to the caller
    if etype == _STRING:
        return _strings(r, n, key, keep)
    raise ValueError(f"metadata {key!r}: arrays of type {etype} are not allowed")


_U64 = struct.Struct("<Q").unpack_from


def _strings(r: _Reader, n: int, key: str, keep: bool) -> list[bytes] | None:
    """n length-prefixed strings (the hot loop: 150k-token vocabularies and merges)."""
    buf, pos, size = r.buf, r.pos, r.size
    out: list[bytes] = []
    for _ in range(n):
        if pos + 8 > size:
            raise ValueError(f"metadata {key!r} runs past the end of the file")
        end = pos + 8 + _U64(buf, pos)[0]
        if end > size:
            raise ValueError(f"metadata {key!r}: a string runs past the end of the file")
        if keep:
            out.append(buf[pos + 8 : end])
        pos = end
    r.pos = pos
    return out if keep else None


def check_gguf(path: Path) -> None:
    """Raise ValueError naming the problem if the GGUF header/metadata would crash llama.cpp."""
    with open(path, "rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as buf:
        r = _Reader(buf)
        if r.take(4, "magic") != 0 or bytes(buf[0:4]) != b"GGUF":
            raise ValueError("not a GGUF file")
        version = r.u("<I", "version")
        if version not in (2, 3):
            raise ValueError(f"unsupported GGUF version {version} (llama.cpp reads 2 and 3)")
        n_tensors = r.u("<Q", "tensor count")
        n_kv = r.u("<Q", "metadata count")
        if n_tensors > _MAX_COUNT or n_kv > _MAX_COUNT or n_kv > r.size:
            raise ValueError(f"absurd counts: {n_tensors} tensors, {n_kv} metadata entries in a {r.size}-byte file")
        lengths: dict[str, int] = {}
        tokens: list[bytes] = []
        for _ in range(n_kv):
            raw = r.string("metadata key", keep=True) or b""
            try:
                key = raw.decode("utf-8")
            except UnicodeDecodeError:
                raise ValueError(f"metadata key {raw[:40]!r} is not valid UTF-8") from None
            vtype = r.u("<I", f"metadata {key!r} type")
            want = key in ("tokenizer.ggml.tokens", "tokenizer.ggml.scores", "tokenizer.ggml.token_type")
            vals = _skip_value(r, vtype, key, keep=want)
            if want and vals is not None:
                lengths[key] = len(vals)
                if key == "tokenizer.ggml.tokens":
                    tokens = vals
        _check_vocab(tokens, lengths)


def _check_vocab(tokens: list[bytes], lengths: dict[str, int]) -> None:
    """llama.cpp asserts every token text is distinct (llama-vocab.cpp) and indexes scores and
    token types by token id."""
    if not tokens:
        return
    if len(set(tokens)) != len(tokens):
        seen: set[bytes] = set()
        dup = next(t for t in tokens if t in seen or seen.add(t))  # type: ignore[func-returns-value]
        raise ValueError(f"vocabulary: token {dup[:40]!r} appears more than once")
    for key in ("tokenizer.ggml.scores", "tokenizer.ggml.token_type"):
        if key in lengths and lengths[key] != len(tokens):
            raise ValueError(f"{key} has {lengths[key]} entries for {len(tokens)} tokens")
