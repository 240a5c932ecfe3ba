"""Acceptance kernel for speculative decoding: the rejection rule, numpy in, numpy out.

Words (see docs/design.md): p is the target's distribution at a position after its sampler chain,
q the drafter's distribution over its support; a draft x is *accepted* with probability
min(1, p(x)/q(x)); at the first rejection a *recovered* token is drawn from the *residual*
norm((p - q)+); when all k drafts are accepted a *bonus* token is drawn from p. With this rule
every emitted token is distributed exactly as p (Leviathan et al. 2023). When p is one-hot the
rule reduces to the *exact-match* rule and no randomness is used.

Distributions are passed as a support: ``ids`` (int32, distinct, in [0, n_vocab)) and
``probs`` (float32, >= 0, finite, summing to 1 +- 1e-3; zero entries are allowed and are
never emitted). A token absent from a support has probability 0 there.

RNG
    ``new_rng_state(seed) -> np.ndarray``: xoshiro256** state, 4 uint64 words, expanded from
    ``seed`` with splitmix64. The kernels advance it in place. ``state.copy()`` is a checkpoint,
    ``state[:] = saved`` restores it. Same state + same inputs -> same decisions, bit for bit.
    It is separate from llama.cpp's ``dist`` RNG.

Greedy / forced: p is *one-hot* iff exactly one entry of p_probs is > 0 (any number of exact
zeros around it; support size 1 included). Then the decision is the exact-match rule, accept
iff draft == that token, else emit that token, and no randomness is used. A p with a tiny but
nonzero tail is not one-hot and takes the random path (still exact).

Randomness consumed (one uniform = one xoshiro step):
    p one-hot: none, accepted or not.
    p(x) >= q(x) > 0, or q(x) == 0 < p(x): none (ratio >= 1: acceptance is certain).
    0 < p(x) < q(x): one uniform u; accepted iff u * q(x) < p(x).
    rejected: one more uniform to draw the recovered token (p(x) == 0 rejects without a draw).
    bonus: one uniform unless p is one-hot.

Scratch
    A float32 array of length >= n_vocab (``new_scratch``), all zero. The kernels scatter q into
    it on the rejection path (float32 holds q exactly; half the bytes of float64 makes the
    full-vocabulary gather faster) and zero the touched entries before returning, so it stays
    all zero between calls and nothing is allocated per call. One scratch per thread.

Kernels (numba.njit(cache=True): compiled on the first call for each argument-type signature,
then cached on disk; pass int32 ids, float32 probs, a uint64[4] state and a float32 scratch so
one signature serves everything). NO input checks: violating a precondition gives a wrong
answer, and an id >= len(scratch) writes out of bounds. The GIL is held while they run.
    accept_step_kernel(p_ids, p_probs, draft_token, q_ids, q_probs, rng_state, scratch)
        -> (token: int, accepted: bool)
        Preconditions: as above; p has a positive entry; draft_token is in q's support with
        q(draft) > 0 (if q(draft) == 0 it is treated as ratio +inf). Returns token == draft when
        accepted, else the recovered token (argmax of p when p is one-hot). If the residual sums
        to 0 (only by rounding, p ~= q) the recovered token is drawn from p. If p has no
        positive entry the token is -1.
    bonus_token_kernel(p_ids, p_probs, rng_state) -> int
        A draw from p (the one positive entry, without randomness, when p is one-hot).
    The k-position kernels over padded rows (token rule accept_draft_kernel, block rule
    accept_block_kernel) live in llama_spec.kernels.block.

Python wrappers (validation happens here, never in jitted code):
    accept_step(p_ids, p_probs, draft_token, q_ids, q_probs, rng_state, scratch=None,
                n_vocab=None, validate=True) -> AcceptResult(token, accepted)
        With validate=True bad input raises ValueError (clear message); ids/probs of other
        integer/float dtypes are converted. If everything else is valid but p or q does not sum
        to 1 +- 1e-3, UnnormalizedError (a ValueError) is raised so the loop can fall back to
        the exact-match rule. validate=False passes arrays straight to the kernel (fast path:
        the caller guarantees dtypes and preconditions, and checks ``p_is_normalized``).
        scratch=None uses a per-thread buffer (grown as needed); pass your own to skip that.
        The hot loop can call accept_step_kernel itself: it saves the wrapper's ~0.3 us.
    accept_draft and accept_block (k positions, padded rows): llama_spec.kernels.block.
    p_is_normalized(p_probs, tol=1e-3) -> bool: sum(p) within 1 +- tol (False for NaN).
    The same rule in plain numpy on the same RNG stream, for tests and benchmarks:
    llama_spec.testing.reference.accept_step_reference.
"""

