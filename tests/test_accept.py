"""Statistical and unit tests for llama_spec.kernels.token (the rejection rule).

Thresholds: every statistical check is sized so that a correct kernel fails in fewer than
1 in 10,000 runs over random seeds (Bonferroni over the checks of one family); the seeds here
are fixed, so CI is deterministic. test_broken_rule_is_detected shows the checks can fail.
"""

from __future__ import annotations

import functools

import numpy as np
import pytest
from scipy import stats

from llama_spec.kernels import token as A
from llama_spec.kernels.block import accept_draft
from llama_spec.testing import reference as R

N_VOCAB = 1000
N_TRIALS = 100_000
SHAPES = ("q_equals_p", "q_flatter", "q_topk", "q_partly_outside")
# Family-wise false-alarm budget 1e-4, split over the four shapes (Bonferroni).
P_VALUE_MIN = 1e-4 / len(SHAPES)
# Two-sided normal quantile for the same budget: |z| > 4.22 with probability 2.5e-5 per shape.
Z_MAX = float(stats.norm.isf(P_VALUE_MIN / 2))


def _normalized_f32(w):
    """float32 probabilities summing to 1 in float64 up to float32 rounding."""
    return (np.asarray(w, np.float64) / np.sum(w)).astype(np.float32)


def _softmax(x):
    e = np.exp(x - np.max(x))
    return e / e.sum()


@functools.cache
def _base_p():
    """p over 60 tokens of a 1,000-token vocabulary, plus 5 near-impossible tokens (p ~ 1e-6)
    so the chi-square helper must merge small-expected cells."""
    rng = np.random.default_rng(1234)
    ids = rng.choice(N_VOCAB, size=65, replace=False).astype(np.int32)
    logits = rng.normal(0.0, 2.0, size=65)
    logits[60:] = logits[:60].max() - 14.0
    return ids, logits, _normalized_f32(_softmax(logits))


def _make_shape(name, p_ids, logits, p, *, n_vocab, top, n_mixed, seed):
    """(p_ids, p, q_ids, q) for one of the four proposal shapes over the base p."""
    order = np.argsort(-p)
    if name == "q_equals_p":
        return p_ids, p, p_ids.copy(), p.copy()
    if name == "q_flatter":  # the drafter at temperature 2 relative to the target
        return p_ids, p, p_ids.copy(), _normalized_f32(_softmax(logits / 2.0))
    if name == "q_topk":  # drafter truncated to p's top `top`
        sel = order[:top]
        return p_ids, p, p_ids[sel].copy(), _normalized_f32(p[sel])
    if name == "q_partly_outside":  # top n_mixed of p plus n_mixed tokens p gives probability 0
        rng = np.random.default_rng(seed)
        outside = np.setdiff1d(np.arange(n_vocab), p_ids)
        extra = rng.choice(outside, size=n_mixed, replace=False).astype(np.int32)
        q_ids = np.concatenate([p_ids[order[:n_mixed]], extra]).astype(np.int32)
        q_logits = np.concatenate([logits[order[:n_mixed]] / 1.5, rng.normal(0.0, 1.0, n_mixed)])
        return p_ids, p, q_ids, _normalized_f32(_softmax(q_logits))
    raise KeyError(name)


@functools.cache
def _shape(name):
    return _make_shape(name, *_base_p(), n_vocab=N_VOCAB, top=10, n_mixed=15, seed=99)


def _draw_drafts(q_ids, q, n, seed):
    """Draft tokens drawn from q with numpy's RNG (the kernel's RNG decides acceptance)."""
    rng = np.random.default_rng(seed)
    q64 = q.astype(np.float64) / q.astype(np.float64).sum()
    return q_ids[rng.choice(q_ids.shape[0], size=n, p=q64)]


@functools.cache
def _run_shape(name):
    """100,000 single-step trials of the kernel: (emitted tokens, accepted flags)."""
    p_ids, p, q_ids, q = _shape(name)
    drafts = _draw_drafts(q_ids, q, N_TRIALS, seed=SHAPES.index(name) + 7)
    state = A.new_rng_state(2024 + SHAPES.index(name))
    scratch = A.new_scratch(N_VOCAB)
    kernel = A.accept_step_kernel
    emitted = np.empty(N_TRIALS, np.int64)
    accepted = np.empty(N_TRIALS, bool)
    for t, d in enumerate(drafts.tolist()):
        emitted[t], accepted[t] = kernel(p_ids, p, d, q_ids, q, state, scratch)
    assert not scratch.any(), "scratch must be left all zero"
    return emitted, accepted


