"""Context and MtpContext: batches in, logits and hidden rows out as numpy, memory ops, state.

Lifetime of returned arrays: ``decode`` returns **zero-copy views** over llama.cpp's output
buffers. They are valid until the next ``decode`` (or memory op / state load) on the same
context; copy them (``arr.copy()``) to keep them longer. The GIL is released while llama.cpp
decodes (cffi releases it around every C call).

Stopping a decode (every decode call, hence ``prefill``), on a context of any thread: Ctrl-C
while the main thread decodes raises ``KeyboardInterrupt`` within 2 ms and a graph node (ggml's abort
callback runs Python there at most every 2 ms, so the SIGINT handler runs); :meth:`Context.abort` (or
:func:`abort_decodes`: every decode running now) from any thread makes the decode raise
:class:`~llama_spec.errors.DecodeError` with ``code == 2`` (off the main thread the callback
only reads the context's abort flag, in C). Either way the context stays usable and its memory
is as before the call: each sequence of the stopped batch loses its positions from the batch's
first one on (llama.cpp itself drops only the ubatch it stopped in).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

import numpy as np

from .. import rpc as _rpc
from .._ffi import clear_recent_errors, ffi, lib, recent_errors
from .._handle import NativeHandle
from ..env import ENV_THREADS, default_threads  # noqa: F401 (re-exported: their old home)
from ..errors import ContextError, DecodeError
from ..types import FlashAttn, OutputsSpec
from .model import Model

__all__ = ["KV_CACHE_TYPES", "Context", "MtpContext", "abort_decodes", "check_context_args", "default_threads"]

_FLASH = {
    "auto": lib.LLAMA_FLASH_ATTN_TYPE_AUTO,
    "on": lib.LLAMA_FLASH_ATTN_TYPE_ENABLED,
    "off": lib.LLAMA_FLASH_ATTN_TYPE_DISABLED,
}


# KV cache types llama.cpp accepts for -ctk/-ctv (common/arg.cpp kv_cache_types), by ggml's names.
KV_CACHE_TYPES = {
    "f32": lib.GGML_TYPE_F32, "f16": lib.GGML_TYPE_F16, "bf16": lib.GGML_TYPE_BF16, "q8_0": lib.GGML_TYPE_Q8_0,
    "q4_0": lib.GGML_TYPE_Q4_0, "q4_1": lib.GGML_TYPE_Q4_1, "iq4_nl": lib.GGML_TYPE_IQ4_NL,
    "q5_0": lib.GGML_TYPE_Q5_0, "q5_1": lib.GGML_TYPE_Q5_1,
}
_MAX_THREADS = 1024  # llama.cpp aborts (std::bad_alloc) on absurd thread counts: refuse them here
_MAX_CTX = 1 << 24   # 16M tokens: beyond any model here; larger values only fail inside llama.cpp


_SIGNALS = threading.local()  # .pending: an exception a signal handler raised during this thread's decode
_MAIN_THREAD = threading.main_thread().ident
_FLAG_ABORT = ffi.addressof(lib, "lsp_abort_flag")  # the C abort callback: reads the flag, no Python
_MAIN_ABORT = ffi.addressof(lib, "lsp_abort_main")  # the flag, and _abort_check at most every _ABORT_PERIOD_US
_ABORT_PERIOD_US = 2000  # Ctrl-C stops a decode within 2 ms and a node; Python at each node: +5 % on a 135M decode
_decoding_lock = threading.Lock()
_decoding: set[Context] = set()  # contexts inside a native decode now (any thread), under the lock


def _abort_error(exc_type: Any, exc: BaseException | None, tb: Any) -> bool:
    # a signal handler (Ctrl-C) raised inside the callback: abort the decode, re-raise after it
    _SIGNALS.pending = exc if exc is not None else exc_type()
    return True


@ffi.callback("bool(void *)", onerror=_abort_error)  # type: ignore[untyped-decorator]
def _abort_check(data: Any) -> bool:
    """Python's part of the main thread's abort callback (lsp_abort_main calls it between graph nodes,
    at most every _ABORT_PERIOD_US): running Python code here lets a pending SIGINT handler run, so
    Ctrl-C stops a long decode within a node or two. `data` is the context's abort flag (Context.abort())."""
    return bool(ffi.cast("int32_t *", data)[0] != 0)


