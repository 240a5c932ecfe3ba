"""Lifetime of native objects, at the bottom of the stack: one owner per llama.cpp pointer.

:class:`NativeHandle` is what every owner of a llama.cpp object is built on (models, contexts,
samplers, grammars, reasoning budgets; ``ffi.gc`` is not used anywhere): it holds the pointer,
frees it exactly once (``close()`` is idempotent, also called by the context manager and the
finalizer), and knows a third state besides open and closed: *lost*.
A handle whose memory lives partly on an RPC server that went away is lost: freeing it would
make ggml-rpc wait on a dead connection forever (or abort the process), so its memory is leaked
on purpose, ``close()`` does nothing, and every use raises :class:`RpcConnectionError`.

:data:`endpoints` is the one registry of RPC endpoints in the process: which were registered
with ggml (and their device names), which were lost (and why), and which live handles use
each. :mod:`llama_spec.rpc` marks handles lost through it, so it never needs to know what a
model or a context is.

Finalizers do no network I/O: freeing a handle on RPC servers first asks the servers (a probe
with a timeout), so a handle on RPC servers that is garbage-collected unclosed is not freed in
its finalizer but queued, and freed (probe first) at the next safe point: the next RPC model or
context created, the next explicit ``close()`` of one, or :meth:`EndpointRegistry.free_deferred`
(``llama_spec.rpc.free_deferred()``). Close RPC-backed objects explicitly to free them at once.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, ClassVar, Self

from .errors import RpcConnectionError

__all__ = ["EndpointRegistry", "NativeHandle", "endpoints"]


class NativeHandle:
    """Owner of one native pointer: open -> closed (freed) or open -> lost (leaked).

    Subclasses set ``_kind`` (used in messages), call :meth:`_adopt` once the pointer exists,
    and implement :meth:`_free`. Code that calls llama.cpp goes through :attr:`ptr` (or
    :meth:`_check_usable` first), which refuses closed and lost handles.
    """

    _kind: ClassVar[str] = "handle"
    _free_rank: ClassVar[int] = 0  # queued frees go in rank order (a model, 1, after its contexts)
    # class-level defaults: a constructor that fails before _adopt still closes cleanly
    _ptr: Any = None  # the cffi pointer; None = none (never adopted, or freed)
    _rpc_endpoints: tuple[str, ...] = ()
    _lost: tuple[str, str] | None = None  # (endpoint, reason) once lost

    def _adopt(self, ptr: Any, rpc_endpoints: Iterable[str] = ()) -> None:
        """Take ownership of `ptr`; a handle on RPC servers is tracked under each endpoint."""
        self._ptr = ptr
        self._rpc_endpoints = tuple(rpc_endpoints)
        if self._rpc_endpoints:
            endpoints.track(self, self._rpc_endpoints)
            endpoints.free_deferred()  # a safe point: free what finalizers queued

    def _free(self, ptr: Any) -> None:
        """Release the native object (called at most once, never for a lost handle)."""
        raise NotImplementedError

    # -- state ------------------------------------------------------------------------------
    @property
    def ptr(self) -> Any:
        """The native pointer; ValueError once closed, RpcConnectionError once lost."""
        self._check_usable()
        return self._ptr

    @property
    def closed(self) -> bool:
        return self._lost is None and self._ptr is None

    @property
    def lost(self) -> bool:
        return self._lost is not None

    @property
    def lost_reason(self) -> str | None:
        """Why the handle is lost ("RPC server host:port: why"), None while it is not."""
        return None if self._lost is None else f"RPC server {self._lost[0]}: {self._lost[1]}"

    @property
    def rpc_endpoints(self) -> tuple[str, ...]:
        """The RPC servers ("host:port") holding part of this object, in device order."""
        return self._rpc_endpoints

    def _check_usable(self) -> None:
        if self._lost is not None:
            raise RpcConnectionError(
                self._lost[0], f"was lost: this {self._kind} was on it and cannot be used any more "
                "(load the model again on reachable servers)")
        if self._ptr is None:
            raise ValueError(f"{self._kind} is closed")

    def _mark_lost(self, endpoint: str, reason: str) -> None:
        """Called by the registry: the server is gone, the memory stays allocated for good."""
        if self._lost is None and self._ptr is not None:
            self._lost = (endpoint, reason)

    # -- lifetime ---------------------------------------------------------------------------
    def close(self) -> None:
        """Free the native object; a no-op when already closed or lost.

        On RPC servers, the servers are asked first: if one is gone the handle (and every
        other on that server) becomes lost instead of being freed.
        """
        if self._lost is not None or self._ptr is None:
            return
        if self._rpc_endpoints and not endpoints.may_free(self._rpc_endpoints):
            return  # marked lost by the check: leaked on purpose
        ptr, self._ptr = self._ptr, None
        self._free(ptr)
        if self._rpc_endpoints:
            endpoints.free_deferred()  # a safe point: free what finalizers queued

    def __del__(self) -> None:
        try:
            if self._rpc_endpoints and self._ptr is not None and self._lost is None:
                # freeing asks the servers first (network I/O, up to a timeout): never in a
                # finalizer; queued (which keeps this object alive) and freed at a safe point
                endpoints.defer_free(self)
                return
            self.close()
        except Exception:  # noqa: BLE001 - never raise from a finalizer
            pass

    def __enter__(self) -> Self:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()


@dataclass
class _Endpoint:
    devices: tuple[str, ...] | None = None  # ggml device names, once registered
    lost: str | None = None                  # why it is lost, once lost
    handles: weakref.WeakSet[NativeHandle] = field(default_factory=weakref.WeakSet)


class EndpointRegistry:
    """What the process knows about each RPC endpoint ("host:port"); thread-safe.

    ggml-rpc keys its connections by the endpoint string and cannot reconnect a broken one,
    so "lost" is final for the process.
    """

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._eps: dict[str, _Endpoint] = {}
        self._free_check: Callable[[tuple[str, ...]], bool] | None = None
        self._deferred: list[NativeHandle] = []  # unclosed RPC handles their finalizer did not free
        self._draining = False

    def _get(self, endpoint: str) -> _Endpoint:
        ep = self._eps.get(endpoint)
        if ep is None:
            ep = self._eps[endpoint] = _Endpoint()
        return ep

    def note_registered(self, endpoint: str, devices: Iterable[str]) -> None:
        with self._lock:
            self._get(endpoint).devices = tuple(devices)

    def devices_of(self, endpoint: str) -> tuple[str, ...] | None:
        """The device names `endpoint` was registered with, None if it was not."""
        with self._lock:
            ep = self._eps.get(endpoint)
            return None if ep is None else ep.devices

    def registered(self) -> list[str]:
        """Endpoints registered with ggml in this process, in registration order."""
        with self._lock:
            return [k for k, v in self._eps.items() if v.devices is not None]

    def lost_reason(self, endpoint: str) -> str | None:
        with self._lock:
            ep = self._eps.get(endpoint)
            return None if ep is None else ep.lost

    def lost(self) -> dict[str, str]:
        with self._lock:
            return {k: v.lost for k, v in self._eps.items() if v.lost is not None}

    def track(self, handle: NativeHandle, endpoints: Iterable[str]) -> None:
        with self._lock:
            for e in endpoints:
                self._get(e).handles.add(handle)

    def in_use(self) -> set[str]:
        """Endpoints some live, not lost handle uses."""
        with self._lock:
            return {k for k, v in self._eps.items() if v.lost is None and any(not h.lost for h in list(v.handles))}

    def mark_lost(self, reasons: Mapping[str, str]) -> None:
        """Record each endpoint as lost (the first reason stays) and mark its live handles lost."""
        with self._lock:
            hit: list[tuple[NativeHandle, str, str]] = []
            for e, why in reasons.items():
                ep = self._get(e)
                if ep.lost is None:
                    ep.lost = why
                hit += [(h, e, ep.lost) for h in list(ep.handles)]
        for h, e, why in hit:
            h._mark_lost(e, why)

    def set_free_check(self, check: Callable[[tuple[str, ...]], bool]) -> None:
        """Install the check run before freeing a handle on RPC servers (llama_spec.rpc's)."""
        self._free_check = check

    def may_free(self, endpoints: tuple[str, ...]) -> bool:
        """False when one of `endpoints` is lost (the check marks it); True otherwise."""
        lost = {e: r for e in endpoints if (r := self.lost_reason(e)) is not None}
        if lost:
            self.mark_lost(lost)
            return False
        return self._free_check(endpoints) if self._free_check is not None else True


    # -- frees deferred from finalizers ------------------------------------------------------
    def defer_free(self, handle: NativeHandle) -> None:
        """Queue `handle` (from its finalizer) to be closed by :meth:`free_deferred`. No I/O."""
        with self._lock:
            self._deferred.append(handle)

    def deferred(self) -> int:
        """How many handles wait in the queue."""
        with self._lock:
            return len(self._deferred)

    def free_deferred(self) -> int:
        """Close every queued handle (each asks its servers first: network I/O, bounded by the
        probe's timeout); return how many were closed. Never call it from a finalizer."""
        with self._lock:
            if self._draining:
                return 0  # re-entered from a close() below
            self._draining = True
        n = 0
        try:
            while True:
                with self._lock:
                    todo, self._deferred = self._deferred, []
                if not todo:
                    return n
                todo.sort(key=lambda h: h._free_rank, reverse=True)  # pop() takes the lowest rank first
                while todo:  # contexts before their models: a queued context keeps its model alive
                    h = todo.pop()
                    try:
                        h.close()
                    except Exception:  # noqa: BLE001 - one handle must not keep the others queued
                        pass
                    n += 1
                    del h  # may run another finalizer, which queues more: the next round takes them
        finally:
            with self._lock:
                self._draining = False


#: The process-wide registry.
endpoints = EndpointRegistry()