from __future__ import annotations

import threading
from typing import NamedTuple

import numba
import numba.extending
import numpy as np

from ..errors import UnnormalizedError  # a ValueError; errors.py imports nothing of cffi

__all__ = [
    "AcceptResult",
    "UnnormalizedError",
    "accept_step",
    "accept_step_kernel",
    "bonus_token_kernel",
    "new_rng_state",
    "new_scratch",
    "p_is_normalized",
]

_M64 = (1 << 64) - 1
_INT32_MAX = 2**31 - 1


class AcceptResult(NamedTuple):
    token: int
    accepted: bool


# Helpers used inside the kernels are register_jitable, not njit(cache=True): a cached
# dispatcher loaded from disk is object code that callers cannot inline, and a per-entry call
# (with reference counting of its array arguments) made a full-vocabulary pass 3-4x slower.
# register_jitable helpers are compiled into each entry point and cached with it.
_inner = numba.extending.register_jitable


# --------------------------------------------------------------------------------------------
# RNG: xoshiro256** (Blackman & Vigna), seeded with splitmix64.


def new_rng_state(seed: int) -> np.ndarray:
    """Fresh xoshiro256** state (4 uint64 words) from any Python int seed."""
    x = int(seed) & _M64
    words = []
    for _ in range(4):
        x = (x + 0x9E3779B97F4A7C15) & _M64
        z = x
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _M64
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _M64
        words.append(z ^ (z >> 31))
    if not any(words):  # the one state xoshiro cannot leave; splitmix64 never yields it
        words[0] = 1
    return np.array(words, dtype=np.uint64)


@_inner
def _rotl(x, k):
    return (x << k) | (x >> (np.uint64(64) - k))


@_inner
def _next_uniform(state):
    """Advance state by one step; return a float64 uniform in [0, 1) with 53 random bits."""
    s0, s1, s2, s3 = state[0], state[1], state[2], state[3]
    result = _rotl(s1 * np.uint64(5), np.uint64(7)) * np.uint64(9)
    t = s1 << np.uint64(17)
    s2 ^= s0
    s3 ^= s1
    s1 ^= s2
    s0 ^= s3
    s2 ^= t
    s3 = _rotl(s3, np.uint64(45))
    state[0], state[1], state[2], state[3] = s0, s1, s2, s3
    return np.float64(result >> np.uint64(11)) * (1.0 / 9007199254740992.0)


# --------------------------------------------------------------------------------------------
# Kernels.


_N_CHECKPOINTS = 64


