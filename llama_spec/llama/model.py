"""Model: a loaded GGUF - vocabulary, tokenization, metadata, shape, devices, split mode."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from .. import rpc as _rpc
from .._ffi import clear_recent_errors, ensure_init, ffi, lib, recent_errors
from .._handle import NativeHandle
from ..errors import ModelLoadError
from ..models.gguf_check import check_gguf
from ..types import SplitMode
from . import devices as _backends

__all__ = ["LOAD_MODES", "Model"]


def _check_gguf_file(path: Path) -> None:
    """Cheap checks before llama.cpp sees the file, so the common mistakes read well."""
    if not path.exists():
        raise ModelLoadError(str(path), "no such file")
    if not path.is_file():
        raise ModelLoadError(str(path), "not a regular file")
    size = path.stat().st_size
    if size < 24:
        raise ModelLoadError(str(path), f"file too small for a GGUF header ({size} bytes)")
    with open(path, "rb") as fh:
        magic = fh.read(4)
    if magic != b"GGUF":
        raise ModelLoadError(str(path), f"not a GGUF file (magic {magic!r}, expected b'GGUF')")
    try:  # header and metadata, so inputs that would abort inside llama.cpp raise here instead
        check_gguf(path)
    except ValueError as e:
        raise ModelLoadError(str(path), str(e)) from None


_PIECE_CAP = 64  # first try for one token's bytes; a longer piece is fetched again at its size

# llama.cpp's -lm/--load-mode values (common/arg.cpp); --no-mmap is "none", --mlock "mmap+mlock".
LOAD_MODES = {
    "auto": lib.LLAMA_LOAD_MODE_AUTO, "none": lib.LLAMA_LOAD_MODE_NONE, "mmap": lib.LLAMA_LOAD_MODE_MMAP,
    "mlock": lib.LLAMA_LOAD_MODE_MLOCK, "mmap+mlock": lib.LLAMA_LOAD_MODE_MMAP_MLOCK,
}


class Model(NativeHandle):
    """A GGUF model loaded by llama.cpp.

    Parameters follow llama.cpp's names: ``n_gpu_layers`` (-1 = all, ignored on CPU builds),
    ``split_mode`` ("none" | "layer" | "row" | "tensor"), ``tensor_split`` (one non-negative
    weight per device), ``main_gpu``, ``devices`` (device names from :func:`llama_spec.devices`),
    ``rpc_servers`` ("host:port" of running rpc-servers, registered first), ``use_mmap``,
    ``load_mtp`` (also load the MTP/nextn head, needed for an :class:`MtpContext`).
    """

    _kind = "Model"
    _free_rank = 1  # freed after its contexts when both wait in the RPC free queue

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        n_gpu_layers: int = -1,
        split_mode: SplitMode = "layer",
        tensor_split: Sequence[float] | None = None,
        main_gpu: int = 0,
        devices: Sequence[str] | None = None,
        rpc_servers: Sequence[str] | None = None,
        use_mmap: bool = True,
        load_mtp: bool = False,
        vocab_only: bool = False,
        repack: bool = True,
        load_mode: str | None = None,
    ) -> None:
        if not isinstance(path, (str, os.PathLike)):
            raise TypeError(f"path must be a str or os.PathLike, got {type(path).__name__}")
        if load_mode is not None and load_mode not in LOAD_MODES:
            raise ValueError(f"load_mode {load_mode!r}: expected one of {', '.join(LOAD_MODES)}")
        if isinstance(n_gpu_layers, bool) or not isinstance(n_gpu_layers, int) or not -1 <= n_gpu_layers <= 1 << 16:
            raise ValueError(f"n_gpu_layers must be an int in [-1, 65536], got {n_gpu_layers!r}")
        if isinstance(main_gpu, bool) or not isinstance(main_gpu, int) or not 0 <= main_gpu < 1024:
            raise ValueError(f"main_gpu must be an int in [0, 1024), got {main_gpu!r}")
        self.path = Path(path)
        _check_gguf_file(self.path)
        ensure_init()  # the backends and the log hook, once per process (import does no work)
        placement = _backends.place_model(split_mode=split_mode, tensor_split=tensor_split, main_gpu=main_gpu,
                                          devices=devices, rpc_servers=rpc_servers)
        params = lib.llama_model_default_params()
        params.n_gpu_layers = int(n_gpu_layers)
        # load_mode (llama.cpp's -lm) wins over the older use_mmap switch
        params.load_mode = (LOAD_MODES[load_mode] if load_mode is not None
                            else lib.LLAMA_LOAD_MODE_MMAP if use_mmap else lib.LLAMA_LOAD_MODE_NONE)
        params.load_mtp = bool(load_mtp)
        params.vocab_only = bool(vocab_only)
        # llama.cpp's CPU weight repacking (extra buffer types): faster, but its batched GEMM and
        # single-row GEMV kernels round differently, so logits of a token can differ in the last
        # bits between a batch of k+1 and a batch of 1 (llama.cpp's `--no-repack` turns it off).
        params.use_extra_bufts = bool(repack)
        keep = placement.apply(params)  # noqa: F841 - cffi arrays must outlive the load call

        clear_recent_errors()
        path_b = os.fsencode(self.path)
        if placement.rpc_endpoints:  # a server lost while the weights upload raises, not aborts
            ptr = _rpc.call_guarded(lib.llama_model_load_from_file, path_b, params)
        else:
            ptr = lib.llama_model_load_from_file(path_b, params)
        if ptr == ffi.NULL:
            reason = "; ".join(recent_errors()) or "llama.cpp returned no model"
            raise ModelLoadError(str(self.path), reason)
        self._adopt(ptr, placement.rpc_endpoints)
        self._vocab = lib.llama_model_get_vocab(ptr)
        self.n_vocab = int(lib.llama_vocab_n_tokens(self._vocab))
        self.n_embd = int(lib.llama_model_n_embd(ptr))
        self.n_embd_out = int(lib.llama_model_n_embd_out(ptr))
        self.n_layer = int(lib.llama_model_n_layer(ptr))
        self.n_layer_nextn = int(lib.llama_model_n_layer_nextn(ptr))
        self.n_ctx_train = int(lib.llama_model_n_ctx_train(ptr))
        self.load_mtp = bool(load_mtp)
        self.repack = bool(repack)
        self.split_mode: SplitMode = split_mode
        self.tensor_split = placement.tensor_split
        # token -> bytes, filled on first use. Every C call writes into a buffer of its own call:
        # the GIL is released while llama.cpp runs, so threads sharing a Model must never share one.
        self._piece_cache: dict[tuple[int, bool], bytes] = {}

    @classmethod
    def from_pretrained(cls, repo_id: str, filename: str | None = None, *, revision: str | None = None,
                        cache_dir: str | os.PathLike[str] | None = None, **kwargs: Any) -> Model:
        """Download (or find in the HF cache) a GGUF from the Hugging Face hub and load it.

        ``filename`` is a glob (``"*q4_k_m.gguf"``), a quant tag or a file name (see
        :mod:`llama_spec.models.hub`); ``HF_HUB_OFFLINE=1`` is honoured. Other keyword arguments go
        to :class:`Model`.
        """
        from ..models.hub import download_gguf

        return cls(download_gguf(repo_id, filename, revision=revision, cache_dir=cache_dir), **kwargs)

    def _free(self, ptr: Any) -> None:
        lib.llama_model_free(ptr)

    @property
    def vocab_ptr(self) -> Any:
        self._check_usable()
        return self._vocab

    # -- description -------------------------------------------------------------------------
    def __repr__(self) -> str:
        return f"Model({str(self.path)!r}, n_vocab={self.n_vocab}, n_layer={self.n_layer}, n_layer_nextn={self.n_layer_nextn})"

    @property
    def description(self) -> str:
        buf = ffi.new("char[]", 256)
        lib.llama_model_desc(self.ptr, buf, 256)
        return ffi.string(buf).decode("utf-8", "replace")

    @property
    def size_bytes(self) -> int:
        return int(lib.llama_model_size(self.ptr))

    @property
    def n_params(self) -> int:
        return int(lib.llama_model_n_params(self.ptr))

    @property
    def is_recurrent(self) -> bool:
        return bool(lib.llama_model_is_recurrent(self.ptr))

    @property
    def is_hybrid(self) -> bool:
        return bool(lib.llama_model_is_hybrid(self.ptr))

    def metadata(self) -> dict[str, str]:
        """All GGUF key/values as llama.cpp renders them (arrays are summarised by llama.cpp)."""
        out = {}
        kbuf = ffi.new("char[]", 512)
        for i in range(lib.llama_model_meta_count(self.ptr)):
            lib.llama_model_meta_key_by_index(self.ptr, i, kbuf, 512)
            n = lib.llama_model_meta_val_str_by_index(self.ptr, i, ffi.NULL, 0)
            vbuf = ffi.new("char[]", max(n, 0) + 1)
            lib.llama_model_meta_val_str_by_index(self.ptr, i, vbuf, n + 1)
            out[ffi.string(kbuf).decode("utf-8", "replace")] = ffi.string(vbuf).decode("utf-8", "replace")
        return out

    def meta(self, key: str) -> str | None:
        n = lib.llama_model_meta_val_str(self.ptr, key.encode(), ffi.NULL, 0)
        if n < 0:
            return None
        buf = ffi.new("char[]", n + 1)
        lib.llama_model_meta_val_str(self.ptr, key.encode(), buf, n + 1)
        return ffi.string(buf).decode("utf-8", "replace")

    @property
    def chat_template(self) -> str | None:
        """The GGUF's `tokenizer.chat_template` (untrusted input: render it sandboxed)."""
        p = lib.llama_model_chat_template(self.ptr, ffi.NULL)
        return None if p == ffi.NULL else ffi.string(p).decode("utf-8", "replace")

    def devices(self) -> list[_backends.Device]:
        """Devices this model's layers were placed on."""
        ptr = self.ptr
        return [_backends.describe(lib.lsp_model_get_device(ptr, i)) for i in range(lib.lsp_model_n_devices(ptr))]

    # -- special tokens ----------------------------------------------------------------------
    def _tok(self, t: int) -> int | None:
        return None if t < 0 else int(t)

    @property
    def token_bos(self) -> int | None:
        return self._tok(lib.llama_vocab_bos(self.vocab_ptr))

    @property
    def token_eos(self) -> int | None:
        return self._tok(lib.llama_vocab_eos(self.vocab_ptr))

    @property
    def token_eot(self) -> int | None:
        return self._tok(lib.llama_vocab_eot(self.vocab_ptr))

    @property
    def token_nl(self) -> int | None:
        return self._tok(lib.llama_vocab_nl(self.vocab_ptr))

    @property
    def add_bos(self) -> bool:
        return bool(lib.llama_vocab_get_add_bos(self.vocab_ptr))

    def is_eog(self, token: int) -> bool:
        """End of generation (EOS, EOT, ...)."""
        return bool(lib.llama_vocab_is_eog(self.vocab_ptr, int(token)))

    @property
    def eog_tokens(self) -> tuple[int, ...]:
        """Every end-of-generation token id (llama.cpp's EOG set), computed once."""
        eog = getattr(self, "_eog_tokens", None)
        if eog is None:
            eog = tuple(t for t in range(self.n_vocab) if lib.llama_vocab_is_eog(self.vocab_ptr, t))
            self._eog_tokens = eog
        return eog

    def is_control(self, token: int) -> bool:
        return bool(lib.llama_vocab_is_control(self.vocab_ptr, int(token)))

    def token_text(self, token: int) -> str:
        self._check_token(token)
        return ffi.string(lib.llama_vocab_get_text(self.vocab_ptr, int(token))).decode("utf-8", "replace")

    # -- tokenization ------------------------------------------------------------------------
    def _check_token(self, token: int) -> None:
        if isinstance(token, bool) or not isinstance(token, (int, np.integer)):
            raise TypeError(f"token must be an int, got {type(token).__name__}")
        if not 0 <= int(token) < self.n_vocab:
            raise ValueError(f"token {token} out of range [0, {self.n_vocab})")

    def tokenize(self, text: str | bytes, *, add_special: bool = True, parse_special: bool = False) -> list[int]:
        """Text -> token ids (BOS added when the model wants it and `add_special`). Thread-safe."""
        vocab = self.vocab_ptr
        if not isinstance(text, (str, bytes, bytearray)):
            raise TypeError(f"text must be str or bytes, got {type(text).__name__}")
        try:
            data = text.encode("utf-8") if isinstance(text, str) else bytes(text)
        except UnicodeEncodeError as e:  # a lone surrogate has no UTF-8 form
            raise ValueError(f"text is not encodable as UTF-8 at index {e.start}: {e.reason}") from None
        n_max = len(data) + 8
        buf = ffi.new("llama_token[]", n_max)
        n = lib.llama_tokenize(vocab, data, len(data), buf, n_max, add_special, parse_special)
        if n < 0:
            n_max = -n
            buf = ffi.new("llama_token[]", n_max)
            n = lib.llama_tokenize(vocab, data, len(data), buf, n_max, add_special, parse_special)
        if n < 0:
            raise ValueError(f"tokenization failed (code {n})")
        return list(ffi.unpack(buf, n))

    def token_to_piece(self, token: int, *, special: bool = False) -> bytes:
        """One token's bytes (may be part of a UTF-8 character). Thread-safe (cached per model)."""
        key = (token, special)  # int(token) only after the check: a float/huge value must not reach C
        piece = self._piece_cache.get(key)
        if piece is not None:
            return piece
        self._check_token(token)
        key = (int(token), bool(special))
        vocab = self.vocab_ptr
        buf = ffi.new("char[]", _PIECE_CAP)  # this call's own: see __init__
        n = lib.llama_token_to_piece(vocab, int(token), buf, _PIECE_CAP, 0, special)
        if n < 0:
            buf = ffi.new("char[]", -n)
            n = lib.llama_token_to_piece(vocab, int(token), buf, -n, 0, special)
        piece = bytes(ffi.unpack(buf, n))
        self._piece_cache[key] = piece
        return piece

    def detokenize(self, tokens: Sequence[int], *, remove_special: bool = False, unparse_special: bool = False) -> str:
        """Token ids -> text (invalid UTF-8 replaced). Thread-safe."""
        vocab = self.vocab_ptr
        for t in tokens:
            self._check_token(t)
        toks = [int(t) for t in tokens]
        arr = ffi.new("llama_token[]", toks) if toks else ffi.NULL
        cap = max(16, 8 * len(toks) + 16)
        buf = ffi.new("char[]", cap)
        n = lib.llama_detokenize(vocab, arr, len(toks), buf, cap, remove_special, unparse_special)
        if n < 0:
            cap = -n + 1
            buf = ffi.new("char[]", cap)
            n = lib.llama_detokenize(vocab, arr, len(toks), buf, cap, remove_special, unparse_special)
        return ffi.unpack(buf, n).decode("utf-8", "replace")

    def apply_builtin_chat_template(self, messages: Sequence[Mapping[str, str]], *, add_generation_prompt: bool = True,
                                    template: str | None = None) -> str:
        """llama.cpp's own (non-jinja) template rendering: the reference for chat tests."""
        tmpl = template if template is not None else self.chat_template
        keep = [(m["role"].encode(), m["content"].encode()) for m in messages]
        cstrs = [(ffi.new("char[]", r), ffi.new("char[]", c)) for r, c in keep]  # alive for the call
        msgs = ffi.new("llama_chat_message[]", len(keep))
        for i, (r, c) in enumerate(cstrs):
            msgs[i].role = r
            msgs[i].content = c
        t = tmpl.encode() if tmpl is not None else ffi.NULL
        cap = 4096 + sum(len(c) + len(r) for r, c in keep) * 2
        buf = ffi.new("char[]", cap)
        n = lib.llama_chat_apply_template(t, msgs, len(keep), add_generation_prompt, buf, cap)
        if n < 0:
            raise ValueError("llama.cpp does not support this chat template natively")
        if n > cap:
            buf = ffi.new("char[]", n + 1)
            n = lib.llama_chat_apply_template(t, msgs, len(keep), add_generation_prompt, buf, n + 1)
        return ffi.unpack(buf, n).decode("utf-8", "replace")
