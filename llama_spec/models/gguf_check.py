"""A GGUF's header and metadata checked in Python before llama.cpp reads the file.

llama.cpp's own reader rejects most damaged files cleanly, but some inputs reach a
``GGML_ASSERT`` and abort the process (found by scripts/fuzz_gguf.py: a vocabulary with a
repeated token). :func:`check_gguf` walks the header and the key/value section with bounds
checks and refuses those inputs with a :class:`ValueError` that says what is wrong; the tensor
infos and the data are left to llama.cpp, which checks them.

Checked files are remembered (the walk of a 151k-token vocabulary and its merges: ~95 ms per Qwen
model in a fresh process on 2 AVX2 EPYC cores, 13-18 ms remembered, scripts/bench_gguf_check.py):
a file whose first bytes, up to the end of its metadata, hash as they did when it passed is not
walked again. The hash is of exactly the bytes the
check reads, so a file changed in place (same size, same second) is checked again.
``LLAMA_SPEC_GGUF_CHECK_CACHE``: unset, ``~/.cache/llama-spec/gguf-checked.json``; ``0`` / ``off``:
none; anything else: that file. A cache that cannot be read or written is ignored.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import mmap
import struct
from pathlib import Path

from ..env import env_value_or_off
from .registry import atomic_write_text

__all__ = ["ENV_GGUF_CHECK_CACHE", "check_gguf"]

ENV_GGUF_CHECK_CACHE = "LLAMA_SPEC_GGUF_CHECK_CACHE"
_MAX_REMEMBERED = 64   # files passed (the oldest forgotten first)

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
        cache, key = _cache_file(), str(Path(path).resolve())
        seen = _load(cache)
        entry = seen.get(key)
        if isinstance(entry, list) and len(entry) == 3 and entry[0] == len(buf) and _digest(buf, entry[1]) == entry[2]:
            return
        end = _walk(buf)
        if cache is not None:
            seen.pop(key, None)
            seen[key] = [len(buf), end, _digest(buf, end)]
            _save(cache, dict(list(seen.items())[-_MAX_REMEMBERED:]))


def _walk(buf: mmap.mmap) -> int:
    """The checks; returns the offset where the metadata ends (the bytes they read: [0, offset))."""
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
    return r.pos


# -- files that passed ------------------------------------------------------------------------------
def _cache_file() -> Path | None:
    raw = env_value_or_off(ENV_GGUF_CHECK_CACHE)
    if raw is None:
        return None
    return Path(raw).expanduser() if raw else Path.home() / ".cache" / "llama-spec" / "gguf-checked.json"


def _digest(buf: mmap.mmap, end: object) -> str:
    if not isinstance(end, int) or not 0 < end <= len(buf):
        return ""
    return hashlib.blake2b(buf[:end], digest_size=20).hexdigest()


def _load(cache: Path | None) -> dict[str, object]:
    if cache is None:
        return {}
    try:
        data = json.loads(cache.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _save(cache: Path, seen: dict[str, object]) -> None:
    with contextlib.suppress(OSError):   # (not written: the next run walks again)
        cache.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(cache, json.dumps(seen))


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