def chisquare_pvalue(emitted, p_ids, p, n_vocab=N_VOCAB):
    """Chi-square goodness of fit of the emitted tokens to p. Tokens outside p's support must
    never appear (asserted: their expected count is 0). Cells with expected count < 5 are
    merged into one pooled cell (and that into the smallest other cell if still < 5), the
    usual validity condition for the chi-square approximation."""
    counts = np.bincount(emitted, minlength=n_vocab)
    obs = counts[p_ids].astype(np.float64)
    assert obs.sum() == emitted.shape[0], "a token outside p's support was emitted"
    exp = p.astype(np.float64) / p.astype(np.float64).sum() * obs.sum()
    small = exp < 5.0
    if small.any():
        obs = np.append(obs[~small], obs[small].sum())
        exp = np.append(exp[~small], exp[small].sum())
        if exp[-1] < 5.0 and exp.shape[0] > 1:
            j = int(np.argmin(exp[:-1]))
            obs[j] += obs[-1]
            exp[j] += exp[-1]
            obs, exp = obs[:-1], exp[:-1]
    return float(stats.chisquare(obs, exp).pvalue)


# ---------------------------------------------------------------------------------------------
# 1. Greedy: rejection rule == exact-match rule, and no randomness consumed.


def test_greedy_equivalence_and_no_randomness():
    rng = np.random.default_rng(11)
    state = A.new_rng_state(5)
    before = state.copy()
    scratch = A.new_scratch(N_VOCAB)
    same = 0
    for _ in range(10_000):
        n = int(rng.integers(1, 20))
        p_ids = rng.choice(N_VOCAB, size=n, replace=False).astype(np.int32)
        p = np.zeros(n, np.float32)  # one-hot, possibly with zero-probability support
        forced_at = int(rng.integers(n))
        p[forced_at] = 1.0
        forced = int(p_ids[forced_at])
        draft = forced if rng.random() < 0.5 else int(rng.integers(N_VOCAB))
        q_ids = np.array([draft], np.int32)
        q = np.ones(1, np.float32)
        token, accepted = A.accept_step_kernel(p_ids, p, draft, q_ids, q, state, scratch)
        # exact-match: the target's token is `forced`; the draft is kept only if equal.
        assert bool(accepted) == (draft == forced)
        assert token == forced
        assert np.array_equal(state, before), "a one-hot p must consume no randomness"
        same += 1
    assert same == 10_000


# ---------------------------------------------------------------------------------------------
# 2. Emitted tokens are distributed as p, for four proposal shapes.


@pytest.mark.parametrize("name", SHAPES)
def test_emitted_distribution_is_p(name):
    p_ids, p, _, _ = _shape(name)
    emitted, _ = _run_shape(name)
    pvalue = chisquare_pvalue(emitted, p_ids, p)
    assert pvalue > P_VALUE_MIN, f"{name}: chi-square p-value {pvalue:.3g}"


LARGE_VOCAB = 5_000


@functools.cache
def _large_shape(name):
    """The four shapes on a support of 3,000 tokens (of 5,000): large enough for the kernel's
    rejection-from-p residual draw (A._LARGE_SUPPORT), still cheap for 100,000 trials.
    q_topk keeps 64 tokens, as the mirror sampler's clamp gives."""
    n = 3_000
    assert n >= A._LARGE_SUPPORT
    rng = np.random.default_rng(4321)
    p_ids = rng.choice(LARGE_VOCAB, size=n, replace=False).astype(np.int32)
    logits = rng.normal(0.0, 2.5, size=n)
    p = _normalized_f32(_softmax(logits))
    return _make_shape(name, p_ids, logits, p, n_vocab=LARGE_VOCAB, top=64, n_mixed=32, seed=4322)


