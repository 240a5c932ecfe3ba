"""The server's decode engine: one worker thread owns the contexts and drives a batch generator.

The asyncio side calls :meth:`ServerEngine.submit` (admission: ``n_parallel`` slots plus
``max_queue`` waiting requests, else 503) and reads a request's items from its
:class:`RequestHandle` (an ``asyncio.Queue`` filled by the worker through
``loop.call_soon_threadsafe``): ``("event", TokenEvent)`` ..., then ``("result",
GenerationResult)`` or ``("error", exception)``. :meth:`ServerEngine.cancel` (a client went
away) gives the capacity back at once; the worker drops the sequence (its KV cells) before it
admits anything else.

The worker drives any object with :class:`~llama_spec.generation.batch.BatchGenerator`'s interface
(:class:`BatchLike`: ``free_slots/add/cancel/step/has_work/close``, ``n_parallel``,
``n_ctx_per_seq``); ``llama-spec serve`` gives it a BatchGenerator, whose slots decode together
in one target batch per step. A per-sequence failure inside
``step()`` is a :class:`~llama_spec.errors.SequenceError` naming the request; only that request
fails. Any other exception from ``step()`` fails the sequences active at that moment.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import threading
from collections.abc import Callable
from typing import Any, Protocol

from ..errors import RequestError, SequenceError
from ..generation.batch import GenerationRequest
from ..generation.solo import GenerationResult, TokenEvent

__all__ = ["BatchLike", "GenerationRequest", "RequestHandle", "ServerEngine"]

log = logging.getLogger("llama_spec.server")


class BatchLike(Protocol):
    """What the engine needs of a batch generator (the BatchGenerator interface)."""

    n_parallel: int
    n_ctx_per_seq: int

    def free_slots(self) -> int: ...
    def add(self, request: GenerationRequest) -> int: ...
    def cancel(self, request_id: int) -> None: ...
    def step(self) -> list[tuple[int, TokenEvent | GenerationResult]]: ...
    def has_work(self) -> bool: ...
    def close(self) -> None: ...
    def cache_info(self) -> dict[str, Any]: ...


# ============================================================================ serial adapter


class RequestHandle:
    """The asyncio side of one request: items arrive on ``queue`` (see the module docstring)."""

    def __init__(self, request: GenerationRequest, loop: asyncio.AbstractEventLoop) -> None:
        self.request = request
        self.loop = loop
        self.queue: asyncio.Queue[tuple[str, Any]] = asyncio.Queue()
        self.id: int | None = None   # the batch generator's request id, once it has a slot
        self.done = False            # result/error delivered or cancelled (worker side)
        self.cancelled = False


class ServerEngine:
    """Owns the worker thread; ``factory()`` builds the batch generator inside it (and frees it there)."""

    def __init__(self, factory: Callable[[], BatchLike], *, max_queue: int = 64,
                 idle_wait_s: float = 0.5) -> None:
        if max_queue < 0:
            raise ValueError(f"max_queue must be >= 0, got {max_queue}")
        self.factory = factory
        self.max_queue = int(max_queue)
        self.idle_wait_s = idle_wait_s
        self.n_parallel = 0
        self.n_ctx_per_seq = 0
        self._cv = threading.Condition()
        self._inbox: collections.deque[tuple[str, RequestHandle]] = collections.deque()
        self._admitted = 0           # requests holding a slot or a queue place
        self._stop = False
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._start_error: BaseException | None = None
        self._cache_info: Callable[[], dict[str, Any]] | None = None
        self.served = 0       # results delivered
        self.failed = 0       # errors delivered
        self.cancelled = 0    # sequences dropped from a slot because their client went away

    # -------------------------------------------------------------------- lifecycle
    def start(self) -> None:
        """Start the worker and wait until the batch generator is built (re-raising its error)."""
        self._thread = threading.Thread(target=self._run, name="llama-spec-engine", daemon=True)
        self._thread.start()
        self._ready.wait()
        if self._start_error is not None:
            self._thread.join()
            raise self._start_error

    def stop(self, timeout: float | None = 60.0) -> bool:
        """Stop the worker: waiting and active requests get an error; the contexts are freed.

        False when the worker is still inside a step after `timeout` (a long prefill): the
        caller must then not free the models it uses.
        """
        with self._cv:
            self._stop = True
            self._cv.notify_all()
        if self._thread is not None:
            self._thread.join(timeout)
            return not self._thread.is_alive()
        return True

    @property
    def capacity(self) -> int:
        return self.n_parallel + self.max_queue

    @property
    def load(self) -> int:
        return self._admitted

    def cache_info(self) -> dict[str, Any]:
        """The prompt cache's counters (plain ints read across threads: a snapshot, maybe a step old)."""
        return self._cache_info() if self._cache_info is not None else {}

    # -------------------------------------------------------------------- asyncio side
    def submit(self, request: GenerationRequest, loop: asyncio.AbstractEventLoop) -> RequestHandle:
        """Admit a request (RequestError 503 when every slot and queue place is taken)."""
        h = RequestHandle(request, loop)
        with self._cv:
            if self._stop:
                raise RequestError("the server is shutting down", None, status=503, type="server_error",
                                   code="unavailable")
            if self._admitted >= self.capacity:
                raise RequestError(f"server busy: {self.n_parallel} slots and {self.max_queue} queue places "
                                   "are taken; retry later", None, status=503, type="server_error",
                                   code="queue_full")
            self._admitted += 1
            self._inbox.append(("add", h))
            self._cv.notify()
        return h

    def cancel(self, h: RequestHandle) -> None:
        """The client is gone: give its capacity back now; the worker drops the sequence next."""
        with self._cv:
            if h.cancelled or h.done:
                return
            h.cancelled = True
            self._admitted -= 1
            self._inbox.append(("cancel", h))
            self._cv.notify()

    # -------------------------------------------------------------------- worker side
    def _deliver(self, h: RequestHandle, items: list[tuple[str, Any]]) -> None:
        def put() -> None:
            for it in items:
                h.queue.put_nowait(it)
        try:
            h.loop.call_soon_threadsafe(put)
        except RuntimeError:  # the event loop is closed (shutdown): nobody is listening
            pass

    def _finish(self, h: RequestHandle, item: tuple[str, Any], items: list[tuple[str, Any]] | None = None) -> None:
        with self._cv:
            if not h.cancelled and not h.done:
                self._admitted -= 1
            h.done = True
        if item[0] == "error":
            self.failed += 1
        else:
            self.served += 1
        self._deliver(h, [*(items or []), item])

    def _run(self) -> None:
        try:
            batch = self.factory()
        except BaseException as e:  # noqa: BLE001 - re-raised in start()
            self._start_error = e
            self._ready.set()
            return
        self.n_parallel = int(batch.n_parallel)
        self.n_ctx_per_seq = int(batch.n_ctx_per_seq)
        self._cache_info = batch.cache_info
        self._ready.set()
        try:
            self._loop(batch)
        finally:
            batch.close()

    def _loop(self, batch: BatchLike) -> None:
        pending: collections.deque[RequestHandle] = collections.deque()
        active: dict[int, RequestHandle] = {}
        while True:
            with self._cv:
                while not self._stop and not self._inbox and not pending and not batch.has_work():
                    self._cv.wait(self.idle_wait_s)
                if self._stop:
                    break
                inbox = list(self._inbox)
                self._inbox.clear()
            for kind, h in inbox:  # in arrival order: a cancel frees its slot before later adds
                if kind == "add":
                    pending.append(h)
                elif h.id is not None and active.pop(h.id, None) is not None:
                    batch.cancel(h.id)
                    self.cancelled += 1
                else:
                    try:
                        pending.remove(h)
                    except ValueError:
                        pass
            self._admit(batch, pending, active)
            if batch.has_work():
                self._step(batch, active)
        self._shutdown(batch, pending, active)

    def _admit(self, batch: BatchLike, pending: collections.deque[RequestHandle],
               active: dict[int, RequestHandle]) -> None:
        while pending and batch.free_slots() > 0:
            h = pending.popleft()
            if h.cancelled:
                continue
            try:
                h.id = batch.add(h.request)
            except ValueError as e:
                self._finish(h, ("error", RequestError(str(e), "prompt", code="context_length_exceeded"
                                                       if "context" in str(e) else None)))
                continue
            except Exception as e:  # noqa: BLE001
                log.exception("add() failed")
                self._finish(h, ("error", e))
                continue
            active[h.id] = h

    def _step(self, batch: BatchLike, active: dict[int, RequestHandle]) -> None:
        try:
            out = batch.step()
        except SequenceError as e:
            log.warning("%s", e)
            h = active.pop(e.request_id, None)
            if h is not None:
                self._finish(h, ("error", e.cause))
            return
        except Exception as e:  # noqa: BLE001 - fail the sequences of this step, keep serving
            log.exception("batch step failed")
            for rid, h in list(active.items()):
                active.pop(rid)
                try:
                    batch.cancel(rid)
                except Exception:  # noqa: BLE001
                    pass
                self._finish(h, ("error", e))
            return
        per: dict[int, list[tuple[str, Any]]] = {}
        for rid, item in out:
            h = active.get(rid)
            if h is None:
                continue
            if isinstance(item, GenerationResult):
                active.pop(rid)
                self._finish(h, ("result", item), per.pop(rid, None))
            else:
                per.setdefault(rid, []).append(("event", item))
        for rid, items in per.items():
            self._deliver(active[rid], items)

    def _shutdown(self, batch: BatchLike, pending: collections.deque[RequestHandle],
                  active: dict[int, RequestHandle]) -> None:
        err = RequestError("the server is shutting down", None, status=503, type="server_error", code="unavailable")
        with self._cv:
            inbox = [h for kind, h in self._inbox if kind == "add"]
            self._inbox.clear()
        for h in [*pending, *inbox, *active.values()]:
            if not h.done:
                self._finish(h, ("error", err))
