"""Adaptive draft length: cut each proposal to the length that maximises expected tokens per second.

Words, used below exactly:

- **cut**: how many of a proposal's draft tokens are verified (a prefix; 1 <= cut <= its length).
- **survival** S(i): the probability that drafts 1..i of a proposal are all kept. It is the product
  of the **hazards** h(j) = P(draft j kept | drafts 1..j-1 kept), counted per drafter key (a chain's
  members apart) over past verifications, decayed by ``decay`` per verification, with a prior of
  weight ``prior_weight``: the pooled hazard of all positions (kept / verified; with
  ``pool_weight`` > 0 shrunk towards ``prior_keep`` as if that many positions had kept it), at
  least ``prior_keep``. Why pooled: a cut censors the positions after it, so they keep their prior;
  a fixed 0.7 there never let the cut grow again (91 % of the verified n-gram drafts were kept and
  the run was slower than without cutting, session 7). Why shrunk (the speculation controller's,
  pool_weight 8): two short drafts kept whole made the pooled hazard 1.0, so every unseen position
  looked certain and a 64-token n-gram draft was verified at temp 0.8 (1.3 s, 26 plain steps, for
  13 tokens kept).
- **cost** c(n): seconds for the target to decode a verification batch of n tokens, a line
  a + b n fitted by decayed least squares to the measured decodes (batched CPU decodes grow about
  linearly: 31.6 ms at n = 1, 94.7 at 4, 186 at 16, 483 at 48 for the 1.5B on 2 cores here,
  scripts/bench_verify_cost.py).
- the cut chosen: argmax over L of (1 + S(1) + .. + S(L)) / c(L + 1).

Why: a verification of n tokens costs far more than one token on a CPU (15x at n = 48 above),
and n-gram drafts run up to 48-64 tokens of which about half are kept; verifying the likely-kept
prefix only is cheaper. Exactness is untouched: a prefix of a draft is itself a draft from the
same q (drafts are drawn one position after another), and greedy output does not depend on the
drafts at all. Until two batch sizes have been timed the proposal is not cut.

The controller's ramp (``controller.Plan._cut``): when the arm's last verification kept all of its k
drafts, the next cut of the same arm is the longest of k_best + 1 .. min(2 k, its length) predicted
at >= ``RAMP_KEEP`` (0.95) of the best cut's rate, if any; ``RAMP_KEEP_COPIES`` (0.6) where the
member's drafts in this band were kept whole ``CALIB_COPIES`` (1.25) x as often as the survival
model predicted (``copies``: the calibration of S(k) at the cuts verified). Why: survival is per
position and a cut censors the positions after it, so the prior rules there; but n-gram drafts are
often copies, kept or lost together (an edit prompt's 44-token copy, all kept, was cut to 1-3 per
step: 16.5 t/s, against 21.7 verifying it whole; session 12). The ramp reaches a long copy in a few
steps, at a bounded price where drafts are lost one by one (the model's own assumption): 1-3 % in
simulation.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

MAX_LEN = 64  # N_MAX_LIMIT of the generator: the longest proposal there is


@dataclass
class _Hazards:
    """Decayed counts per draft position j (0-based): verified there, and kept there."""

    reached: np.ndarray = field(default_factory=lambda: np.zeros(MAX_LEN))
    kept: np.ndarray = field(default_factory=lambda: np.zeros(MAX_LEN))


class DraftLengthController:
    """Per-drafter survival and the target's cost line; ``cut()`` before, ``record_*`` after."""

    def __init__(self, prior_keep: float = 0.7, prior_weight: float = 2.0, decay: float = 0.98,
                 pool_weight: float = 0.0) -> None:
        if (not 0.0 < prior_keep < 1.0 or prior_weight <= 0.0 or not 0.0 < decay <= 1.0
                or pool_weight < 0.0):
            raise ValueError("draft length: requires 0 < prior_keep < 1, prior_weight > 0, 0 < decay <= 1, "
                             "pool_weight >= 0")
        self.prior_keep, self.prior_weight, self.decay = prior_keep, prior_weight, decay
        self.pool_weight = pool_weight
        self._hz: dict[object, _Hazards] = {}
        self._fit = np.zeros(5)         # decayed sums: w, w n, w n^2, w t, w n t
        self._sizes: set[int] = set()   # batch sizes timed so far

    # -- measurements ----------------------------------------------------------------------------
    def record_decode(self, n_tokens: int, seconds: float) -> None:
        """A verification decode of n_tokens took `seconds`."""
        n = float(n_tokens)
        self._fit = self._fit * self.decay + np.array([1.0, n, n * n, seconds, n * seconds])
        self._sizes.add(int(n_tokens))

    def record_verify(self, key: object, n_drafted: int, n_kept: int) -> None:
        """A verification of n_drafted drafts from drafter `key` kept the first n_kept."""
        if n_drafted <= 0:
            return
        h = self._hz.setdefault(key, _Hazards())
        h.reached *= self.decay
        h.kept *= self.decay
        reached = min(n_kept + 1, n_drafted)   # positions 0..n_kept were verified (the first reject included)
        h.reached[:reached] += 1.0
        h.kept[:n_kept] += 1.0

    # -- the decision ----------------------------------------------------------------------------
    def cost_line(self) -> tuple[float, float] | None:
        """(a, b) of c(n) = a + b n, or None before two batch sizes were timed."""
        w, sn, snn, st, snt = self._fit
        den = w * snn - sn * sn
        if len(self._sizes) < 2 or den <= 1e-12:
            return None
        b = (w * snt - sn * st) / den
        a = (st - b * sn) / w
        return float(a), float(max(b, 0.0))

    def survival(self, key: object, n: int) -> np.ndarray:
        """S(1) .. S(n) for drafter `key`, (n,) float64."""
        return self.survival_of([key], n)

    def survival_of(self, keys: list[object], n: int,
                    borrow: tuple[list[object], float] | None = None) -> np.ndarray:
        """S(1) .. S(n) over the counts of several keys together (a report's pooled curve).
        borrow (keys, w): the counts of those keys too, scaled to at most w verifications (a prior
        from elsewhere: a band never seen starts from the member's other bands, controller.py)."""
        h = self._summed(keys)
        if borrow is not None and borrow[1] > 0.0:
            b = self._summed(borrow[0])
            b = _capped(b.reached, b.kept, borrow[1])
            h.reached, h.kept = h.reached + b.reached, h.kept + b.kept
        pw, w0, reached = self.prior_weight, self.pool_weight, h.reached.sum()
        pooled = (h.kept.sum() + self.prior_keep * w0) / (reached + w0) if reached + w0 > 0 else self.prior_keep
        prior = max(self.prior_keep, pooled)
        hazard = (h.kept[:n] + prior * pw) / (h.reached[:n] + pw)
        return np.cumprod(hazard)

    def _summed(self, keys: list[object]) -> _Hazards:
        h = _Hazards()
        for k in keys:
            if k in self._hz:
                h.reached = h.reached + self._hz[k].reached
                h.kept = h.kept + self._hz[k].kept
        return h

    def keys(self) -> list[object]:
        """The keys with counts."""
        return list(self._hz)

    def count(self, keys: list[object]) -> float:
        """Decayed number of verifications recorded under these keys."""
        return float(sum(self._hz[k].reached[0] for k in keys if k in self._hz))

    def cut(self, key: object, n_drafted: int) -> int:
        """The cut for a proposal of n_drafted tokens from drafter `key` (n_drafted when unknown)."""
        n = min(int(n_drafted), MAX_LEN)
        line = self.cost_line() if n > 1 else None
        if line is None:
            return n_drafted
        a, b = line
        lengths = np.arange(1, n + 1)
        expected = 1.0 + np.cumsum(self.survival(key, n))
        cost = np.maximum(a + b * (lengths + 1), 1e-9)
        return int(lengths[int(np.argmax(expected / cost))])

    # -- reports and files (the speculation controller, controller.py) ---------------------------------
    def pooled(self, label: Callable[[object], str] = str) -> dict[str, float]:
        """Kept / verified draft positions (decayed) over the keys of each label(key)."""
        sums: dict[str, list[float]] = {}
        for k, h in self._hz.items():
            acc = sums.setdefault(label(k), [0.0, 0.0])
            acc[0] += float(h.kept.sum())
            acc[1] += float(h.reached.sum())
        return {lab: kept / reached for lab, (kept, reached) in sums.items() if reached > 0}

    def export(self) -> list[list[object]]:
        """[key as a list, reached, kept] per key whose key is a tuple of str/bool (JSON-ready)."""
        n = MAX_LEN
        return [[list(k), h.reached[:n].round(4).tolist(), h.kept[:n].round(4).tolist()]
                for k, h in self._hz.items() if isinstance(k, tuple)]

    def capped(self, weight: float) -> DraftLengthController:
        """A copy whose counts are scaled to at most `weight` verifications per key: the same
        hazards, as a prior that a request's own verifications soon outweigh (controller.py)."""
        out = DraftLengthController(self.prior_keep, self.prior_weight, self.decay, self.pool_weight)
        out._hz = {key: _capped(h.reached, h.kept, weight) for key, h in self._hz.items()}
        return out

    def load(self, rows: list[list[object]], weight: float = 4.0) -> None:
        """Counts from ``export()``, scaled to at most `weight` verifications per key (a prior)."""
        for key, reached, kept in rows:
            h = _Hazards()
            r, k = np.asarray(reached, dtype=np.float64), np.asarray(kept, dtype=np.float64)
            h.reached[: len(r)], h.kept[: len(k)] = r, k
            self._hz[tuple(key)] = _capped(h.reached, h.kept, weight)  # type: ignore[arg-type]


def _capped(reached: np.ndarray, kept: np.ndarray, weight: float) -> _Hazards:
    """Counts (MAX_LEN,) scaled to at most `weight` verifications (reached[0]): the same hazards."""
    f = min(1.0, weight / reached[0]) if reached[0] > 0 else 0.0
    return _Hazards(reached * f, kept * f)
