"""Model: a loaded GGUF - vocabulary, tokenization, metadata, shape, devices, split mode."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from . import backends as _devices
from . import rpc as _rpc
from ._ffi import clear_recent_errors, ffi, lib, recent_errors
from .errors import ModelLoadError

SPLIT_MODES = {
    "none": lib.LLAMA_SPLIT_MODE_NONE,
    "layer": lib.LLAMA_SPLIT_MODE_LAYER,
    "row": lib.LLAMA_SPLIT_MODE_ROW,
    "tensor": lib.LLAMA_SPLIT_MODE_TENSOR,
}


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


class Model:
    """A GGUF model loaded by llama.cpp.

    Parameters follow llama.cpp's names: ``n_gpu_layers`` (-1 = all, ignored on CPU builds),
    ``split_mode`` ("none" | "layer" | "row" | "tensor"), ``tensor_split`` (one non-negative
    weight per device), ``main_gpu``, ``devices`` (device names from :func:`llama_spec.devices`),
    ``rpc_servers`` ("host:port" of running rpc-servers, registered first), ``use_mmap``,
    ``load_mtp`` (also load the MTP/nextn head, needed for an :class:`MtpContext`).
    """

    def __init__(
        self,
        path: str | os.PathLike,
        *,
        n_gpu_layers: int = -1,
        split_mode: str = "layer",
        tensor_split: Sequence[float] | None = None,
        main_gpu: int = 0,
        devices: Sequence[str] | None = None,
        rpc_servers: Sequence[str] | None = None,
        use_mmap: bool = True,
        load_mtp: bool = False,
        vocab_only: bool = False,
        repack: bool = True,
    ) -> None:
        self._ptr = ffi.NULL
        self.path = Path(path)
        _check_gguf_file(self.path)
        if split_mode not in SPLIT_MODES:
            raise ValueError(f"split_mode {split_mode!r}: expected one of {', '.join(SPLIT_MODES)}")
        self.rpc_endpoints: tuple[str, ...] = ()
        ts = None
        if tensor_split is not None:
            ts = [float(x) for x in tensor_split]
            if any(not np.isfinite(x) or x < 0 for x in ts):
                raise ValueError(f"tensor_split {ts}: weights must be finite and non-negative")
            if not any(ts):
                raise ValueError(f"tensor_split {ts}: at least one weight must be positive")
            if len(ts) > lib.llama_max_devices():
                raise ValueError(f"tensor_split longer than llama_max_devices() = {lib.llama_max_devices()}")
        if isinstance(rpc_servers, str) or isinstance(devices, str):
            raise TypeError("rpc_servers and devices are lists of strings (e.g. rpc_servers=['127.0.0.1:50052'])")
        rpc_devs: list[str] = []
        for ep in rpc_servers or ():
            rpc_devs += _devices.add_rpc_server(ep)

        params = lib.llama_model_default_params()
        params.n_gpu_layers = int(n_gpu_layers)
        params.split_mode = SPLIT_MODES[split_mode]
        params.main_gpu = int(main_gpu)
        params.load_mode = lib.LLAMA_LOAD_MODE_MMAP if use_mmap else lib.LLAMA_LOAD_MODE_NONE
        params.load_mtp = bool(load_mtp)
        params.vocab_only = bool(vocab_only)
        # llama.cpp's CPU weight repacking (extra buffer types): faster, but its batched GEMM and
        # single-row GEMV kernels round differently, so logits of a token can differ in the last
        # bits between a batch of k+1 and a batch of 1 (llama.cpp's `--no-repack` turns it off).
        params.use_extra_bufts = bool(repack)

        # cffi memory must outlive the load call: keep references on self.
        if devices is not None:
            dev_names = list(devices)
        elif _rpc.registered_endpoints():
            # llama.cpp's default selection takes every RPC device registered in the process
            # (first); a model uses only the servers it names - the others may serve other
            # models, or be gone. Local GPUs are added as llama.cpp would.
            dev_names = rpc_devs + _devices.local_offload_devices()
        else:
            dev_names = None
        if dev_names is not None:
            handles = [_devices.device_handle(n) for n in dev_names]
            self._dev_arr = ffi.new("ggml_backend_dev_t[]", [*handles, ffi.NULL])
            params.devices = self._dev_arr
            self.rpc_endpoints = tuple(dict.fromkeys(
                ep for n in dev_names if (ep := _devices.rpc_endpoint_of(n)) is not None))
        n_dev = len(dev_names) if dev_names is not None else self._n_offload_devices()
        if ts is not None:
            if len(ts) > max(n_dev, 1):
                raise ValueError(
                    f"tensor_split has {len(ts)} entries but only {max(n_dev, 1)} device(s) can hold layers"
                    + (f" ({', '.join(dev_names)}; the CPU is not one of them)" if dev_names else "")
                )
            self._ts_arr = ffi.new("float[]", ts + [0.0] * (lib.llama_max_devices() - len(ts)))
            params.tensor_split = self._ts_arr
        if main_gpu < 0 or (n_dev and main_gpu >= max(n_dev, 1)):
            raise ValueError(f"main_gpu={main_gpu} out of range for {max(n_dev, 1)} device(s)")
        for ep in self.rpc_endpoints:
            # ggml-rpc aborts the process when it cannot connect, and waits forever on a server
            # busy with another client: check each server answers before llama.cpp talks to it
            ok, why = _rpc.endpoint_usable(ep)
            if not ok:
                raise _rpc.RpcConnectionError(ep, f"cannot be used: {why}")

        clear_recent_errors()
        path_b = os.fsencode(self.path)
        if self.rpc_endpoints:  # a server lost while the weights upload raises, not aborts
            ptr = _rpc.call_guarded(lib.llama_model_load_from_file, path_b, params)
        else:
            ptr = lib.llama_model_load_from_file(path_b, params)
        if ptr == ffi.NULL:
            reason = "; ".join(recent_errors()) or "llama.cpp returned no model"
            raise ModelLoadError(str(self.path), reason)
        self._ptr = ptr
        self._vocab = lib.llama_model_get_vocab(ptr)
        self.n_vocab = int(lib.llama_vocab_n_tokens(self._vocab))
        self.n_embd = int(lib.llama_model_n_embd(ptr))
        self.n_embd_out = int(lib.llama_model_n_embd_out(ptr))
        self.n_layer = int(lib.llama_model_n_layer(ptr))
        self.n_layer_nextn = int(lib.llama_model_n_layer_nextn(ptr))
        self.n_ctx_train = int(lib.llama_model_n_ctx_train(ptr))
        self.load_mtp = bool(load_mtp)
        self.split_mode = split_mode
        self.tensor_split = list(tensor_split) if tensor_split is not None else None
        self._piece_buf = ffi.new("char[]", 256)
        self._piece_cache: dict[tuple[int, bool], bytes] = {}

    @classmethod
    def from_pretrained(cls, repo_id: str, filename: str | None = None, **kwargs) -> Model:
        """Download (or find in the HF cache) a GGUF from the Hugging Face hub and load it.

        ``filename`` is a glob (``"*q4_k_m.gguf"``); ``HF_HUB_OFFLINE=1`` is honoured.
        """
        from .hub import from_pretrained

        return from_pretrained(repo_id, filename, **kwargs)

    @staticmethod
    def _n_offload_devices() -> int:
        """Devices that can hold layers when none are named: GPUs and RPC devices."""
        return sum(1 for d in _devices.devices() if d.type in ("gpu", "igpu") or d.backend == "RPC")

    # -- lifetime ---------------------------------------------------------------------------
    def close(self) -> None:
        if self._ptr != ffi.NULL:
            if self.rpc_endpoints and _rpc.retire_if_unreachable(self):
                return  # its server is gone: leaked (freeing would abort), self is a LostRpcObject now
            lib.llama_model_free(self._ptr)
            self._ptr = ffi.NULL

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: BLE001 - never raise from a finalizer
            pass

    def __enter__(self) -> Model:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    @property
    def ptr(self):
        if self._ptr == ffi.NULL:
            raise ValueError("model is closed")
        return self._ptr

    @property
    def vocab_ptr(self):
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

    def devices(self) -> list[_devices.Device]:
        """Devices this model's layers were placed on."""
        return [_devices._describe(lib.lsp_model_get_device(self.ptr, i))
                for i in range(lib.lsp_model_n_devices(self.ptr))]

    # -- special tokens ----------------------------------------------------------------------
    def _tok(self, t: int) -> int | None:
        return None if t < 0 else int(t)

    @property
    def token_bos(self) -> int | None:
        return self._tok(lib.llama_vocab_bos(self._vocab))

    @property
    def token_eos(self) -> int | None:
        return self._tok(lib.llama_vocab_eos(self._vocab))

    @property
    def token_eot(self) -> int | None:
        return self._tok(lib.llama_vocab_eot(self._vocab))

    @property
    def token_nl(self) -> int | None:
        return self._tok(lib.llama_vocab_nl(self._vocab))

    @property
    def add_bos(self) -> bool:
        return bool(lib.llama_vocab_get_add_bos(self._vocab))

    def is_eog(self, token: int) -> bool:
        """End of generation (EOS, EOT, ...)."""
        return bool(lib.llama_vocab_is_eog(self._vocab, int(token)))

    def is_control(self, token: int) -> bool:
        return bool(lib.llama_vocab_is_control(self._vocab, int(token)))

    def token_text(self, token: int) -> str:
        self._check_token(token)
        return ffi.string(lib.llama_vocab_get_text(self._vocab, int(token))).decode("utf-8", "replace")

    # -- tokenization ------------------------------------------------------------------------
    def _check_token(self, token: int) -> None:
        if not 0 <= int(token) < self.n_vocab:
            raise ValueError(f"token {token} out of range [0, {self.n_vocab})")

    def tokenize(self, text: str | bytes, *, add_special: bool = True, parse_special: bool = False) -> list[int]:
        """Text -> token ids (BOS added when the model wants it and `add_special`)."""
        data = text.encode("utf-8") if isinstance(text, str) else bytes(text)
        n_max = len(data) + 8
        buf = ffi.new("llama_token[]", n_max)
        n = lib.llama_tokenize(self._vocab, data, len(data), buf, n_max, add_special, parse_special)
        if n < 0:
            n_max = -n
            buf = ffi.new("llama_token[]", n_max)
            n = lib.llama_tokenize(self._vocab, data, len(data), buf, n_max, add_special, parse_special)
        if n < 0:
            raise ValueError(f"tokenization failed (code {n})")
        return list(ffi.unpack(buf, n))

    def token_to_piece(self, token: int, *, special: bool = False) -> bytes:
        """One token's bytes (may be part of a UTF-8 character)."""
        key = (int(token), special)
        piece = self._piece_cache.get(key)
        if piece is not None:
            return piece
        self._check_token(token)
        n = lib.llama_token_to_piece(self._vocab, int(token), self._piece_buf, 256, 0, special)
        if n < 0:
            buf = ffi.new("char[]", -n)
            n = lib.llama_token_to_piece(self._vocab, int(token), buf, -n, 0, special)
            piece = ffi.unpack(buf, n)
        else:
            piece = ffi.unpack(self._piece_buf, n)
        self._piece_cache[key] = piece
        return piece

    def detokenize(self, tokens: Sequence[int], *, remove_special: bool = False, unparse_special: bool = False) -> str:
        toks = [int(t) for t in tokens]
        for t in toks:
            self._check_token(t)
        arr = ffi.new("llama_token[]", toks) if toks else ffi.NULL
        cap = max(16, 8 * len(toks) + 16)
        buf = ffi.new("char[]", cap)
        n = lib.llama_detokenize(self._vocab, arr, len(toks), buf, cap, remove_special, unparse_special)
        if n < 0:
            cap = -n + 1
            buf = ffi.new("char[]", cap)
            n = lib.llama_detokenize(self._vocab, arr, len(toks), buf, cap, remove_special, unparse_special)
        return ffi.unpack(buf, n).decode("utf-8", "replace")

    def apply_builtin_chat_template(self, messages: Sequence[dict], *, add_generation_prompt: bool = True,
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
