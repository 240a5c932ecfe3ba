"""The main thread's abort callback runs Python (so that a pending SIGINT handler can stop a decode)
at most once per _ABORT_PERIOD_US, not at every graph node: ggml's threads wait at each node for
thread 0's callback, and a Python call per node cost ~0.47 ms of an 8.8-ms SmolLM2-135M decode
(scripts/bench_abort_callback.py). Ctrl-C's latency is tests/test_binding_traps.py's."""

from __future__ import annotations

import time

import numpy as np
from conftest import THREADS

from llama_spec import Context
from llama_spec._ffi import ffi, lib
from llama_spec.llama import context


def _count_calls(smollm, period_us: int) -> tuple[list[float], float]:
    """30 one-token decodes (as generation makes) on this, the main, thread with a counting check
    installed: its call times and the decodes' wall seconds."""
    calls: list[float] = []

    @ffi.callback("bool(void *)")
    def counting(data: object) -> bool:
        calls.append(time.perf_counter())
        return False

    ctx = Context(smollm, n_ctx=256, n_threads=THREADS)
    toks = smollm.tokenize("The history of the world")
    try:
        ctx.decode(toks)
        lib.lsp_abort_set_python(counting, period_us)
        t0 = time.perf_counter()
        for i in range(30):
            ctx.decode([toks[-1]], [len(toks) + i])
        wall = time.perf_counter() - t0
    finally:
        lib.lsp_abort_set_python(context._abort_check, context._ABORT_PERIOD_US)
        ctx.close()
    return calls, wall


def test_python_runs_at_most_once_per_period_during_a_decode(smollm):
    calls, wall = _count_calls(smollm, 2000)
    assert 1 <= len(calls) <= wall / 0.002 + 2, (len(calls), wall)
    gaps = np.diff(calls)
    assert (gaps >= 0.002 - 1e-4).all(), gaps.min()     # never two calls within the period


def test_broken_variant_period_zero_calls_python_at_every_node(smollm):
    # what the throttle removes: ~600 graph nodes per decode, each a Python call; fails the bound above
    every, wall = _count_calls(smollm, 0)
    assert len(every) > 30 * 300 and len(every) > 4 * (wall / 0.002 + 2), (len(every), wall)


def test_the_main_thread_decodes_through_the_throttled_callback(smollm):
    ctx = Context(smollm, n_ctx=256, n_threads=THREADS)
    try:
        ctx.decode([1, 2, 3])
        assert ctx._abort_main is True
        assert context._MAIN_ABORT == ffi.addressof(lib, "lsp_abort_main")
    finally:
        ctx.close()
