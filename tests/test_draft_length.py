"""Adaptive draft length (llama_spec/draft_length.py): survival, the cost line, the cut.

The cut is checked against a brute-force evaluation of its definition, and end to end only
for what must hold whatever it decides: greedy output equals plain decoding.
"""

from __future__ import annotations

import numpy as np
import pytest

from llama_spec.generation.draft_length import DraftLengthController


def brute_cut(survival: list[float], a: float, b: float) -> int:
    best, best_rate = 1, -1.0
    for L in range(1, len(survival) + 1):
        rate = (1.0 + sum(survival[:L])) / (a + b * (L + 1))
        if rate > best_rate:
            best, best_rate = L, rate
    return best


def test_no_cut_before_two_batch_sizes_are_timed():
    c = DraftLengthController()
    assert c.cut("d", 48) == 48
    c.record_decode(1, 0.05)
    c.record_decode(1, 0.05)
    assert c.cost_line() is None and c.cut("d", 48) == 48
    c.record_decode(8, 0.19)
    assert c.cost_line() is not None


def test_cost_line_fits_a_line_exactly():
    c = DraftLengthController(decay=1.0)
    for n in (1, 2, 4, 8, 16, 48):
        c.record_decode(n, 0.04 + 0.0115 * n)
    a, b = c.cost_line()
    assert a == pytest.approx(0.04, abs=1e-9) and b == pytest.approx(0.0115, abs=1e-9)


def test_survival_counts_reached_and_kept_positions():
    c = DraftLengthController(prior_keep=0.5, prior_weight=1.0, decay=1.0)
    c.record_verify("d", 5, 2)     # positions 0, 1 kept, 2 rejected, 3-4 never verified
    c.record_verify("d", 5, 5)     # all kept
    c.record_verify("d", 2, 0)     # position 0 rejected
    # hazards: j=0: kept 2 of 3 reached; j=1: 2 of 2; j=2: 1 of 2; j=3, 4: 1 of 1; the prior (weight 1)
    # is the pooled hazard 7/9 (above prior_keep 0.5)
    pr = 7 / 9
    want = np.cumprod([(2 + pr) / (3 + 1), (2 + pr) / (2 + 1), (1 + pr) / (2 + 1), (1 + pr) / 2, (1 + pr) / 2])
    np.testing.assert_allclose(c.survival("d", 5), want)
    np.testing.assert_allclose(c.survival("other", 2), [0.5, 0.25])   # drafters apart: prior_keep alone
    c.record_verify("d", 0, 0)     # nothing drafted: nothing recorded
    np.testing.assert_allclose(c.survival("d", 5), want)


@pytest.mark.parametrize("seed", range(20))
def test_cut_is_the_argmax_of_expected_tokens_per_second(seed):
    rng = np.random.default_rng(seed)
    c = DraftLengthController(decay=1.0)
    a, b = rng.uniform(0.01, 0.1), rng.uniform(0.001, 0.05)
    for n in (1, 3, 9):
        c.record_decode(n, a + b * n)
    keep = rng.uniform(0.2, 0.98, size=12)
    for _ in range(int(rng.integers(1, 40))):
        n_d = int(rng.integers(1, 13))
        k = 0
        while k < n_d and rng.random() < keep[k]:
            k += 1
        c.record_verify("d", n_d, k)
    n = int(rng.integers(2, 13))
    assert c.cut("d", n) == brute_cut(list(c.survival("d", n)), *c.cost_line())


def test_cut_is_short_when_drafts_fail_early_and_long_when_they_are_kept():
    c = DraftLengthController(decay=1.0)
    for n in (1, 4, 16, 48):
        c.record_decode(n, 0.04 + 0.0115 * n)
    for _ in range(50):
        c.record_verify("bad", 48, 1)     # the second draft is always rejected
        c.record_verify("good", 48, 48)
    assert c.cut("bad", 48) <= 2
    assert c.cut("good", 48) >= 16   # the prior (0.7, weight 2) still shaves 1 % off each hazard


def test_bad_settings_are_refused():
    for kw in ({"prior_keep": 0.0}, {"prior_keep": 1.0}, {"prior_weight": 0.0}, {"decay": 0.0}):
        with pytest.raises(ValueError, match="draft length"):
            DraftLengthController(**kw)


def test_adaptive_greedy_equals_plain_decoding(smollm):
    from llama_spec import SamplerParams
    from llama_spec.drafters.chain import ChainDrafter
    from llama_spec.drafters.ngram import NgramModDrafter, NgramSimpleDrafter
    from llama_spec.generation.solo import SpeculativeGenerator

    prompt = ("Copy the following list exactly, twice.\n"
              + "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu\n" * 3)
    greedy = SamplerParams(temp=0.0)
    plain = SpeculativeGenerator(smollm, None, n_ctx=1024)
    try:
        want = plain.generate(prompt, sampling=greedy, n_predict=64).tokens
    finally:
        plain.close()
    for drafter in (NgramSimpleDrafter(3, 16), ChainDrafter([NgramModDrafter(4, 16, 2), NgramSimpleDrafter(3, 16)])):
        gen = SpeculativeGenerator(smollm, drafter, n_ctx=1024, n_max=16, adaptive_draft=True)
        try:
            res = gen.generate(prompt, sampling=greedy, n_predict=64)
        finally:
            gen.close()
        assert res.tokens == want
        assert res.stats.accepted > 0 and gen.draft_length is not None and gen.draft_length.cost_line() is not None


def test_a_few_short_drafts_kept_whole_do_not_make_unseen_positions_certain():
    # the controller's survival (pool_weight 8): after drafts of 2 and 3 kept whole, position 20 is
    # unseen; the old pooled prior (pool_weight 0) made its hazard 1.0 and a 64-token draft looked
    # certain to be kept, which at temp 0.8 verified 64 drafts to keep 13
    shrunk = DraftLengthController(decay=1.0, pool_weight=8.0)
    old = DraftLengthController(decay=1.0)
    for c in (shrunk, old):
        c.record_verify("ng", 2, 2)
        c.record_verify("ng", 3, 3)
    assert old.survival("ng", 20)[-1] == pytest.approx(1.0)        # the broken variant
    s = shrunk.survival("ng", 20)
    assert s[2] > 0.55 and s[-1] < 0.05, s
    # many long drafts kept whole still earn long cuts: the pooled hazard goes to the data
    for _ in range(30):
        shrunk.record_verify("ng", 40, 40)
    assert shrunk.survival("ng", 40)[-1] > 0.9