@pytest.mark.parametrize("name", SHAPES)
def test_emitted_distribution_is_p_on_a_large_support(name):
    """Same check through the large-support path (residual drawn by rejection from p).
    Same per-shape threshold as above: a correct kernel fails each with probability 2.5e-5."""
    p_ids, p, q_ids, q = _large_shape(name)
    drafts = _draw_drafts(q_ids, q, N_TRIALS, seed=SHAPES.index(name) + 70)
    state = A.new_rng_state(7000 + SHAPES.index(name))
    scratch = A.new_scratch(LARGE_VOCAB)
    emitted = np.empty(N_TRIALS, np.int64)
    n_rejected = 0
    for t, d in enumerate(drafts.tolist()):
        emitted[t], ok = A.accept_step_kernel(p_ids, p, d, q_ids, q, state, scratch)
        n_rejected += not ok
    assert not scratch.any()
    if name != "q_equals_p":
        assert n_rejected > 1_000  # the recovered path really ran
    pvalue = chisquare_pvalue(emitted, p_ids, p, n_vocab=LARGE_VOCAB)
    assert pvalue > P_VALUE_MIN, f"{name}: chi-square p-value {pvalue:.3g}"


# ---------------------------------------------------------------------------------------------
# 3. Acceptance rate = sum_y min(p(y), q(y)), well above the exact-match rate.


def _expected_rates(name):
    p_ids, p, q_ids, q = _shape(name)
    p_dense = np.zeros(N_VOCAB)
    q_dense = np.zeros(N_VOCAB)
    p_dense[p_ids] = p / p.astype(np.float64).sum()
    q_dense[q_ids] = q / q.astype(np.float64).sum()
    alpha = float(np.minimum(p_dense, q_dense).sum())
    exact_match_sampled = float((p_dense * q_dense).sum())  # target draw == sampled draft
    exact_match_greedy = float(p_dense[np.argmax(q_dense)])  # target draw == argmax q
    return alpha, max(exact_match_sampled, exact_match_greedy)


@pytest.mark.parametrize("name", SHAPES)
def test_acceptance_rate(name):
    _, accepted = _run_shape(name)
    rate = accepted.mean()
    alpha, exact_match = _expected_rates(name)
    se = np.sqrt(alpha * (1.0 - alpha) / N_TRIALS)
    if name == "q_equals_p":
        assert rate == 1.0  # p(x) >= q(x) for every draft: accepted without randomness
    else:
        assert abs(rate - alpha) <= Z_MAX * se, f"{name}: rate {rate} vs {alpha} (se {se:.2g})"
    # "Well above": at least 0.1 absolute over the better of the two exact-match rates.
    assert rate > exact_match + 0.1, f"{name}: rate {rate} vs exact-match {exact_match}"


# ---------------------------------------------------------------------------------------------
# 4. Forced position: p one-hot on f -> any other draft is rejected and f is emitted.


def test_forced_position():
    rng = np.random.default_rng(3)
    state = A.new_rng_state(8)
    before = state.copy()
    scratch = A.new_scratch(N_VOCAB)
    for _ in range(2_000):
        n = int(rng.integers(1, 50))
        p_ids = rng.choice(N_VOCAB, size=n, replace=False).astype(np.int32)
        p = np.zeros(n, np.float32)
        p[int(rng.integers(n))] = 1.0
        forced = int(p_ids[p > 0][0])
        m = int(rng.integers(2, 64))
        q_ids = rng.choice(N_VOCAB, size=m, replace=False).astype(np.int32)
        q = _normalized_f32(rng.dirichlet(np.ones(m)))
        drafts = q_ids[(q_ids != forced) & (q > 0)]
        draft = int(rng.choice(drafts))
        token, accepted = A.accept_step_kernel(p_ids, p, draft, q_ids, q, state, scratch)
        assert not accepted and token == forced
        assert np.array_equal(state, before)
    assert not scratch.any()


# ---------------------------------------------------------------------------------------------
# 5. The distribution test can fail: recovering from p instead of the residual is detected.


