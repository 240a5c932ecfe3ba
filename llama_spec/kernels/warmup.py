"""numba's first-call set-up, done ahead in a thread (``warm_up_in_background``).

The first call of a jitted kernel in a process sets numba's compiler target up and loads the
kernel from its cache: 0.45 s of one core on the 2-core Intel VM (1.0 s under cProfile; most of
it numba importing its typing registries), paid inside the first verification of sampled drafts
(the token rule at temp > 0; greedy verification calls no kernel). A generator with a drafter
and a fixed configuration (it drafts every step) starts it in a daemon thread when a sampled
request is added (never for greedy ones), so it overlaps that request's prefill (llama.cpp's calls
release the GIL) instead of stalling a decode step. Under the speculation controller nothing is
warmed ahead: it may never draft, and on 2 cores the warm-up then only slows the run (one-shot
``generate -md`` runs whose cost cache said plain took 0.5-0.8 s more wall time with the warm-up
started when the generator was built: scripts/cold_start.py, AVX2 EPYC); the server starts it when
it starts (idle time), and elsewhere the first sampled verification pays it, once per process.
"""

from __future__ import annotations

import threading

import numpy as np

from . import token

__all__ = ["warm_up_in_background"]

_lock = threading.Lock()
_thread: threading.Thread | None = None


def warm_up_in_background() -> threading.Thread:
    """Start the warm-up once per process; later calls return the same (maybe finished) thread."""
    global _thread
    with _lock:
        if _thread is None:
            _thread = threading.Thread(target=_warm, name="llama-spec-numba-warm-up", daemon=True)
            _thread.start()
        return _thread


def _warm() -> None:
    """Call the token rule's kernel once on a 2-token vocabulary, with the types the rule passes
    (the sampler's int32 ids and float32 probabilities, an int draft): the signature it loads is
    the rule's. A warm-up that fails costs nothing but itself (numba is then set up as before)."""
    try:
        ids = np.arange(2, dtype=np.int32)
        probs = np.full(2, 0.5, dtype=np.float32)
        rng, scratch = token.new_rng_state(0), token.new_scratch(2)
        token.accept_step_kernel(ids, probs, 0, ids, probs, rng, scratch)
    except Exception:  # noqa: BLE001 - never a reason for a run to fail
        pass