@_inner
def _draw(p_ids, p_probs, scratch, rng_state):
    """Inverse-CDF draw over p's support. Weights: p if scratch is None (the branch is pruned
    at compile time), else the residual (p - q)+ with q scattered into scratch. Returns -1,
    consuming nothing, if all weights are 0.

    Entries go in blocks of 8 summed in a fixed tree order, so the running sum adds once per
    block (a full-vocabulary pass is not bound by the floating-point add latency) and the
    result is bit-for-bit reproducible (testing.reference.accept_step_reference mirrors it).
    Phase 0 sums all blocks and keeps the running sum at up to 64 checkpoints; phase 1
    restarts from the last checkpoint <= target = u * total, repeats the same sums up to the
    block holding the target and walks that block entry by entry. The weights are written out here, not in a helper:
    numba does not inline array-taking helpers into a loop well (3x slower at full vocab)."""
    n = p_ids.shape[0]
    n_blocks = (n + 7) // 8
    stride = (n_blocks + _N_CHECKPOINTS - 1) // _N_CHECKPOINTS  # blocks per checkpoint
    buf = np.empty(8 + _N_CHECKPOINTS)
    w = buf[:8]  # the current block's weights
    checkpoint = buf[8:]  # running sum before block k * stride
    target = 0.0
    last = -1  # last positive entry seen, the answer when rounding leaves target >= the sum
    for phase in range(2):
        b_start = 0
        cum = 0.0
        if phase == 1:
            k = 0
            while (k + 1) * stride < n_blocks and checkpoint[k + 1] <= target:
                k += 1
            b_start = k * stride
            cum = checkpoint[k]
        for b in range(b_start, n_blocks):
            i0 = 8 * b
            for j in range(8):
                x = 0.0
                if i0 + j < n:
                    x = np.float64(p_probs[i0 + j])
                    if scratch is not None:
                        x -= scratch[p_ids[i0 + j]]
                    if x > 0.0:
                        last = i0 + j
                    else:
                        x = 0.0
                w[j] = x
            s = ((w[0] + w[1]) + (w[2] + w[3])) + ((w[4] + w[5]) + (w[6] + w[7]))
            if phase == 0:
                if b % stride == 0:
                    checkpoint[b // stride] = cum
            elif target < cum + s:
                for j in range(8):
                    if w[j] > 0.0:
                        cum += w[j]
                        if target < cum:
                            return np.int64(p_ids[i0 + j])
                # tree sum vs running sum rounding: the block's last positive entry
                return np.int64(p_ids[last])
            cum += s
        if phase == 0:
            if not cum > 0.0:
                return np.int64(-1)
            target = _next_uniform(rng_state) * cum
    return np.int64(p_ids[last])


# Large supports (e.g. the full vocabulary when top-k is off) draw the recovered token by
# rejection from p instead of two passes over the residual: propose y ~ p, keep it with
# probability (p(y) - min(p(y), q(y))) / p(y). A kept y is distributed as the residual
# (p - q)+ exactly; a try is kept with probability sum (p - q)+ / sum p, i.e. the rejection
# probability of the step we are in, so expected tries stay small where rejections are
# frequent. One pass builds per-block sums of p (in 8 independent lanes, fixed order) and each
# try is a binary search over them plus a walk of one block. After _MAX_TRIES misses (the
# residual is tiny) the exact two-pass draw runs on fresh uniforms: a mixture of exact draws
# is exact.
_LARGE_SUPPORT = 2048
_BLOCK = 64
_MAX_TRIES = 64


@_inner
def _draw_residual_by_rejection(p_ids, p_probs, scratch, rng_state):
    """Residual draw for large supports (see above). q is dense in scratch. -1 if no try kept."""
    n = p_ids.shape[0]
    n_blocks = (n + _BLOCK - 1) // _BLOCK
    cum = np.empty(n_blocks + 1)  # cum[b]: sum of p over the blocks before b
    total = 0.0
    for b in range(n_blocks):
        cum[b] = total
        i0 = b * _BLOCK
        l0 = l1 = l2 = l3 = l4 = l5 = l6 = l7 = 0.0
        if i0 + _BLOCK <= n:
            for r in range(_BLOCK // 8):
                i = i0 + 8 * r
                l0 += np.float64(p_probs[i])
                l1 += np.float64(p_probs[i + 1])
                l2 += np.float64(p_probs[i + 2])
                l3 += np.float64(p_probs[i + 3])
                l4 += np.float64(p_probs[i + 4])
                l5 += np.float64(p_probs[i + 5])
                l6 += np.float64(p_probs[i + 6])
                l7 += np.float64(p_probs[i + 7])
        else:  # the last, partial block: the same lanes, in the same order
            tail = np.zeros(8)
            for i in range(i0, n):
                tail[(i - i0) % 8] += np.float64(p_probs[i])
            l0, l1, l2, l3, l4, l5, l6, l7 = tail[0], tail[1], tail[2], tail[3], tail[4], tail[5], tail[6], tail[7]
        total += ((l0 + l1) + (l2 + l3)) + ((l4 + l5) + (l6 + l7))
    cum[n_blocks] = total
    if not total > 0.0:
        return np.int64(-1)
    for _ in range(_MAX_TRIES):
        target = _next_uniform(rng_state) * total
        lo, hi = 0, n_blocks - 1  # the last block b with cum[b] <= target
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if cum[mid] <= target:
                lo = mid
            else:
                hi = mid - 1
        c = cum[lo]
        j = -1
        for i in range(lo * _BLOCK, min(lo * _BLOCK + _BLOCK, n)):
            x = np.float64(p_probs[i])
            if x > 0.0:
                c += x
                j = i
                if target < c:
                    break
        u = _next_uniform(rng_state)
        if j >= 0:
            px = np.float64(p_probs[j])
            qx = np.float64(scratch[p_ids[j]])
            if qx < px and u * px >= qx:  # kept with probability 1 - q/p
                return np.int64(p_ids[j])
    return np.int64(-1)


@_inner
def _draw_recovered(p_ids, p_probs, q_ids, q_probs, rng_state, scratch):
    """Draw from the residual norm((p - q)+) over p's support; from p if it sums to zero."""
    for j in range(q_ids.shape[0]):  # dense q so the residual is O(|p| + |q|)
        scratch[q_ids[j]] = q_probs[j]
    token = np.int64(-1)
    if p_ids.shape[0] >= _LARGE_SUPPORT:
        token = _draw_residual_by_rejection(p_ids, p_probs, scratch, rng_state)
    if token < 0:
        token = _draw(p_ids, p_probs, scratch, rng_state)
    for j in range(q_ids.shape[0]):  # leave scratch all zero for the next call
        scratch[q_ids[j]] = 0.0
    if token >= 0:
        return token
    # p <= q everywhere on p's support can only come from rounding (both sum to 1): use p.
    return _draw(p_ids, p_probs, None, rng_state)


@_inner
def _n_positive_upto2(p_probs):
    """(min(#entries > 0, 2), index of the first positive entry); stops at the second."""
    first = -1
    for i in range(p_probs.shape[0]):
        if p_probs[i] > 0:
            if first >= 0:
                return 2, first
            first = i
    return (1 if first >= 0 else 0), first


@_inner
def _accept_step(p_ids, p_probs, draft_token, q_ids, q_probs, rng_state, scratch):
    n_pos, first = _n_positive_upto2(p_probs)

    # Greedy path: p one-hot -> exact-match rule, deterministic, no randomness either way.
    if n_pos == 1:
        forced = np.int64(p_ids[first])
        return forced, forced == draft_token
    if n_pos == 0:
        return np.int64(-1), False  # precondition violated; the wrapper never gets here

    # Random path: the rejection rule.
    px = 0.0
    for i in range(p_ids.shape[0]):
        if p_ids[i] == draft_token:
            px = np.float64(p_probs[i])
            break
    qx = 0.0
    for j in range(q_ids.shape[0]):
        if q_ids[j] == draft_token:
            qx = np.float64(q_probs[j])
            break
    if px > 0.0:
        if px >= qx:  # ratio >= 1: certain, so no uniform is spent
            return np.int64(draft_token), True
        if _next_uniform(rng_state) * qx < px:  # u < p/q without a division
            return np.int64(draft_token), True
    return _draw_recovered(p_ids, p_probs, q_ids, q_probs, rng_state, scratch), False


@_inner
def _bonus_token(p_ids, p_probs, rng_state):
    n_pos, first = _n_positive_upto2(p_probs)
    if n_pos == 1:  # greedy / forced: no randomness
        return np.int64(p_ids[first])
    return _draw(p_ids, p_probs, None, rng_state)


# Entry points: the only cached dispatchers (see _inner for why the helpers are not).


@numba.njit(cache=True)
def accept_step_kernel(p_ids, p_probs, draft_token, q_ids, q_probs, rng_state, scratch):
    return _accept_step(p_ids, p_probs, draft_token, q_ids, q_probs, rng_state, scratch)


@numba.njit(cache=True)
def bonus_token_kernel(p_ids, p_probs, rng_state):
    return _bonus_token(p_ids, p_probs, rng_state)


# --------------------------------------------------------------------------------------------
# Python side: scratch, validation, wrappers.

_tls = threading.local()


def new_scratch(n_vocab: int) -> np.ndarray:
    """An all-zero float32 scratch buffer for vocabularies of up to n_vocab tokens."""
    return np.zeros(int(n_vocab), dtype=np.float32)


def _max_id(*id_arrays) -> int:
    return max((int(a.max()) for a in id_arrays if a.size), default=0)


def _thread_scratch(n: int) -> np.ndarray:
    """The wrappers' scratch when the caller passes none: one per thread, grown as needed."""
    buf = getattr(_tls, "scratch", None)
    if buf is None or buf.shape[0] < n:
        buf = _tls.scratch = new_scratch(n)
    return buf


def p_is_normalized(p_probs, tol: float = 1e-3) -> bool:
    """True iff sum(p_probs) is within 1 +- tol (False for NaN/inf). One numpy pass in float64,
    as fast as a jitted loop (135-150 us over 152k floats); not jitted, so greedy verification
    never pays numba's first-call set-up (0.45 s per process here, before any kernel ran)."""
    p = np.asarray(p_probs)
    if p.ndim != 1 or p.dtype.kind != "f":
        p = np.ascontiguousarray(p, dtype=np.float64).reshape(-1)
    return bool(abs(float(np.add.reduce(p, dtype=np.float64)) - 1.0) <= tol)


def _as_ids(x, name: str, n_vocab: int | None) -> np.ndarray:
    a = np.asarray(x)
    if a.ndim != 1:
        raise ValueError(f"{name} must be 1-D, got shape {a.shape}")
    if a.size == 0:
        raise ValueError(f"{name} is empty: a support needs at least one token")
    if a.dtype.kind not in "iu":
        raise ValueError(f"{name} must have an integer dtype, got {a.dtype}")
    lo, hi = int(a.min()), int(a.max())
    limit = _INT32_MAX + 1 if n_vocab is None else n_vocab
    if lo < 0 or hi >= limit:
        raise ValueError(f"{name} has ids outside [0, {limit}): min {lo}, max {hi}")
    a = np.ascontiguousarray(a, dtype=np.int32)
    if np.unique(a).size != a.size:
        raise ValueError(f"{name} has duplicate ids")
    return a


def _as_probs(x, name: str, n: int) -> np.ndarray:
    a = np.asarray(x)
    if a.ndim != 1:
        raise ValueError(f"{name} must be 1-D, got shape {a.shape}")
    if a.dtype.kind != "f":
        raise ValueError(f"{name} must have a floating dtype, got {a.dtype}")
    if a.shape[0] != n:
        raise ValueError(f"{name} has length {a.shape[0]}, its ids have length {n}")
    a = np.ascontiguousarray(a, dtype=np.float32)
    if not np.isfinite(a).all():
        raise ValueError(f"{name} has NaN or infinite entries (after conversion to float32)")
    if (a < 0).any():
        raise ValueError(f"{name} has negative entries")
    if not (a > 0).any():
        raise ValueError(f"{name} has no positive entry")
    return a


def _check_rng(rng_state) -> None:
    if not (
        isinstance(rng_state, np.ndarray)
        and rng_state.dtype == np.uint64
        and rng_state.shape == (4,)
        and rng_state.flags.c_contiguous
        and rng_state.flags.writeable
    ):
        raise ValueError("rng_state must be a writeable uint64 array of shape (4,) (new_rng_state)")
    if not rng_state.any():
        raise ValueError("rng_state is all zero, which xoshiro256** cannot leave")


def _check_vocab(n_vocab) -> int | None:
    if n_vocab is None:
        return None
    if isinstance(n_vocab, bool) or not isinstance(n_vocab, (int, np.integer)) or n_vocab < 1:
        raise ValueError(f"n_vocab must be a positive int, got {n_vocab!r}")
    return int(n_vocab)


def _get_scratch(scratch, n_needed: int) -> np.ndarray:
    if scratch is None:
        return _thread_scratch(n_needed)
    if not (
        isinstance(scratch, np.ndarray)
        and scratch.dtype == np.float32
        and scratch.ndim == 1
        and scratch.flags.c_contiguous
        and scratch.flags.writeable
    ):
        raise ValueError("scratch must be a writeable contiguous 1-D float32 array (new_scratch)")
    if scratch.shape[0] < n_needed:
        raise ValueError(f"scratch has length {scratch.shape[0]}, needs at least {n_needed}")
    return scratch


def _validate_position(p_ids, p_probs, draft_token, q_ids, q_probs, n_vocab):
    """Checked, converted arrays for one position. Normalization is checked last, on purpose:
    UnnormalizedError then means 'valid input, but fall back to the exact-match rule'."""
    p_ids = _as_ids(p_ids, "p_ids", n_vocab)
    p_probs = _as_probs(p_probs, "p_probs", p_ids.shape[0])
    q_ids = _as_ids(q_ids, "q_ids", n_vocab)
    q_probs = _as_probs(q_probs, "q_probs", q_ids.shape[0])
    if isinstance(draft_token, (bool, np.bool_)) or not isinstance(
        draft_token, (int, np.integer)
    ):
        raise ValueError(f"draft_token must be an int, got {type(draft_token).__name__}")
    draft_token = int(draft_token)
    where = np.flatnonzero(q_ids == draft_token)
    if where.size == 0:
        raise ValueError(f"draft token {draft_token} is not in q's support")
    if not q_probs[where[0]] > 0:
        raise ValueError(f"draft token {draft_token} has q = 0: it cannot have been drawn from q")
    for name, probs in (("p", p_probs), ("q", q_probs)):
        if not p_is_normalized(probs):
            raise UnnormalizedError(name, float(probs.sum(dtype=np.float64)), 1e-3)
    return p_ids, p_probs, draft_token, q_ids, q_probs


def accept_step(
    p_ids,
    p_probs,
    draft_token,
    q_ids,
    q_probs,
    rng_state,
    scratch=None,
    n_vocab=None,
    validate=True,
) -> AcceptResult:
    """One position of the rejection rule; see the module docstring for the contract."""
    if not validate:  # fast path: no checks, one jitted call
        if scratch is None:
            scratch = _thread_scratch(_max_id(p_ids, q_ids) + 1)
        return AcceptResult._make(
            accept_step_kernel(p_ids, p_probs, draft_token, q_ids, q_probs, rng_state, scratch)
        )
    _check_rng(rng_state)
    n_vocab = _check_vocab(n_vocab)
    p_ids, p_probs, draft_token, q_ids, q_probs = _validate_position(
        p_ids, p_probs, draft_token, q_ids, q_probs, n_vocab
    )
    n_needed = max(int(p_ids.max()), int(q_ids.max())) + 1
    scratch = _get_scratch(scratch, n_needed if n_vocab is None else n_vocab)
    if scratch[p_ids].any() or scratch[q_ids].any():
        raise ValueError("scratch is not zero at the ids in use (it must start all zero)")
    token, accepted = accept_step_kernel(
        p_ids, p_probs, draft_token, q_ids, q_probs, rng_state, scratch
    )
    return AcceptResult(int(token), bool(accepted))


def _rows_2d(x, name: str, n_rows: int, kind: str) -> np.ndarray:
    """x as a 2-D array of n_rows rows whose dtype kind is in kind, else ValueError naming it."""
    a = np.asarray(x)
    if a.ndim != 2 or a.shape[0] != n_rows:
        raise ValueError(f"{name} must be 2-D with {n_rows} rows, got shape {a.shape}")
    if a.dtype.kind not in kind:
        raise ValueError(f"{name} has dtype {a.dtype}")
    return a