def test_broken_rule_is_detected():
    name = "q_flatter"
    p_ids, p, q_ids, q = _shape(name)
    drafts = _draw_drafts(q_ids, q, N_TRIALS, seed=77)
    rng = np.random.default_rng(78)
    p64 = p.astype(np.float64) / p.astype(np.float64).sum()
    from_p = p_ids[rng.choice(p_ids.shape[0], size=N_TRIALS, p=p64)]
    state = A.new_rng_state(79)
    scratch = A.new_scratch(N_VOCAB)
    emitted = np.empty(N_TRIALS, np.int64)
    for t, d in enumerate(drafts.tolist()):
        token, accepted = A.accept_step_kernel(p_ids, p, d, q_ids, q, state, scratch)
        emitted[t] = token if accepted else from_p[t]  # the bug: p, not norm((p - q)+)
    pvalue = chisquare_pvalue(emitted, p_ids, p)
    assert pvalue < 1e-12, f"the broken rule was not detected (p-value {pvalue:.3g})"


# ---------------------------------------------------------------------------------------------
# 6. Full vocabulary.


def test_full_vocabulary_smoke():
    n_vocab = 151_936
    rng = np.random.default_rng(6)
    p_ids = rng.permutation(n_vocab).astype(np.int32)
    p = _softmax(rng.normal(0.0, 3.0, n_vocab))
    p[rng.random(n_vocab) < 0.05] = 0.0  # some support entries with p = 0
    p = _normalized_f32(p)
    top = np.argsort(-p)[:64]
    q_ids = p_ids[top].copy()
    q = _normalized_f32(_softmax(np.log(p[top].astype(np.float64) + 1e-30) / 1.5))
    scratch = A.new_scratch(n_vocab)
    state = A.new_rng_state(66)
    zero_p = set(p_ids[p == 0].tolist())
    n_rejected = 0
    for draft in list(q_ids[:8]) + list(q_ids[-8:]):
        res = A.accept_step(p_ids, p, int(draft), q_ids, q, state, scratch, n_vocab=n_vocab)
        assert 0 <= res.token < n_vocab and res.token not in zero_p
        assert res.token == draft if res.accepted else True
        n_rejected += not res.accepted
    # A draft with p = 0 must be rejected and recovered from the full-vocabulary residual.
    q2_ids = np.array(sorted(zero_p)[:2] + [int(q_ids[0])], np.int32)
    q2 = _normalized_f32([0.6, 0.2, 0.2])
    for _ in range(5):
        res = A.accept_step(p_ids, p, int(q2_ids[0]), q2_ids, q2, state, scratch, n_vocab=n_vocab)
        assert not res.accepted and res.token not in zero_p
    bonus = A.bonus_token_kernel(p_ids, p, state)
    assert bonus not in zero_p and 0 <= bonus < n_vocab
    assert not scratch.any()


# ---------------------------------------------------------------------------------------------
# Further unit tests: RNG, reference equivalence, bonus, multi-position, validation.


def test_rng_seed_expansion_and_checkpoint():
    # splitmix64 from 0: first output 0xE220A8397B1DCDAF (published test value).
    assert int(A.new_rng_state(0)[0]) == 0xE220A8397B1DCDAF
    assert np.array_equal(A.new_rng_state(42), A.new_rng_state(42))
    assert not np.array_equal(A.new_rng_state(42), A.new_rng_state(43))
    p_ids, p, q_ids, q = _shape("q_flatter")
    drafts = _draw_drafts(q_ids, q, 200, seed=1).tolist()
    scratch = A.new_scratch(N_VOCAB)

    def run(state):
        return [tuple(A.accept_step_kernel(p_ids, p, d, q_ids, q, state, scratch)) for d in drafts]

    state = A.new_rng_state(9)
    checkpoint = state.copy()
    first = run(state)
    state[:] = checkpoint  # restore
    assert run(state) == first
    assert run(A.new_rng_state(9)) == first


