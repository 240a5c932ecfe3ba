"""Hypothesis properties of llama_spec.kernels.token over arbitrary (p, q) pairs.

Arrays are built by numpy from a Hypothesis-drawn seed plus Hypothesis-drawn shape parameters
(support sizes 1-512, overlap, skew, zeros, probabilities down to 1e-30): cheap to generate,
and Hypothesis still searches the parameter space. derandomize=True keeps CI deterministic.
"""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from llama_spec.kernels import token as A
from llama_spec.testing import reference as R

SETTINGS = dict(
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow],
)


def _probs(rng, n, shape):
    """Probabilities (float32, sum 1 within float32 rounding) of one of several shapes."""
    if shape == "flat":
        w = np.ones(n)
    elif shape == "skewed":
        w = np.exp(rng.normal(0.0, 6.0, n))
    elif shape == "tiny":  # most entries down to ~1e-30, a few carry the mass
        w = 10.0 ** rng.uniform(-30, -1, n)
        w[rng.integers(n)] = 1.0
    elif shape == "zeros":  # explicit zero entries inside the support
        w = rng.dirichlet(np.ones(n))
        w[rng.random(n) < 0.5] = 0.0
        if not w.any():
            w[rng.integers(n)] = 1.0
    elif shape == "one_hot":
        w = np.zeros(n)
        w[rng.integers(n)] = 1.0
    else:
        w = rng.dirichlet(np.full(n, 0.1))
    p = (w / w.sum()).astype(np.float32)
    if not p.any():  # everything rounded away in float32: keep the largest
        p[np.argmax(w)] = 1.0
    return p


SHAPES = st.sampled_from(["flat", "skewed", "tiny", "zeros", "one_hot", "dirichlet"])


@st.composite
def cases(draw):
    """(p_ids, p, draft, q_ids, q, n_vocab): a valid single-step input."""
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    n_vocab = draw(st.integers(1, 5000))
    n = draw(st.integers(1, min(512, n_vocab)))
    m = draw(st.integers(1, min(512, n_vocab)))
    overlap = draw(st.floats(0.0, 1.0))
    p_ids = rng.choice(n_vocab, size=n, replace=False).astype(np.int32)
    shared = p_ids[: int(round(overlap * min(n, m)))]
    rest = np.setdiff1d(np.arange(n_vocab), shared)
    extra = rng.choice(rest, size=min(m - shared.shape[0], rest.shape[0]), replace=False)
    q_ids = rng.permutation(np.concatenate([shared, extra])).astype(np.int32)
    p = _probs(rng, n, draw(SHAPES))
    q = _probs(rng, q_ids.shape[0], draw(SHAPES))
    positive = np.flatnonzero(q > 0)
    draft = int(q_ids[positive[draw(st.integers(0, positive.shape[0] - 1))]])
    return p_ids, p, draft, q_ids, q, n_vocab


@settings(max_examples=1000, **SETTINGS)
@given(cases(), st.integers(0, 2**63))
def test_one_step_properties(case, seed):
    p_ids, p, draft, q_ids, q, n_vocab = case
    scratch = A.new_scratch(n_vocab)
    state = A.new_rng_state(seed)
    start = state.copy()
    token, accepted = A.accept_step(p_ids, p, draft, q_ids, q, state, scratch, n_vocab=n_vocab)

    p_of = dict(zip(p_ids.tolist(), p.tolist(), strict=True))
    q_of = dict(zip(q_ids.tolist(), q.tolist(), strict=True))
    px, qx = p_of.get(draft, 0.0), q_of[draft]
    assert p_of.get(token, 0.0) > 0.0, "the token must be in p's support with p > 0"
    if accepted:
        assert token == draft
    if px >= qx and px > 0.0:
        assert accepted and np.array_equal(state, start), "ratio >= 1: accepted, no randomness"
    if px == 0.0:
        assert not accepted
    if np.count_nonzero(p) == 1:  # greedy: exact match, no randomness
        assert token == int(p_ids[p > 0][0]) and accepted == (draft == token)
        assert np.array_equal(state, start)
    assert not scratch.any(), "scratch must be left all zero"

    # Same state -> same result and same final state; the numpy reference agrees.
    again = start.copy()
    assert tuple(A.accept_step_kernel(p_ids, p, draft, q_ids, q, again, scratch)) == (
        token, accepted)
    assert np.array_equal(again, state)
    ref_state = start.copy()
    assert R.accept_step_reference(p_ids, p, draft, q_ids, q, ref_state, scratch) == (
        token, accepted)
    assert np.array_equal(ref_state, state)