lib.lsp_abort_set_python(_abort_check, _ABORT_PERIOD_US)


def _take_pending_signal() -> BaseException | None:
    exc = getattr(_SIGNALS, "pending", None)
    if exc is not None:
        _SIGNALS.pending = None
    return exc


def abort_decodes() -> int:
    """Stop every decode running now, on any context and thread (each raises DecodeError code 2
    in its own thread); return how many were stopped. For a SIGINT handler or a server's
    shutdown: Ctrl-C reaches only the main thread, its decodes stop by themselves."""
    with _decoding_lock:
        for c in _decoding:
            c._abort_flag[0] = 1
        return len(_decoding)


def int32_values(values: Any, name: str, n: int | None = None) -> np.ndarray:
    """`values` as int32, (n,): TypeError for non-integers, ValueError naming `name` for a wrong
    length or a value outside int32 (numpy would raise OverflowError or wrap silently)."""
    if isinstance(values, np.ndarray) and values.dtype == np.int32:
        a = values
    else:
        try:
            a = np.asarray(values)
        except (ValueError, TypeError, OverflowError) as e:
            raise TypeError(f"{name} must be a sequence of ints ({e})") from None
        if a.size and a.dtype == object:  # ints beyond int64
            if not all(isinstance(v, int) and not isinstance(v, bool) for v in a.ravel()):
                raise TypeError(f"{name} must be a sequence of ints")
            raise ValueError(f"{name}: a value is outside int32")
        if a.size and (a.dtype.kind not in "iu"):
            raise TypeError(f"{name} must be a sequence of ints, got dtype {a.dtype}")
        if a.size and (int(a.min()) < -(2**31) or int(a.max()) > 2**31 - 1):
            raise ValueError(f"{name}: a value is outside int32")
    if a.ndim != 1 or (n is not None and len(a) != n):
        raise ValueError(f"{name} must be a 1-D sequence of {n if n is not None else ''} ints, got shape {a.shape}")
    return a


def _check_choices(**kw: tuple[Any, dict[str, Any]]) -> None:
    """ValueError naming the argument when a value is not one of its allowed names."""
    for name, (v, allowed) in kw.items():
        if not isinstance(v, str) or v not in allowed:
            raise ValueError(f"{name} {v!r}: expected one of {', '.join(allowed)}")


def check_context_args(n_ctx: int, n_batch: int, n_threads: int | None, flash_attn: FlashAttn) -> None:
    """What Context(model, n_ctx=.., n_batch=.., n_threads=.., flash_attn=..) refuses before any C call."""
    _check_context_args(n_ctx=n_ctx, n_batch=n_batch, n_threads=n_threads, n_seq_max=1)
    _check_choices(flash_attn=(flash_attn, _FLASH))


def _check_context_args(**kw: int | None) -> None:
    """ValueError/TypeError naming the argument for sizes llama.cpp would abort on (before any C call)."""
    limits = {"n_ctx": (1, _MAX_CTX), "n_batch": (1, _MAX_CTX), "n_ubatch": (1, _MAX_CTX),
              "n_threads": (1, _MAX_THREADS), "n_threads_batch": (1, _MAX_THREADS), "n_seq_max": (1, 256),
              "n_rs_seq": (0, 1024)}
    for name, v in kw.items():
        if v is None and name in ("n_ubatch", "n_threads", "n_threads_batch"):
            continue
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
            raise TypeError(f"{name} must be an int, got {type(v).__name__}")
        lo, hi = limits[name]
        if not lo <= int(v) <= hi:
            raise ValueError(f"{name} must be in [{lo}, {hi}], got {v}")
    # llama.cpp reserves max(outputs, n_seq_max) logits rows in a buffer of min(n_ctx, n_batch) rows
    # and GGML_ASSERTs (aborts) when n_seq_max is larger (found by scripts/fuzz_api.py)
    n_rows = min(int(kw["n_ctx"] or 0), int(kw["n_batch"] or 0))
    if int(kw["n_seq_max"] or 0) > n_rows:
        raise ValueError(f"n_seq_max ({kw['n_seq_max']}) must be <= min(n_ctx, n_batch) ({n_rows})")


