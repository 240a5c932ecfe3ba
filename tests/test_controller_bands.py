"""Survival across bands (generation/bands.py, the controller's ``borrow_bands``): a band new to a
member starts from the member's other bands, so it has no cold turns there.

Exact values on hand-made counts, then the controller on synthetic costs (tests/test_controller.py's
``simulate``): what the first request of a new band does with and without borrowing (the broken
variant: ``borrow_bands=False``, the cold turns of before)."""

from __future__ import annotations

import numpy as np

from llama_spec.generation.bands import band_survival, other_bands
from llama_spec.generation.controller import SpecController
from llama_spec.generation.draft_length import DraftLengthController
from tests.test_controller import line, simulate


def _counts() -> DraftLengthController:
    """Member "d": 10 greedy verifications of 3 drafts, each keeping the first only (no decay)."""
    acc = DraftLengthController(prior_keep=0.7, prior_weight=2.0, decay=1.0, pool_weight=0.0)
    for _ in range(10):
        acc.record_verify(("d", "greedy", False), 3, 1)
    acc.record_verify(("e", "token/t<1", False), 3, 3)   # another member: never borrowed by "d"
    return acc


def test_a_new_band_starts_from_the_members_other_bands_scaled_to_the_borrowed_weight():
    acc = _counts()
    assert other_bands(acc, "d", "token/t<1") == [("d", "greedy", False)]
    # borrowed at weight 1: reached (1, 1, 0), kept (1, 0, 0); the pooled 1/2 is under prior_keep 0.7,
    # so hazards (1 + 1.4) / 3, (0 + 1.4) / 3, then the prior 0.7
    want = np.cumprod([2.4 / 3, 1.4 / 3, 0.7])
    np.testing.assert_allclose(band_survival(acc, "d", "token/t<1", None, 3, borrow=1.0), want)
    np.testing.assert_allclose(band_survival(acc, "d", "token/t<1", False, 3, borrow=1.0), want)
    # no borrowing (or a full flag the other bands never saw): the flat prior
    flat = np.cumprod([0.7] * 3)
    np.testing.assert_allclose(band_survival(acc, "d", "token/t<1", None, 3, borrow=0.0), flat)
    np.testing.assert_allclose(band_survival(acc, "d", "token/t<1", True, 3, borrow=1.0), flat)
    # the member's own band is never topped up by itself: greedy reads its 10 verifications only
    np.testing.assert_allclose(band_survival(acc, "d", "greedy", None, 3, borrow=1.0),
                               np.cumprod([(10 + 1.4) / 12, 1.4 / 12, 0.7]))


def test_a_band_with_its_own_verifications_borrows_only_what_they_lack():
    acc = _counts()
    acc.record_verify(("d", "token/t<1", False), 2, 2)   # half of the weight of 2 is its own
    # own: reached (1, 1), kept (1, 1); borrowed at weight 1 (2 - 1): reached (1, 1, 0), kept (1, 0, 0);
    # pooled (1 + 1 + 1) / (2 + 2) = 0.75 over the prior
    got = band_survival(acc, "d", "token/t<1", None, 3, borrow=2.0)
    np.testing.assert_allclose(got, np.cumprod([(2 + 1.5) / 4, (1 + 1.5) / 4, 0.75]))
    # at weight 1 the band's own verification is enough: nothing borrowed
    got = band_survival(acc, "d", "token/t<1", None, 3, borrow=1.0)
    np.testing.assert_allclose(got, np.cumprod([(1 + 2.0) / 3, (1 + 2.0) / 3, 1.0]))


_COST = line(0.030, 0.006)


def _first_request_at_temp(borrow: bool, keep_greedy: float, keep_new: float, steps: int, draft_s: float):
    """A process that decoded greedy requests (slot 0 learns member "d" at keep_greedy), then its
    first request at temp 0.8 (both draft modes: new bands) on a new slot: its choices."""
    ctl = SpecController(borrow_bands=borrow)
    _, _, greedy = simulate(ctl, 200, cost=_COST, accept={"d": keep_greedy}, draft_s={"d": draft_s})
    _, _, ch = simulate(ctl, steps, cost=_COST, accept={"d": keep_new, "d argmax": keep_new},
                        draft_s={"d": draft_s}, modes=[True], argmax_band="exact-match/t<1", begin=True, seed=1)
    return greedy, ch


def test_a_member_that_lost_in_greedy_gets_no_cold_turns_in_a_new_band():
    # (18 ms per drafted token against a 36 ms plain step: it loses at 10 % kept)
    _, ch = _first_request_at_temp(True, 0.1, 0.1, 40, 0.018)
    assert [w for w, _ in ch] == [None] * 40, ch
    # the broken variant (the cold turns of before): both draft modes drafted at full length first
    _, cold = _first_request_at_temp(False, 0.1, 0.1, 40, 0.018)
    assert {w for w, k in cold[:4] if k == 5} == {"d", "d argmax"}, cold[:4]


def test_a_member_that_paid_in_greedy_is_tried_in_a_new_band_by_prediction_and_dropped_where_it_loses():
    # (4 ms per drafted token: at 90 % kept it pays, and the greedy requests chose it)
    greedy, ch = _first_request_at_temp(True, 0.9, 0.1, 60, 0.004)
    assert sum(w == "d" for w, _ in greedy[100:]) > 90, greedy[100:]
    assert ch[0][0] == "d" and ch[1][0] == "d argmax", ch[:2]   # tried at once: predicted from greedy
    assert all(k == 0 for _, k in ch[4:19]), ch   # two losing verifications per mode turn it to plain
    # what a wrong prior costs is what the cold turns cost (borrowing off): no more drafts verified
    _, cold = _first_request_at_temp(False, 0.9, 0.1, 60, 0.004)
    assert sum(k for _, k in ch) <= sum(k for _, k in cold), (ch, cold)
