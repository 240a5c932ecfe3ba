"""What speculation costs, measured online: the speculation controller's cost model (controller.py).

Words, used below exactly:

- **verification cost** c(N, B): seconds of one target decode of N rows for B sequences (a
  verification batch; B = 1 solo). Kept two ways: a decayed mean per measured (N, B) (an
  exponential moving average per cell), and a line a + b N + e B fitted to every decode by
  decayed least squares; the estimate at (N, B) blends the cell's mean (its weight) with the line
  (weight 1), so a cell measured often is trusted and one never measured comes from the line.
  CPU decodes are not linear in N (1.5B on 2 cores: n = 2 costs 1.43x n = 1, n = 4 1.64x,
  n = 8 2.88x; docs FACTS), hence the cells. Between two measured cells the estimate is
  interpolated between theirs; beyond the largest it goes on at the local slope there (the
  secant over its upper half), not the line's: the line is fitted mostly to plain steps and
  short drafts, and CPU rows cost less at large N (AVX2 EPYC, 1.5B: 28 ms a row at N <= 6, 18
  ms at N 16 .. 64: the line put c(45) at about 1.2 s, `bench_verify_cost.py` measured 0.96 s).
- **post cost** r(n): seconds of one sequence's work after the decode of its n rows (its drafter's
  observe, the rule, the rollback), a line in n.
- **draft cost** D_m(k, gap): seconds of one ``draft()`` call of drafter m for k draft tokens,
  ``gap`` = tokens emitted since m last drafted for this sequence (its lazy sync decodes them).
  u (k + 1) + g (gap - 1) per drafter (a model drafter decodes about k + 1 tokens, and prefills
  the gap), u, g >= 0; where the data cannot tell u from g (every draft the same length after the
  same gap) the fit stays nearest to g = ``GAP_PRIOR`` u (a prefill token costs less than a
  decoded one: 0.43 u for SmolLM2-135M drafting on 2 CPU cores here). Decisions use gap = 1 (the sync after a plain stretch
  is paid once, not per step: charging it to the next step would keep a drafter out for good);
  the exploration prices it (controller.py).

Every coefficient is >= 0 (a negative slope fitted to noise would make long drafts look free).

Every fit decays by ``decay`` per new measurement, so a change of load is followed.

Stale cells: timing noise is one-sided (a busy machine makes a decode slower, never faster), and
the cell of an option not chosen is measured only when it is explored. A few seconds of load
while plain steps ran left c(1) at 1.4x its cost; the draft model then looked faster than plain
and was chosen for four requests (0.8x plain), c(1) coming down by 1/20 of the gap per explored
plain step (AVX2 EPYC, scripts/bench_auto.py with a 3 s CPU hog). So a decode faster than
``FAST_DOWN`` x its cell's mean restarts the cell at that measurement (weight ``STALE_RESTART``):
what the mean held were stalls.

A model can be written to JSON (``to_dict``) and read back (``from_dict``) as the start of a later run
(``llama-spec tune --save``, ``--spec-cost-model``): its cells then weigh at most ``PRIOR_WEIGHT``,
so this machine's own measurements take over within a few steps.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from .draft_length import DraftLengthController

__all__ = ["PRIOR_WEIGHT", "CostModel", "LinearFit"]

PRIOR_WEIGHT = 2.0   # weight of a loaded cell (as two measurements)
FAST_DOWN = 0.8      # a decode this much faster than its cell's mean restarts the cell (Stale cells)
STALE_RESTART = 2.0  # the restarted cell's weight: the new measurement, as two
GAP_PRIOR = 0.25     # the draft cost of a synced token / that of a drafted one, until measured
_MAX_CELL_WEIGHT = 20.0


class LinearFit:
    """y ~ x . beta by decayed least squares (a small ridge toward `prior` keeps it defined).

    Robust to one-off stalls: the first ``warmup`` measurements are dropped, and so is one above
    ``OUTLIER`` x the smallest seen (that floor rises by 1/decay per measurement; one below it /
    OUTLIER restarts the fit, the earlier ones were the stalls): a kernel's first
    call compiles or loads it (617 ms of rule time against 0.2-0.6 ms for every later one, measured
    here). Once three are in, a measurement is clipped to ``CLIP`` x the prediction (a load change
    still comes through, CLIP x per step).
    """

    CLIP = 4.0
    OUTLIER = 25.0

    def __init__(self, n_features: int, decay: float, warmup: int = 0) -> None:
        self.n, self.decay, self.warmup = int(n_features), float(decay), int(warmup)
        # [xtx | xty | sum_x], row-major (n, n + 2), as Python floats: a step records 3-4 measurements
        # between decodes, with the caches cold (controller.py, Overhead), and numpy's per-call cost
        # on 3 x 5 arrays was ~40 us per measurement there (AVX2 EPYC), the floats' a few
        self._s = [0.0] * (self.n * (self.n + 2))
        self._np: np.ndarray | None = None      # _s as an (n, n + 2) array, until the next add
        self.count = 0.0                       # decayed number of measurements
        self.sum_y = 0.0
        self.floor = float("inf")              # the smallest measurement, rising slowly
        self._beta: dict[bytes, np.ndarray] = {}  # coef() per prior, until the next add

    def _sums(self) -> np.ndarray:
        if self._np is None:
            self._np = np.array(self._s, dtype=np.float64).reshape(self.n, self.n + 2)
        return self._np

    @property
    def xtx(self) -> np.ndarray:
        return self._sums()[:, : self.n]

    @property
    def xty(self) -> np.ndarray:
        return self._sums()[:, self.n]

    @property
    def sum_x(self) -> np.ndarray:
        return self._sums()[:, self.n + 1]

    def sum_x0(self) -> float:
        """The decayed sum of the first feature (a float, without building the arrays)."""
        return self._s[self.n + 1]

    def add(self, x: tuple[float, ...], y: float) -> None:
        """One measurement: features x (len n), value y."""
        if self.warmup > 0:
            self.warmup -= 1
            return
        n, s = self.n, self._s
        if self.count > 0 and y * self.OUTLIER < self.floor:   # what came before were the stalls
            for i in range(n):
                s[i * (n + 2): i * (n + 2) + n + 1] = [0.0] * (n + 1)
            self.count, self.sum_y = 0.0, 0.0
        self.floor = min(y, self.floor / self.decay)
        if y > self.OUTLIER * max(self.floor, 1e-6):
            return
        if self.count >= 3.0 and y > 2.0 * self.sum_y / self.count:   # (only a large one can need it)
            beta = self.coef()
            assert beta is not None
            y = min(y, self.CLIP * max(float(np.dot(x, beta)), 1e-6))
        d = self.decay
        self._beta.clear()
        self._np = None
        ext = (*x, y, 1.0)   # x x^T | x y | x
        j = 0
        for xi in x:
            for e in ext:
                s[j] = s[j] * d + xi * e
                j += 1
        self.count = self.count * d + 1.0
        self.sum_y = self.sum_y * d + y

    def coef(self, prior: np.ndarray | None = None) -> np.ndarray | None:
        """beta >= 0 (None before any measurement); directions the data do not fix stay at `prior`
        (None: 0). Cached per prior until the next measurement (the controller asks every step)."""
        if self.count <= 0.0:
            return None
        key = b"" if prior is None else prior.tobytes()
        beta = self._beta.get(key)
        if beta is None:
            if prior is None:
                prior = np.zeros(self.n)
            lam = 1e-6 * max(float(np.trace(self.xtx)), 1e-12) + 1e-12
            a = self.xtx + lam * np.eye(self.n)
            b = self.xty + lam * prior
            beta = np.linalg.solve(a, b)   # (the common case: every coefficient >= 0, one solve)
            free = beta > 0
            while (beta < 0).any() and free.any():   # active set: a negative one fixed at 0, the rest refitted
                beta = np.zeros(self.n)
                beta[free] = np.linalg.solve(a[np.ix_(free, free)], b[free])
                free &= beta > 0
            beta = self._beta[key] = np.maximum(beta, 0.0)
        return beta

    def to_list(self) -> list[Any]:
        return [self.xtx.tolist(), self.xty.tolist(), self.count, self.sum_y, self.sum_x.tolist()]

    def load(self, data: list[Any], scale: float) -> None:
        """A saved fit, its weight scaled down to at most `scale` measurements."""
        xtx, xty, count, sum_y, sum_x = data
        f = min(1.0, scale / count) if count > 0 else 0.0
        sums = np.column_stack([np.asarray(xtx, dtype=np.float64), np.asarray(xty, dtype=np.float64),
                                np.asarray(sum_x, dtype=np.float64)]) * f
        self._s, self._np = [float(v) for v in sums.ravel()], None
        self.count, self.sum_y = float(count) * f, float(sum_y) * f
        self._beta.clear()


class CostModel:
    """c(N, B), r(n) and D_m(k, gap) (module docstring); ``record_*`` after, ``*_cost`` before."""

    def __init__(self, decay: float = 0.98) -> None:
        if not 0.0 < decay <= 1.0:
            raise ValueError("cost model: requires 0 < decay <= 1")
        self.decay = float(decay)
        self.cells: dict[tuple[int, int], list[float]] = {}   # (N, B) -> [weight, mean seconds]
        self.verify_line = LinearFit(3, decay)                # 1, N, B
        self.post_line = LinearFit(2, decay, warmup=1)        # 1, n
        self.draft_lines: dict[str, LinearFit] = {}           # drafter -> k + 1, gap - 1
        self.version = 0   # counts record_decode and record_post: c and r change only then

    # -- measurements ----------------------------------------------------------------------------
    def record_decode(self, n_rows: int, n_seqs: int, seconds: float) -> None:
        """A verification decode of n_rows rows of n_seqs sequences took `seconds`."""
        self.version += 1
        cell = self.cells.setdefault((int(n_rows), int(n_seqs)), [0.0, 0.0])
        if cell[0] >= 2.0:
            seconds = min(seconds, LinearFit.CLIP * cell[1])
            if seconds < FAST_DOWN * cell[1]:   # (Stale cells, module docstring)
                cell[0], cell[1] = STALE_RESTART - 1.0, seconds
        w = min(cell[0] * self.decay + 1.0, _MAX_CELL_WEIGHT)
        cell[1] += (seconds - cell[1]) / w
        cell[0] = w
        self.verify_line.add((1.0, float(n_rows), float(n_seqs)), seconds)

    def record_post(self, n_rows: int, seconds: float) -> None:
        """One sequence's work after the decode of its n_rows rows took `seconds`."""
        self.version += 1
        self.post_line.add((1.0, float(n_rows)), seconds)

    def record_draft(self, drafter: str, n_drafted: int, gap: int, seconds: float) -> None:
        """A draft() call of `drafter` gave n_drafted tokens after a gap of `gap` tokens."""
        fit = self.draft_lines.setdefault(drafter, LinearFit(2, self.decay, warmup=1))
        fit.add((n_drafted + 1.0, max(gap - 1.0, 0.0)), seconds)

    # -- estimates ---------------------------------------------------------------------------------
    def ready(self) -> bool:
        """Two numbers of rows timed: the verification cost of other sizes can be told."""
        return len({n for n, _ in self.cells}) >= 2

    def timed(self, n_rows: int, n_seqs: int) -> bool:
        """A decode of n_rows rows for n_seqs sequences was timed."""
        return (int(n_rows), int(n_seqs)) in self.cells

    def verify_cost(self, n_rows: np.ndarray, n_seqs: int) -> np.ndarray:
        """c(N, B) for each N of `n_rows` (int, ascending), made non-decreasing in N; NaN unknown."""
        line = self.verify_line.coef()
        if line is not None and not self.ready():
            # one size timed: flat (the optimistic guess that makes the loop try other sizes)
            line = np.array([self.verify_line.sum_y / self.verify_line.count, 0.0, 0.0])
        out = (np.full(len(n_rows), np.nan) if line is None
               else line[0] + line[1] * np.asarray(n_rows, dtype=np.float64) + line[2] * n_seqs)
        b = int(n_seqs)
        ns = np.asarray(n_rows, dtype=np.float64)
        known = sorted((n, w, mean) for (n, nb), (w, mean) in self.cells.items() if nb == b and w > 0)
        if line is not None and len(known) >= 2:
            x = np.array([n for n, _, _ in known], dtype=np.float64)
            at = line[0] + line[1] * x + line[2] * b
            y = np.array([(w * mean + a) / (w + 1.0) for (_, w, mean), a in zip(known, at, strict=True)])
            inside = (ns >= x[0]) & (ns <= x[-1])
            out[inside] = np.interp(ns[inside], x, y)
            far = ns > x[-1]
            if far.any():
                out[far] = y[-1] + self._tail_slope(x, y, float(line[1])) * (ns[far] - x[-1])
        else:
            where = {n: i for i, n in enumerate(np.asarray(n_rows).tolist())}
            for n, w, mean in known:
                i = where.get(n)
                if i is not None:
                    out[i] = mean if line is None else (w * mean + out[i]) / (w + 1.0)
        if not np.isnan(out).any():
            out = np.maximum.accumulate(np.maximum(out, 1e-9))
        return out

    @staticmethod
    def _tail_slope(x: np.ndarray, y: np.ndarray, line_slope: float) -> float:
        """Seconds per row beyond the largest cell: the secant from the largest cell to the largest
        one at <= half its rows (a wide base, so two noisy cells close together cannot tip it), at
        least half the line's (a slope fitted to noise must not make long drafts free)."""
        j = int(np.searchsorted(x, x[-1] / 2.0, side="right")) - 1
        j = j if j >= 0 else 0
        secant = (y[-1] - y[j]) / (x[-1] - x[j]) if x[-1] > x[j] else line_slope
        return max(float(secant), 0.5 * line_slope)

    def post_cost(self, n_rows: np.ndarray) -> np.ndarray:
        coef = self.post_line.coef()
        if coef is None:
            return np.zeros(len(n_rows))
        return np.maximum(coef[0] + coef[1] * n_rows, 0.0)

    def _draft_coef(self, drafter: str) -> np.ndarray | None:
        """(u, g) of D_m (None: never timed). Prior: proportional to k + 1."""
        fit = self.draft_lines.get(drafter)
        if fit is None or fit.count <= 0:
            return None
        per = fit.sum_y / max(fit.sum_x0(), 1e-12)    # the prior: seconds per (drafted token + 1), and
        return fit.coef(np.array([per, GAP_PRIOR * per]))  # a quarter of that per synced token

    def draft_cost(self, drafter: str, k: np.ndarray, gap: int = 1) -> np.ndarray | None:
        """D_m(k, gap) for each k (None: never timed)."""
        coef = self._draft_coef(drafter)
        if coef is None:
            return None
        return coef[0] * (np.asarray(k, dtype=np.float64) + 1.0) + coef[1] * max(gap - 1.0, 0.0)

    def has_draft_cost(self, drafter: str) -> bool:
        """draft_cost(drafter, ..) is not None (without computing it)."""
        fit = self.draft_lines.get(drafter)
        return fit is not None and fit.count > 0

    def sync_cost(self, drafter: str, gap: int) -> float | None:
        """D_m(k, gap) - D_m(k, 1), the same for every k: the lazy sync of gap - 1 tokens (None: never timed)."""
        coef = self._draft_coef(drafter)
        return None if coef is None else float(coef[1]) * max(gap - 1.0, 0.0)

    # -- files -------------------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return {"decay": self.decay,
                "cells": [[n, b, w, m] for (n, b), (w, m) in sorted(self.cells.items())],
                "verify_line": self.verify_line.to_list(), "post_line": self.post_line.to_list(),
                "draft_lines": {k: v.to_list() for k, v in self.draft_lines.items()}}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> CostModel:
        """A saved model as a prior: every part weighs at most PRIOR_WEIGHT measurements."""
        m = cls(float(data.get("decay", 0.98)))
        for n, b, w, mean in data.get("cells", []):
            if float(w) > 0:
                m.cells[(int(n), int(b))] = [min(float(w), PRIOR_WEIGHT), float(mean)]
        m.verify_line.load(data["verify_line"], PRIOR_WEIGHT * max(1, len(m.cells)))
        m.post_line.load(data["post_line"], PRIOR_WEIGHT)
        for name, fit in data.get("draft_lines", {}).items():
            m.draft_lines[name] = LinearFit(2, m.decay)
            m.draft_lines[name].load(fit, PRIOR_WEIGHT * 4)
        return m


CostModelSource = CostModel | dict[str, Any] | str | Path | None
POOL_WEIGHT = 8.0   # the survival's pooled hazard counts this many positions at the prior (draft_length.py)


def load_cost_model(src: CostModelSource,
                    decay: float) -> tuple[CostModel, DraftLengthController]:
    """(cost model, survival) from a CostModel, a saved dict, a JSON file, or fresh (None)."""
    accept = DraftLengthController(decay=decay, pool_weight=POOL_WEIGHT)
    if src is None:
        return CostModel(decay), accept
    if isinstance(src, CostModel):
        return src, accept
    data = src if isinstance(src, dict) else json.loads(Path(src).read_text())
    if "cost" not in data:
        raise ValueError("cost model: not a file written by `llama-spec tune --save` (no 'cost' entry)")
    accept.load(data.get("survival", []))
    return CostModel.from_dict(data["cost"]), accept