def test_kernel_matches_numpy_reference():
    """Same decisions, same tokens, same RNG state as the plain-numpy reference. Some supports
    are large (up to 20,000) so the checkpointed walk of _draw restarts mid-support."""
    rng = np.random.default_rng(21)
    n_vocab = 30_000
    s1, s2 = A.new_scratch(n_vocab), A.new_scratch(n_vocab)
    for case in range(1500):
        n = int(rng.integers(1, 300)) if case % 20 else int(rng.integers(300, 20_000))
        p_ids = rng.choice(n_vocab, size=n, replace=False).astype(np.int32)
        p = rng.dirichlet(np.full(n, rng.choice([0.05, 1.0, 10.0])))
        p[rng.random(n) < rng.choice([0.0, 0.5])] = 0.0
        if not p.any():
            p[0] = 1.0
        p = _normalized_f32(p)
        k = int(rng.integers(0, n + 1))
        q_ids = np.unique(np.concatenate([p_ids[:k], rng.choice(n_vocab, 8)]))[:64]
        q_ids = rng.permutation(q_ids).astype(np.int32)
        q = _normalized_f32(rng.dirichlet(np.ones(q_ids.shape[0])))
        draft = int(rng.choice(q_ids[q > 0]))
        st1 = A.new_rng_state(case)
        st2 = st1.copy()
        got = A.accept_step_kernel(p_ids, p, draft, q_ids, q, st1, s1)
        want = R.accept_step_reference(p_ids, p, draft, q_ids, q, st2, s2)
        assert (int(got[0]), bool(got[1])) == want
        assert np.array_equal(st1, st2)
        if case % 5 == 0:  # the bonus draw too
            b1 = A.bonus_token_kernel(p_ids, p, st1)
            if np.count_nonzero(p) > 1:
                assert b1 == R._reference_draw(p_ids, p.astype(np.float64), st2)
                assert np.array_equal(st1, st2)
    assert not s1.any() and not s2.any()


def test_bonus_token_is_distributed_as_p_and_greedy_is_free():
    p_ids, _, p = _base_p()
    state = A.new_rng_state(31)
    emitted = np.array([A.bonus_token_kernel(p_ids, p, state) for _ in range(50_000)])
    # One more check on its own: budget 1e-4 for this test alone.
    assert chisquare_pvalue(emitted, p_ids, p) > 1e-4
    one_hot = np.array([0.0, 1.0, 0.0], np.float32)
    before = state.copy()
    assert A.bonus_token_kernel(np.array([4, 5, 6], np.int32), one_hot, state) == 5
    assert np.array_equal(state, before)


def _padded(rows, dtype):
    width = max(len(r) for r in rows)
    out = np.zeros((len(rows), width), dtype)
    for i, r in enumerate(rows):
        out[i, : len(r)] = r
    return out, np.array([len(r) for r in rows], np.int64)