@settings(max_examples=150, **SETTINGS)
@given(cases(), st.integers(0, 2**63))
def test_bonus_in_support(case, seed):
    p_ids, p, _, _, _, _ = case
    state = A.new_rng_state(seed)
    token = A.bonus_token_kernel(p_ids, p, state)
    assert p[p_ids == token].sum() > 0


@settings(max_examples=150, **SETTINGS)
@given(cases(), st.data())
def test_duplicate_ids_rejected(case, data):
    p_ids, p, draft, q_ids, q, n_vocab = case
    which = data.draw(st.sampled_from(["p", "q"]))
    ids = p_ids if which == "p" else q_ids
    if ids.shape[0] < 2:
        ids = np.append(ids, ids[0]).astype(np.int32)
        probs = np.append(p if which == "p" else q, 0.0).astype(np.float32)
    else:
        ids = ids.copy()
        i, j = data.draw(st.lists(st.integers(0, ids.shape[0] - 1), min_size=2, max_size=2,
                                  unique=True))
        ids[j] = ids[i]
        probs = p if which == "p" else q
    args = (ids, probs, draft, q_ids, q) if which == "p" else (p_ids, p, draft, ids, probs)
    try:
        A.accept_step(*args, A.new_rng_state(0), n_vocab=n_vocab)
    except ValueError as e:
        assert "duplicate" in str(e)
    else:
        raise AssertionError("duplicate ids were accepted")


GARBAGE_FLOATS = st.sampled_from([np.nan, np.inf, -np.inf, -1.0, -1e-30, 0.0, 1e-30, 0.5, 1.0,
                                  2.0, 1e39, 3.4e38])
GARBAGE_INTS = st.sampled_from([-(2**40), -1, 0, 1, 7, 999, 1000, 2**31, 2**40])


def _garbage_array(data, kind):
    n = data.draw(st.integers(0, 6))
    dtype = data.draw(st.sampled_from(["int32", "int64", "uint8", "float32", "float64", "bool",
                                       "object", "2d"]))
    values = [data.draw(GARBAGE_INTS if kind == "ids" else GARBAGE_FLOATS) for _ in range(n)]
    if dtype == "object":
        return np.array(values + ["x"], dtype=object)
    if dtype == "2d":
        return np.array(values, dtype=np.float64).reshape(1, -1)
    with np.errstate(all="ignore"):
        try:
            return np.array(values).astype(dtype)
        except (OverflowError, ValueError):
            return np.array(values, dtype=np.float64)


@settings(max_examples=400, **SETTINGS)
@given(cases(), st.data())
def test_wrapper_only_raises_value_error(case, data):
    """Valid input corrupted in one place, or replaced by garbage: the wrapper returns a valid
    AcceptResult or raises ValueError -- never another exception, never a crash."""
    p_ids, p, draft, q_ids, q, n_vocab = case
    args = dict(p_ids=p_ids, p_probs=p, draft_token=draft, q_ids=q_ids, q_probs=q,
                rng_state=A.new_rng_state(1), scratch=None, n_vocab=n_vocab)
    for _ in range(data.draw(st.integers(1, 3))):
        key = data.draw(st.sampled_from(sorted(args)))
        if key in ("p_ids", "q_ids"):
            args[key] = _garbage_array(data, "ids")
        elif key in ("p_probs", "q_probs"):
            args[key] = _garbage_array(data, "probs")
        elif key == "draft_token":
            args[key] = data.draw(st.one_of(GARBAGE_INTS, GARBAGE_FLOATS, st.none(),
                                            st.just(True), st.just("7")))
        elif key == "rng_state":
            args[key] = data.draw(st.sampled_from([np.zeros(4, np.uint64),
                                                   np.ones(3, np.uint64),
                                                   np.ones(4, np.int64), None, [1, 2, 3, 4]]))
        elif key == "scratch":
            args[key] = data.draw(st.sampled_from([np.zeros(3, np.float32),
                                                   np.ones(6000, np.float32),
                                                   np.zeros(6000, np.float64), "scratch"]))
        else:
            args[key] = data.draw(st.one_of(st.none(), GARBAGE_INTS, st.just(1.5)))
    try:
        res = A.accept_step(**args)
    except ValueError as e:
        event(f"ValueError: {str(e).split(' ')[0]}")
        return
    event("returned a token")
    assert isinstance(res, A.AcceptResult)
    p_ids_ok = np.asarray(args["p_ids"])
    probs_ok = np.asarray(args["p_probs"], np.float32)
    assert probs_ok[p_ids_ok == res.token].sum() > 0