class Context(NativeHandle):
    """A llama.cpp context on a model (one KV cache / recurrent state per sequence).

    On a model split over RPC servers every call that talks to them runs through
    :func:`llama_spec.rpc.call_guarded`; once a server is lost the context is lost with it
    (see :mod:`llama_spec._handle`) and every use raises RpcConnectionError.
    """

    _kind = "Context"
    _ctx_type = lib.LLAMA_CONTEXT_TYPE_DEFAULT
    _batch: Any = ffi.NULL
    _seq: np.ndarray | None = None   # seq id per batch row, for decode_multi (allocated on first use)
    _seq_p: Any = None

    def __init__(
        self,
        model: Model,
        *,
        n_ctx: int = 4096,
        n_batch: int = 512,
        n_ubatch: int | None = None,
        n_threads: int | None = None,
        n_threads_batch: int | None = None,
        n_seq_max: int = 1,
        n_rs_seq: int = 0,
        flash_attn: FlashAttn = "auto",
        type_k: str = "f16",
        type_v: str = "f16",
        nextn: bool = False,
        ctx_other: Context | None = None,
        kv_unified: bool = False,
    ) -> None:
        _check_context_args(n_ctx=n_ctx, n_batch=n_batch, n_ubatch=n_ubatch, n_threads=n_threads,
                            n_threads_batch=n_threads_batch, n_seq_max=n_seq_max, n_rs_seq=n_rs_seq)
        _check_choices(flash_attn=(flash_attn, _FLASH), type_k=(type_k, KV_CACHE_TYPES), type_v=(type_v, KV_CACHE_TYPES))
        self.model = model
        p = lib.llama_context_default_params()
        p.n_ctx = int(n_ctx)
        p.n_batch = int(n_batch)
        p.n_ubatch = int(n_ubatch or n_batch)
        p.n_seq_max = int(n_seq_max)
        p.n_rs_seq = int(n_rs_seq)
        p.n_threads = int(n_threads or default_threads())
        p.n_threads_batch = int(n_threads_batch or n_threads or default_threads())
        p.ctx_type = self._ctx_type
        p.flash_attn_type = _FLASH[flash_attn]
        p.type_k, p.type_v = KV_CACHE_TYPES[type_k], KV_CACHE_TYPES[type_v]
        p.no_perf = True
        self._abort_flag = ffi.new("int32_t *")  # Context.abort(); the callback is re-chosen per decode
        self._abort_main = threading.get_ident() == _MAIN_THREAD  # signals reach the main thread only
        p.abort_callback, p.abort_callback_data = _MAIN_ABORT if self._abort_main else _FLAG_ABORT, self._abort_flag
        p.kv_unified = bool(kv_unified)  # one KV buffer for all sequences: a cell can belong to several (trees)
        if ctx_other is not None:
            p.ctx_other = ctx_other.ptr
        clear_recent_errors()
        # on RPC servers: every call that talks to them runs guarded (a lost server raises
        # RpcConnectionError instead of aborting the process; see llama_spec.rpc)
        self._rpc = bool(model.rpc_endpoints)
        if self._rpc:
            _rpc.check_endpoints(model.rpc_endpoints)
            ptr = _rpc.call_guarded(lib.llama_init_from_model, model.ptr, p)
        else:
            ptr = lib.llama_init_from_model(model.ptr, p)
        if ptr == ffi.NULL:
            raise ContextError("llama.cpp could not create the context: " + ("; ".join(recent_errors()) or "unknown reason"))
        self._adopt(ptr, model.rpc_endpoints)
        self._mem = lib.llama_get_memory(ptr)
        self.n_ctx = int(lib.llama_n_ctx(ptr))
        self.n_batch = int(lib.llama_n_batch(ptr))
        self.n_rs_seq = int(lib.llama_n_rs_seq(ptr))
        self.n_seq_max = int(lib.llama_n_seq_max(ptr))
        self.n_ubatch = int(lib.llama_n_ubatch(ptr))
        self.n_threads = int(p.n_threads)
        if self.n_rs_seq > 0 and (model.is_recurrent or model.is_hybrid) and self.n_ubatch <= self.n_rs_seq + 1:
            # llama.cpp keeps the last n_rs_seq + 1 tokens of a sequence in one ubatch and
            # aborts the process on the first decode otherwise: refuse here instead.
            self.close()
            raise ValueError(
                f"n_rs_seq={self.n_rs_seq} needs n_ubatch > {self.n_rs_seq + 1}, but n_ubatch is {self.n_ubatch} "
                f"(n_ctx={self.n_ctx}, n_batch={n_batch}): raise n_ctx/n_batch or lower n_rs_seq"
            )
        self.n_vocab, self.n_embd = model.n_vocab, model.n_embd_out
        self._batch = lib.llama_batch_ext_init(ptr)
        # Preallocated input buffers: the hot path allocates nothing per decode.
        self._tok = np.zeros(self.n_batch, dtype=np.int32)
        self._pos = np.zeros(self.n_batch, dtype=np.int32)
        self._out = np.zeros(self.n_batch, dtype=np.int8)
        self._tok_p = ffi.cast("int32_t *", self._tok.ctypes.data)
        self._pos_p = ffi.cast("int32_t *", self._pos.ctypes.data)
        self._out_p = ffi.cast("int8_t *", self._out.ctypes.data)
        self.n_outputs = 0
        self._nextn = False
        if nextn:
            self.set_nextn(True, masked=False)

    # -- lifetime ---------------------------------------------------------------------------
    def _free(self, ptr: Any) -> None:
        if self._batch != ffi.NULL:
            lib.llama_batch_ext_free(self._batch)
            self._batch = ffi.NULL
        lib.llama_free(ptr)

    @property
    def _memory(self) -> Any:
        """llama.cpp's memory of this context, refused once closed or lost."""
        self._check_usable()
        return self._mem

    # -- decoding ---------------------------------------------------------------------------
    def set_nextn(self, value: bool, *, masked: bool = False) -> None:
        """Ask for the MTP (nextn) hidden rows: all batch rows (masked=False) or outputs only."""
        lib.lsp_set_embeddings_nextn(self.ptr, bool(value), bool(masked))
        self._nextn = bool(value)
        self._nextn_masked = bool(masked)

    def _fill(self, tokens: Sequence[int] | np.ndarray, positions: Sequence[int] | np.ndarray | None,
              seq_id: int, outputs: OutputsSpec | Sequence[bool] | np.ndarray | None) -> int:
        """Copy one batch into the preallocated input buffers, checking it; return its size."""
        n = len(tokens)
        if n == 0:
            raise ValueError("empty batch")
        if n > self.n_batch:
            raise ValueError(f"batch of {n} tokens exceeds n_batch={self.n_batch} (use prefill())")
        if isinstance(seq_id, bool) or not isinstance(seq_id, (int, np.integer)):
            raise TypeError(f"seq_id must be an int, got {type(seq_id).__name__}")
        if not 0 <= seq_id < self.n_seq_max:
            raise ValueError(f"seq_id {seq_id} out of range [0, {self.n_seq_max})")
        tok = self._tok[:n]
        tok[:] = int32_values(tokens, "tokens", n)
        if tok.min() < 0 or tok.max() >= self.n_vocab:
            bad = int(tok[(tok < 0) | (tok >= self.n_vocab)][0])
            raise ValueError(f"token {bad} out of range [0, {self.n_vocab})")
        pos = self._pos[:n]
        if positions is None:
            start = self.pos_max(seq_id) + 1
            pos[:] = np.arange(start, start + n, dtype=np.int32)
        else:
            pos[:] = int32_values(positions, "positions", n)
        if pos.min() < 0 or pos.max() >= self.n_ctx:
            raise ValueError(f"positions {int(pos.min())}..{int(pos.max())} outside the context [0, {self.n_ctx})")
        out = self._out[:n]
        if outputs is None or (isinstance(outputs, str) and outputs == "last"):
            out[:] = 0
            out[n - 1] = 1
        elif isinstance(outputs, str) and outputs == "all":
            out[:] = 1
        else:
            out[:] = np.asarray(outputs, dtype=bool)
        return n

    def decode(
        self,
        tokens: Sequence[int] | np.ndarray,
        positions: Sequence[int] | np.ndarray | None = None,
        seq_id: int = 0,
        outputs: OutputsSpec | Sequence[bool] | np.ndarray | None = "last",
        *,
        embd: np.ndarray | None = None,
    ) -> np.ndarray:
        """Decode one batch of `seq_id`; return logits of the output rows, shape (n_out, n_vocab).

        positions default to continuing the sequence (pos_max + 1 ...). outputs: "last",
        "all", or one flag per token. The result is a zero-copy view valid until the next
        decode on this context.
        """
        if self._ptr is None or self._lost is not None:
            self._check_usable()  # closed or lost: raise before anything reaches C
        n = self._fill(tokens, positions, seq_id, outputs)
        e_ptr = ffi.NULL
        if embd is not None:
            if embd.dtype != np.float32 or not embd.flags.c_contiguous or embd.shape != (n, self.n_embd):
                raise ValueError(f"embd must be C-contiguous float32 of shape ({n}, {self.n_embd}), got {embd.dtype} {embd.shape}")
            e_ptr = ffi.cast("float *", embd.ctypes.data)
        if self._rpc:
            rc = self._run(n, seq_id, _rpc.call_guarded, self._process_sync, n, seq_id, e_ptr,
                           on_interrupt=self.abort)
        else:
            rc = self._run(n, seq_id, lib.lsp_process, self._ptr, self._batch, self._tok_p, self._pos_p, n, seq_id,
                           self._out_p, e_ptr, self.n_embd)
        if rc <= -100:
            raise DecodeError(rc, f"adding batch row {-100 - rc}")
        if rc != 0:
            raise DecodeError(rc)
        self.n_outputs = int(self._out[:n].sum())
        return self.logits()

    def decode_multi(self, tokens: Sequence[int] | np.ndarray, positions: Sequence[int] | np.ndarray,
                     seq_ids: Sequence[int] | np.ndarray,
                     outputs: OutputsSpec | Sequence[bool] | np.ndarray = "all") -> np.ndarray:
        """Decode one batch holding many sequences (row i: tokens[i] of seq_ids[i] at positions[i]);
        return the output rows' logits in batch order, (n_out, n_vocab), a view valid until the next decode."""
        if self._ptr is None or self._lost is not None:
            self._check_usable()
        n = self._fill(tokens, positions, 0, outputs)
        if self._seq is None:
            self._seq = np.zeros(self.n_batch, dtype=np.int32)
            self._seq_p = ffi.cast("int32_t *", self._seq.ctypes.data)
        seq = self._seq[:n]
        seq[:] = seq_ids
        if seq.min() < 0 or seq.max() >= self.n_seq_max:
            raise ValueError(f"seq_ids {int(seq.min())}..{int(seq.max())} out of range [0, {self.n_seq_max})")
        args = (self._ptr, self._batch, self._tok_p, self._pos_p, n, self._seq_p, self._out_p)
        if self._rpc:
            rc = self._run(n, seq, _rpc.call_guarded, self._process_seqs_sync, args, on_interrupt=self.abort)
        else:
            rc = self._run(n, seq, lib.lsp_process_seqs, *args)
        if rc <= -100:
            raise DecodeError(rc, f"adding batch row {-100 - rc}")
        if rc != 0:
            raise DecodeError(rc)
        self.n_outputs = int(self._out[:n].sum())
        return self.logits()

    def _process_seqs_sync(self, args: tuple[Any, ...]) -> int:
        rc = lib.lsp_process_seqs(*args)
        lib.llama_synchronize(self._ptr)
        return rc

    def decode_seq_sets(self, tokens: Sequence[int] | np.ndarray, positions: Sequence[int] | np.ndarray,
                        seq_sets: Sequence[Sequence[int]],
                        outputs: OutputsSpec | Sequence[bool] | np.ndarray = "all") -> np.ndarray:
        """Decode one batch whose row i belongs to every sequence of seq_sets[i] (a tree: one KV cell
        shared by the paths through a node; needs kv_unified=True when n_seq_max > 1). Returns the
        output rows' logits, (n_out, n_vocab), a view valid until the next decode."""
        if self._ptr is None or self._lost is not None:
            self._check_usable()
        n = self._fill(tokens, positions, 0, outputs)
        if len(seq_sets) != n or any(len(s) == 0 for s in seq_sets):
            raise ValueError(f"seq_sets needs one non-empty set per token ({n}), got {len(seq_sets)}")
        flat = np.fromiter((x for s in seq_sets for x in s), dtype=np.int32)
        counts = np.fromiter((len(s) for s in seq_sets), dtype=np.int32, count=n)
        if flat.min() < 0 or flat.max() >= self.n_seq_max:
            raise ValueError(f"seq ids {int(flat.min())}..{int(flat.max())} out of range [0, {self.n_seq_max})")
        args = (self._ptr, self._batch, self._tok_p, self._pos_p, n, ffi.cast("int32_t *", flat.ctypes.data),
                ffi.cast("int32_t *", counts.ctypes.data), self._out_p)
        if self._rpc:
            rc = self._run(n, flat, _rpc.call_guarded, self._process_seq_sets_sync, args, on_interrupt=self.abort,
                           counts=counts)
        else:
            rc = self._run(n, flat, lib.lsp_process_seq_sets, *args, counts=counts)
        if rc <= -100:
            raise DecodeError(rc, f"adding batch row {-100 - rc}")
        if rc != 0:
            raise DecodeError(rc)
        self.n_outputs = int(self._out[:n].sum())
        return self.logits()

    def _process_seq_sets_sync(self, args: tuple[Any, ...]) -> int:
        rc = lib.lsp_process_seq_sets(*args)
        lib.llama_synchronize(self._ptr)
        return rc

    def _process_sync(self, n: int, seq_id: int, e_ptr: Any) -> int:
        rc = lib.lsp_process(self._ptr, self._batch, self._tok_p, self._pos_p, n, seq_id, self._out_p, e_ptr, self.n_embd)
        lib.llama_synchronize(self._ptr)  # all of this decode's RPC traffic happens under the guard
        return rc

    # -- stopping a decode ---------------------------------------------------------------------
    def abort(self) -> bool:
        """Stop the decode running on this context now; callable from any thread (thread-safe).

        The decode raises :class:`~llama_spec.errors.DecodeError` with ``code == 2`` in the
        thread that runs it, within one graph node, and leaves the memory as before the call
        (see the module docstring). Returns False, doing nothing, when no decode is running: an
        abort never waits for a later decode.
        """
        with _decoding_lock:
            if self not in _decoding:
                return False
            self._abort_flag[0] = 1
            return True

    def _run(self, n: int, seqs: int | np.ndarray, call: Any, *args: Any, counts: np.ndarray | None = None,
             **kwargs: Any) -> int:
        """One native decode ``call(*args, **kwargs)`` of the n-row batch in the input buffers, its
        abort path armed; llama.cpp's code. `seqs`: the batch's sequence, or each row's (with
        `counts`: each row's counts[i] sequences, flattened). Stopped: cells dropped, then raise."""
        main = threading.get_ident() == _MAIN_THREAD and not self._rpc  # RPC decodes run on a worker
        if main is not self._abort_main:
            lib.llama_set_abort_callback(self._ptr, _MAIN_ABORT if main else _FLAG_ABORT, self._abort_flag)
            self._abort_main = main
        with _decoding_lock:
            self._abort_flag[0] = 0
            _decoding.add(self)
        try:
            rc = int(call(*args, **kwargs))
            exc = _take_pending_signal()  # Ctrl-C inside the decode (rc 2, or 0 at the last node)
        except BaseException:  # Ctrl-C as the call returned, an RPC call interrupted, a lost server
            _take_pending_signal()
            if self._lost is None:
                self._stopped(n, seqs, counts)
            raise
        finally:
            with _decoding_lock:
                _decoding.discard(self)
                asked = self._abort_flag[0] != 0
                self._abort_flag[0] = 0
        if exc is not None:
            self._stopped(n, seqs, counts)
            raise exc
        if rc == 2:
            self._stopped(n, seqs, counts)
            raise DecodeError(2, "decode (stopped by Context.abort())" if asked else "decode")
        return rc

    def _stopped(self, n: int, seqs: int | np.ndarray, counts: np.ndarray | None) -> None:
        """After a stopped decode: drop each sequence's positions from its first one in the batch
        on (llama.cpp drops only the ubatch it stopped in; earlier ubatches stay in memory). A
        recurrent state that cannot roll back that far loses the whole sequence."""
        self.n_outputs = 0
        pos = self._pos[:n] if counts is None else np.repeat(self._pos[:n], counts)
        seq_ids = seqs if isinstance(seqs, np.ndarray) else np.full(n, int(seqs), dtype=np.int32)
        for s in np.unique(seq_ids).tolist():
            p0 = int(pos[seq_ids == s].min())
            if not lib.llama_memory_seq_rm(self._mem, s, p0, -1):
                lib.llama_memory_seq_rm(self._mem, s, -1, -1)

    def logits(self) -> np.ndarray:
        """Zero-copy view of the last decode's logits, (n_outputs, n_vocab) float32."""
        if self._ptr is None or self._lost is not None:
            self._check_usable()
        ptr = lib.llama_get_logits(self._ptr)
        if ptr == ffi.NULL or self.n_outputs == 0:
            return np.empty((0, self.n_vocab), dtype=np.float32)
        return np.frombuffer(ffi.buffer(ptr, self.n_outputs * self.n_vocab * 4), dtype=np.float32).reshape(
            self.n_outputs, self.n_vocab
        )

    def logits_address(self) -> int:
        """Address of llama.cpp's logits buffer (tests use it to prove the view is zero-copy)."""
        return int(ffi.cast("uintptr_t", lib.llama_get_logits(self.ptr)))

    def nextn_rows(self, n_rows: int | None = None) -> np.ndarray:
        """Zero-copy view of the MTP hidden rows of the last decode, (rows, n_embd) float32.

        With ``set_nextn(True, masked=False)`` there is one row per batch token; with masked=True
        one per output row. Valid until the next decode.
        """
        if not self._nextn:
            raise ValueError("nextn rows were not requested: call set_nextn(True) before decoding")
        ptr = lib.lsp_get_embeddings_nextn(self.ptr)
        if ptr == ffi.NULL:
            raise ValueError("llama.cpp produced no nextn rows (does the model have an MTP head?)")
        if n_rows is None:
            n_rows = self.n_outputs
        return np.frombuffer(ffi.buffer(ptr, n_rows * self.n_embd * 4), dtype=np.float32).reshape(n_rows, self.n_embd)

    def prefill(self, tokens: Sequence[int], seq_id: int = 0, *, start_pos: int | None = None) -> np.ndarray:
        """Decode a prompt of any length in n_batch chunks; return the last token's logits row."""
        toks = np.asarray(tokens, dtype=np.int32)
        if len(toks) == 0:
            raise ValueError("empty prompt")
        start = self.pos_max(seq_id) + 1 if start_pos is None else int(start_pos)
        if start + len(toks) > self.n_ctx:
            raise ValueError(f"prompt of {len(toks)} tokens from position {start} does not fit n_ctx={self.n_ctx}")
        logits = np.empty((0, self.n_vocab), dtype=np.float32)
        for off in range(0, len(toks), self.n_batch):
            chunk = toks[off : off + self.n_batch]
            pos = np.arange(start + off, start + off + len(chunk), dtype=np.int32)
            logits = self.decode(chunk, pos, seq_id, "last")
        return logits[-1]

    # -- memory -----------------------------------------------------------------------------
    def pos_max(self, seq_id: int = 0) -> int:
        """Largest position held for `seq_id`, -1 when empty."""
        return int(lib.llama_memory_seq_pos_max(self._memory, seq_id))

    def pos_min(self, seq_id: int = 0) -> int:
        return int(lib.llama_memory_seq_pos_min(self._memory, seq_id))

    def seq_rm(self, seq_id: int = 0, p0: int = -1, p1: int = -1) -> bool:
        """Remove positions [p0, p1) of `seq_id` (-1 = open end). False if llama.cpp can't.

        On recurrent/hybrid models a partial removal needs ``n_rs_seq`` >= the number of
        positions rolled back (the state snapshots it restores from).
        """
        return bool(lib.llama_memory_seq_rm(self._memory, seq_id, p0, p1))

    def rollback(self, seq_id: int, keep_until: int) -> None:
        """Keep positions < keep_until of `seq_id`, dropping the rest (KV cells and recurrent state)."""
        if keep_until > self.pos_max(seq_id):
            return
        if not self.seq_rm(seq_id, keep_until, -1):
            n = self.pos_max(seq_id) + 1 - keep_until
            raise ContextError(
                f"llama.cpp cannot roll back {n} position(s) of seq {seq_id} "
                f"(recurrent model with n_rs_seq={self.n_rs_seq}; create the context with n_rs_seq >= {n})"
            )

    def seq_cp(self, src: int, dst: int, p0: int = -1, p1: int = -1) -> None:
        lib.llama_memory_seq_cp(self._memory, src, dst, p0, p1)

    def seq_keep(self, seq_id: int) -> None:
        lib.llama_memory_seq_keep(self._memory, seq_id)

    def clear(self) -> None:
        """Forget every sequence (KV cells and recurrent state)."""
        lib.llama_memory_clear(self._memory, True)

    # -- state ------------------------------------------------------------------------------
    def save_state(self, seq_id: int | None = None) -> bytes:
        """The whole context state (memory, outputs) as bytes; seq_id: that sequence's memory only."""
        one = seq_id is not None
        n = lib.llama_state_seq_get_size(self.ptr, seq_id) if one else lib.llama_state_get_size(self.ptr)
        buf = ffi.new("uint8_t[]", n)
        got = lib.llama_state_seq_get_data(self.ptr, buf, n, seq_id) if one else lib.llama_state_get_data(self.ptr, buf, n)
        return bytes(ffi.buffer(buf, got))

    def load_state(self, data: bytes, seq_id: int | None = None) -> None:
        """Load a state from :meth:`save_state` (seq_id: into that sequence, replacing its memory)."""
        if seq_id is not None:
            self.seq_rm(seq_id, -1, -1)
        src = ffi.from_buffer(data)
        got = (lib.llama_state_seq_set_data(self.ptr, src, len(data), seq_id) if seq_id is not None
               else lib.llama_state_set_data(self.ptr, src, len(data)))
        if got != len(data):
            if seq_id is not None:
                self.seq_rm(seq_id, -1, -1)
            raise ContextError(f"state load consumed {got} of {len(data)} bytes (seq {seq_id})")
        if seq_id is None:
            self.n_outputs = 0


class MtpContext(Context):
    """The MTP head of a model as its own context (``ctx_type = MTP`` on the same model).

    Feed it (token x_{p+1}, target hidden row h_p) pairs with :meth:`decode` (``embd=`` rows);
    read the head's logits from the return value and its own hidden rows with
    :meth:`nextn_rows` (for the next draft step), exactly as upstream's draft-mtp does.
    """

    _ctx_type = lib.LLAMA_CONTEXT_TYPE_MTP

    def __init__(self, model: Model, **kwargs: Any) -> None:
        if not model.load_mtp:
            raise ValueError("the model was loaded without its MTP head: use Model(..., load_mtp=True)")
        if model.n_layer_nextn <= 0:
            raise ValueError(f"{model.path} has no MTP (nextn) layers")
        kwargs.setdefault("n_rs_seq", 0)
        super().__init__(model, **kwargs)
        self.set_nextn(True, masked=True)

    def set_layer_offset(self, head: int) -> None:
        """Select which appended nextn block runs (chained heads); 0 = the first head."""
        if not 0 <= head < self.model.n_layer_nextn:
            raise ValueError(f"head {head} out of range [0, {self.model.n_layer_nextn})")
        lib.lsp_set_nextn_layer_offset(self.ptr, head)