def test_accept_draft_matches_single_steps():
    rng = np.random.default_rng(41)
    for case in range(300):
        k = int(rng.integers(0, 6))
        p_rows, pp_rows, q_rows, qq_rows = [], [], [], []
        for _ in range(k + 1):
            n = int(rng.integers(1, 40))
            ids = rng.choice(N_VOCAB, size=n, replace=False).astype(np.int32)
            p_rows.append(ids)
            pp_rows.append(_normalized_f32(_softmax(rng.normal(0, 2, n))))
        drafts = []
        for i in range(k):  # q close to p, so several positions get accepted
            ids = p_rows[i][: max(1, len(p_rows[i]) // 2)]
            q_rows.append(ids)
            q = _normalized_f32(pp_rows[i][: len(ids)].astype(np.float64) + 0.01)
            qq_rows.append(q)
            q64 = q.astype(np.float64)
            drafts.append(int(rng.choice(ids, p=q64 / q64.sum())))
        pi, p_lens = _padded(p_rows, np.int32)
        pp, _ = _padded(pp_rows, np.float32)
        if k:
            qi, q_lens = _padded(q_rows, np.int32)
            qq, _ = _padded(qq_rows, np.float32)
        else:
            qi, qq, q_lens = np.zeros((0, 1), np.int32), np.zeros((0, 1), np.float32), np.zeros(0)
            q_lens = q_lens.astype(np.int64)
        d = np.array(drafts, np.int64)
        state = A.new_rng_state(case)
        ref_state = state.copy()
        emitted, n_acc = accept_draft(pi, pp, p_lens, d, qi, qq, q_lens, state, n_vocab=N_VOCAB)
        fast_state = ref_state.copy()
        emitted_fast, n_fast = accept_draft(
            pi, pp, p_lens, d, qi, qq, q_lens, fast_state, A.new_scratch(N_VOCAB), validate=False
        )
        assert n_fast == n_acc and np.array_equal(emitted_fast, emitted)
        # The same decisions, one position at a time.
        want = []
        scratch = A.new_scratch(N_VOCAB)
        for i in range(k):
            tok, acc = A.accept_step(p_rows[i], pp_rows[i], drafts[i], q_rows[i], qq_rows[i],
                                     ref_state, scratch)
            want.append(tok)
            if not acc:
                break
        else:
            want.append(int(A.bonus_token_kernel(p_rows[k], pp_rows[k], ref_state)))
        assert emitted.tolist() == want and n_acc == len(want) - 1
        assert emitted[:n_acc].tolist() == drafts[:n_acc]
        assert np.array_equal(state, ref_state)


def _valid():
    return dict(
        p_ids=np.array([3, 7, 9], np.int32),
        p_probs=np.array([0.5, 0.3, 0.2], np.float32),
        draft_token=7,
        q_ids=np.array([7, 11], np.int32),
        q_probs=np.array([0.9, 0.1], np.float32),
        rng_state=A.new_rng_state(1),
    )


BAD_INPUTS = {
    "length mismatch": dict(p_probs=np.array([0.5, 0.5], np.float32)),
    "NaN": dict(p_probs=np.array([0.5, np.nan, 0.5], np.float32)),
    "inf": dict(q_probs=np.array([np.inf, 0.1], np.float32)),
    "negative": dict(p_probs=np.array([0.6, 0.5, -0.1], np.float32)),
    "id out of range": dict(p_ids=np.array([3, 7, 1000], np.int32)),
    "negative id": dict(q_ids=np.array([7, -1], np.int32)),
    "duplicate ids": dict(p_ids=np.array([3, 7, 7], np.int32)),
    "empty support": dict(q_ids=np.array([], np.int32), q_probs=np.array([], np.float32)),
    "draft not in q": dict(draft_token=3),
    "draft has q = 0": dict(q_probs=np.array([0.0, 1.0], np.float32)),
    "float ids": dict(p_ids=np.array([3.0, 7.0, 9.0])),
    "int probs": dict(p_probs=np.array([1, 0, 0])),
    "2-D ids": dict(p_ids=np.array([[3, 7, 9]], np.int32)),
    "bool draft": dict(draft_token=True),
    "str draft": dict(draft_token="7"),
    "rng wrong dtype": dict(rng_state=np.zeros(4, np.int64)),
    "rng all zero": dict(rng_state=np.zeros(4, np.uint64)),
    "scratch too short": dict(scratch=np.zeros(5, np.float32)),
    "scratch wrong dtype": dict(scratch=np.zeros(1000, np.float64)),
    "scratch not zero": dict(scratch=np.ones(1000, np.float32)),
}


@pytest.mark.parametrize("case", sorted(BAD_INPUTS))
def test_validation_raises_value_error(case):
    kwargs = _valid() | BAD_INPUTS[case]
    with pytest.raises(ValueError) as info:
        A.accept_step(**kwargs, n_vocab=1000)
    assert not isinstance(info.value, A.UnnormalizedError)


def test_unnormalized_is_reported_not_silently_used():
    kwargs = _valid() | dict(p_probs=np.array([0.5, 0.3, 0.1], np.float32))
    with pytest.raises(A.UnnormalizedError) as info:
        A.accept_step(**kwargs)
    assert info.value.which == "p" and abs(info.value.total - 0.9) < 1e-6
    assert not A.p_is_normalized(kwargs["p_probs"])
    assert A.p_is_normalized(np.array([0.5, 0.3, 0.2005], np.float32))
    assert not A.p_is_normalized(np.array([np.nan, 1.0], np.float32))


def test_wrapper_converts_dtypes():
    kwargs = _valid() | dict(
        p_ids=[3, 7, 9], p_probs=np.array([0.5, 0.3, 0.2]), q_ids=np.array([7, 11], np.int64)
    )
    res = A.accept_step(**kwargs)
    assert isinstance(res, A.AcceptResult) and res.token in (3, 7, 9)
    want = A.accept_step(**_valid())  # the same call with the canonical dtypes
    assert res == want
