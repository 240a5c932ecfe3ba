"""Lost servers: turning ggml-rpc's abort on a broken connection into :class:`RpcConnectionError`.

ggml-rpc has no error path: when the connection to a server breaks, its dispatcher thread calls
``GGML_ABORT`` (``ggml_abort`` runs the abort callback, then always ``abort()``).
:func:`call_guarded` runs a callable on a worker thread with an abort callback installed that,
for ggml-rpc's connection aborts, wakes the caller and parks the aborting thread for good
instead of returning to ``abort()``; the caller gets an :class:`RpcConnectionError` naming the
endpoint and the process survives. What was allocated on the lost server can never be freed
(freeing goes through the parked thread), so every handle on it is marked lost through the
endpoint registry (:mod:`llama_spec._handle`): leaked on purpose, refusing further use. The
endpoint cannot be used again in this process (ggml-rpc keys its connection by the endpoint
string). Outside :func:`call_guarded` a lost connection still aborts the process, after a
clear message naming the endpoint on stderr and in the ``llama_spec.rpc`` log.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import sys
import threading
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, TypeVar

from .._handle import endpoints as _registry
from ..errors import RpcConnectionError
from .protocol import endpoint_usable, liveness

log = logging.getLogger("llama_spec.rpc")

T = TypeVar("T")

_lock = threading.RLock()
_waiters: list[_Guard] = []           # guarded calls in flight
_abort_state: dict[str, Any] = {}     # the cffi ABI handle and callback (kept alive)

# GGML_ABORT messages of ggml-rpc's client side that mean "the connection is gone"
_RPC_ABORT_MARKERS = (
    "Remote RPC server crashed",
    "Failed to connect to ",
    "RPC handshake failed for ",
)

# threading's stand-in for threads not started by Python (ggml-rpc's dispatcher threads)
_FOREIGN_THREAD = getattr(threading, "_DummyThread", ())


class _Guard:
    __slots__ = ("done", "failure")

    def __init__(self) -> None:
        self.done = threading.Event()
        self.failure: RpcConnectionError | None = None


# -- what the process knows (the registry, seen from here) ------------------------------------
def registered_endpoints() -> list[str]:
    """Endpoints registered with ggml in this process, in registration order."""
    return _registry.registered()


def lost_endpoints() -> dict[str, str]:
    """Endpoints this process lost (endpoint -> reason). They cannot be used again here."""
    return _registry.lost()


def check_not_lost(endpoint: str) -> None:
    """RpcConnectionError if this process lost `endpoint` earlier."""
    why = _registry.lost_reason(endpoint)
    if why is not None:
        raise RpcConnectionError(
            endpoint, f"was lost earlier in this process ({why}); ggml-rpc keeps one connection per endpoint "
            "and cannot reconnect it, so this process cannot use it again (restart the process)")


def check_endpoints(endpoints: Iterable[str]) -> None:
    """RpcConnectionError if one of `endpoints` (a model's servers) was lost."""
    for ep in endpoints:
        check_not_lost(ep)


def retire_if_unreachable(endpoints: tuple[str, ...], timeout: float = 1.0) -> bool:
    """Before freeing a handle on `endpoints`: True if one of them is gone.

    Then every handle on that server was marked lost (leaked); the caller must not free.
    """
    bad = {}
    for ep in endpoints:
        ok, why = endpoint_usable(ep, timeout=timeout)
        if not ok:
            bad[ep] = why
    if not bad:
        return False
    _registry.mark_lost(bad)
    log.warning("RPC server %s is gone: leaking what lived on it instead of freeing it", ", ".join(bad))
    return True


def free_deferred() -> int:
    """Free the RPC-backed models and contexts that were garbage-collected unclosed; return how
    many. Their finalizers do no network I/O, so they wait for this (or the next RPC model or
    context created or closed): freeing asks each server first, up to a timeout."""
    return _registry.free_deferred()


def release_unreachable(timeout: float = 1.0) -> dict[str, str]:
    """Mark lost every handle on an RPC server that stopped answering; return {endpoint: why}.

    Their native memory is leaked (freeing it would make ggml-rpc abort the process); the
    endpoints count as lost for this process. Runs by itself at interpreter exit; call it
    before closing models when a server may have gone away.
    """
    bad = {}
    for ep in sorted(_registry.in_use()):
        ok, why = endpoint_usable(ep, timeout=timeout)
        if not ok:
            bad[ep] = why
    if bad:
        _registry.mark_lost(bad)
    return bad


# the handle base asks this before freeing anything that lives on RPC servers
_registry.set_free_check(lambda eps: not retire_if_unreachable(eps))


# -- the abort callback -----------------------------------------------------------------------
def _libggml_base_path() -> Path:
    """The libggml-base this process loaded (the binding links it), else the packaged one."""
    with contextlib.suppress(OSError), open("/proc/self/maps") as fh:
        for line in fh:
            path = line.rstrip("\n").split(maxsplit=5)[-1]
            if os.path.basename(path).startswith("libggml-base.so"):
                return Path(path)
    return Path(__file__).resolve().parent.parent / "_lib" / "libggml-base.so.0"


def install_abort_handler() -> bool:
    """Install the ggml abort callback that makes ggml-rpc connection losses recoverable.

    Idempotent; done automatically when an RPC server is registered. Other aborts keep
    ggml's behaviour (message and backtrace on stderr, then ``abort()``).
    """
    with _lock:
        if _abort_state:
            return True
        try:
            import cffi

            abi = cffi.FFI()
            abi.cdef(
                "typedef void (*ggml_abort_callback_t)(const char * error_message);"
                "ggml_abort_callback_t ggml_set_abort_callback(ggml_abort_callback_t callback);"
                "void ggml_print_backtrace(void);"
            )
            from .. import _ffi  # noqa: F401 - loads libggml-base first

            # the libggml-base the binding loaded: dlopen returns that handle, same globals
            base = abi.dlopen(str(_libggml_base_path()))
            cb = abi.callback("void(const char *)", _on_ggml_abort)
            prev = base.ggml_set_abort_callback(cb)
        except Exception as e:  # noqa: BLE001 - best effort: without it a lost server aborts
            log.warning("could not install the ggml abort callback (%s): a lost RPC server will abort the process", e)
            return False
        _abort_state.update(abi=abi, base=base, cb=cb, prev=prev)
        atexit.register(_at_exit)
        return True


def _at_exit() -> None:
    """Before the interpreter tears down: retire what lives on servers that are gone.

    Freeing a model whose server is gone makes ggml-rpc abort (or, with the callback still
    installed while Python finalizes, wait forever). So models on servers that no longer answer
    are leaked, and the callback is removed: from here on ggml's own abort() applies.
    """
    with contextlib.suppress(Exception):
        release_unreachable(timeout=1.0)
    with _lock:
        state = dict(_abort_state)
    if state:
        with contextlib.suppress(Exception):
            state["base"].ggml_set_abort_callback(state["prev"])


def _identify_lost(message: str) -> dict[str, str]:
    """Which registered endpoint(s) the abort `message` is about."""
    for marker in ("Failed to connect to ", "RPC handshake failed for "):
        if marker in message:
            ep = message.split(marker, 1)[1].strip()
            return {ep: "connection failed" if marker.startswith("Failed") else "handshake failed"}
    eps = registered_endpoints()
    verdicts = {ep: liveness(ep) for ep in eps}
    dead = {ep: why for ep, (alive, why) in verdicts.items() if alive is False}
    if dead:
        return dead
    unsure = {ep: why for ep, (alive, why) in verdicts.items() if alive is None}
    return unsure or {ep: "connection broke" for ep in eps}


def _print_ggml_abort(message: str) -> None:
    """ggml's default behaviour for aborts that are not ours (the callback replaces its printing)."""
    sys.stderr.write(message + "\n")
    sys.stderr.flush()
    with contextlib.suppress(Exception):
        _abort_state["base"].ggml_print_backtrace()


def _on_ggml_abort(c_message: Any) -> None:
    """ggml_abort's callback: runs on the aborting thread, which `abort()`s when this returns."""
    try:
        message = _abort_state["abi"].string(c_message).decode("utf-8", "replace")
    except Exception:  # noqa: BLE001
        message = "(unreadable abort message)"
    if not any(m in message for m in _RPC_ABORT_MARKERS):
        _print_ggml_abort(message)
        return
    lost = _identify_lost(message)
    detail = message.rsplit(": ", 1)[-1].strip()
    names = ", ".join(lost) or "(unknown)"
    reasons = "; ".join(f"{ep}: {why}" for ep, why in lost.items())
    with _lock:
        waiters = list(_waiters)
        # Park only ggml-rpc's own dispatcher threads (foreign to Python): they hold no lock.
        # The other RPC aborts happen while connecting, on the calling thread, under
        # ggml-rpc's global dispatcher mutex - parking there would deadlock every later use.
        park = bool(waiters) and isinstance(threading.current_thread(), _FOREIGN_THREAD)
        if park:
            err = RpcConnectionError(
                names, f"was lost during the call ({reasons}; ggml-rpc: {detail}). Models and contexts "
                "using it are unusable now (their memory is leaked on purpose) and this process cannot "
                "use the endpoint again")
            for w in waiters:
                if w.failure is None:
                    w.failure = err
    _registry.mark_lost(lost)
    if park:
        for w in waiters:
            w.done.set()
    log.error("RPC server %s lost (%s; ggml-rpc: %s)", names, reasons, detail)
    if park:
        # Never return: returning means abort(). This thread (ggml-rpc's dispatcher, or the
        # guarded worker) stays parked; what waits on it is leaked (marked lost above).
        threading.Event().wait()
    sys.stderr.write(
        f"llama_spec: RPC server {names} lost ({reasons}; ggml-rpc: {detail}).\n"
        "llama_spec: ggml-rpc cannot recover from a broken connection outside llama_spec.rpc.call_guarded() "
        "and aborts the process now.\n")
    sys.stderr.flush()


# -- guarded calls ----------------------------------------------------------------------------
def call_guarded(fn: Callable[..., T], *args: Any, on_interrupt: Callable[[], object] | None = None,
                 **kwargs: Any) -> T:
    """Run ``fn(*args, **kwargs)``; if an RPC server is lost meanwhile, raise instead of aborting.

    ``fn`` runs on a worker thread while the caller waits. Should ggml-rpc hit a broken
    connection, the caller gets :class:`RpcConnectionError` naming the endpoint, the worker is
    abandoned (it waits forever inside llama.cpp), and every model / context on the lost server
    is marked lost. Without registered RPC servers ``fn`` just runs here.
    Ctrl-C while waiting calls ``on_interrupt()`` (e.g. ``Context.abort``, to stop a decode
    early), waits for ``fn`` to return, then raises KeyboardInterrupt.
    One guarded call at a time per process is the intended use.
    """
    with _lock:
        direct = not _registry.registered() or not _abort_state
    if direct:
        return fn(*args, **kwargs)
    guard = _Guard()
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["value"] = fn(*args, **kwargs)
        except BaseException as e:  # noqa: BLE001 - handed to the caller
            box["error"] = e
        finally:
            guard.done.set()

    worker = threading.Thread(target=run, name="llama-spec-rpc-call", daemon=True)
    with _lock:
        _waiters.append(guard)
    try:
        worker.start()
        try:
            guard.done.wait()
        except BaseException:
            # Ctrl-C: the native call cannot be interrupted from here; ask it to stop, let it finish
            if on_interrupt is not None:
                on_interrupt()
            guard.done.wait()
            raise
    finally:
        with _lock:
            _waiters.remove(guard)
    if guard.failure is not None:
        raise guard.failure
    if "error" in box:
        raise box["error"]
    value: T = box["value"]
    return value
