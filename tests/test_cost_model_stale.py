"""Stale cells (generation/cost_model.py): timing noise is one-sided, so a decode much faster than
its cell's mean restarts the cell. Without it, a few seconds of load during plain steps left c(1)
high, and the controller drafted with a model that loses to plain for requests on end (seen on the
AVX2 EPYC: 0.65-0.8x plain); the broken variant (``FAST_DOWN = 0``) is run to show it."""

from __future__ import annotations

import numpy as np
import pytest

from llama_spec.generation import cost_model
from llama_spec.generation.controller import SpecController
from llama_spec.generation.cost_model import CostModel
from tests.test_controller import line, simulate


def test_a_decode_much_faster_than_its_cells_mean_restarts_the_cell():
    m = CostModel(decay=0.98)
    for _ in range(30):
        m.record_decode(1, 1, 0.097)   # (a busy machine: 97 ms)
    w, mean = m.cells[(1, 1)]
    assert w == 20.0 and mean == pytest.approx(0.097)
    m.record_decode(1, 1, 0.085)   # 0.88x the mean: within the noise, an ordinary update (1/20 of the gap)
    assert m.cells[(1, 1)][1] == pytest.approx(0.097 - 0.012 / 20.0)
    m.record_decode(1, 1, 0.050)   # under FAST_DOWN (0.8) x the mean: the cell restarts there
    w, mean = m.cells[(1, 1)]
    assert mean == pytest.approx(0.050) and w == pytest.approx(0.98 + 1.0)
    m.record_decode(1, 1, 0.056)   # and then averages as a cell of two measurements does
    assert m.cells[(1, 1)][1] == pytest.approx(0.050 + 0.006 / (1.98 * 0.98 + 1.0))
    # a slower decode never restarts it (clipped at CLIP x the mean, as before)
    m.record_decode(1, 1, 10.0)
    assert m.cells[(1, 1)][1] < 0.1


_NORMAL = line(0.030, 0.020)   # c(1) 50 ms, c(4) 110 ms


def _drafted_after_a_stall(seed: int) -> tuple[float, int]:
    """A model member keeping 90 % per position at 17 ms per drafted token loses to plain here
    (19.3 t/s at k = 3 against 20). 3 steps, 40 at twice the cost (load), then 400 normal ones:
    (t/s, steps drafted) of the last 400."""
    ctl = SpecController()
    kw = dict(accept={"d": 0.9}, draft_s={"d": 0.017})
    simulate(ctl, 3, cost=_NORMAL, seed=seed, **kw)
    simulate(ctl, 40, cost=lambda n: 2.0 * _NORMAL(n), seed=seed + 100, **kw)
    tok, sec, ch = simulate(ctl, 400, cost=_NORMAL, seed=seed + 200, **kw)
    return tok / sec, sum(w is not None for w, _ in ch)


def test_after_a_stall_the_controller_returns_to_plain_and_the_broken_variant_drafts_on(monkeypatch):
    # undisturbed, it never drafts in the 400 steps (checked: 0 of 400 for these seeds)
    got = [_drafted_after_a_stall(s) for s in range(10)]
    drafted = sum(d for _, d in got)
    assert drafted < 600, got     # measured: 231 of 4,000 steps (at most 60 in one run)
    assert np.median([r for r, _ in got]) > 19.6, got   # measured 19.78; plain 20.0, the broken variant 19.35
    monkeypatch.setattr(cost_model, "FAST_DOWN", 0.0)   # the broken variant: the stale c(1) comes down by 1/20
    broken = [_drafted_after_a_stall(s) for s in range(10)]
    assert sum(d for _, d in broken) > 1500, broken   # measured: 2,051 of 4,000
