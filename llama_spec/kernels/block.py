"""Multi-position acceptance kernels: the token rule over k positions and the block rule.

Both take one verification's k draft positions as padded rows (the conventions of
``accept_draft``): ``p_ids``/``p_probs`` (k + 1, Lp), row i the support of p at position i + 1
(p conditioned on the drafts d_1..d_i before it), valid up to ``p_lens[i]``, row k the bonus
position; ``q_ids``/``q_probs`` (k, Lq) likewise with ``q_lens``; ``draft_tokens`` (k,), d_i drawn
from q at position i. They return ``emitted`` (int32, n_accepted + 1 tokens: the accepted
drafts, then the recovered token, or the bonus token when n_accepted == k) and n_accepted.
Words, supports, RNG and scratch are those of llama_spec.kernels.token.

Token rule (``accept_draft``): k single steps of accept.accept_step, then the bonus.

Block rule (``accept_block``; Sun, Mendlovic, Leviathan, Aharoni, Ro, Beirami, Suresh, "Block
Verification Accelerates Speculative Decoding", ICLR 2025, arXiv 2403.10444). The k drafts are
verified jointly; with p_i, q_i the distributions at position i:
    r_0 = 1,  r_i = min(r_{i-1} p_i(d_i) / q_i(d_i), 1)                      (the paper's p_i)
    rho_i = sum_x max(r_i p_{i+1}(x) - q_{i+1}(x), 0)                        (0 < i < k)
    h_k = r_k,  h_i = rho_i / (rho_i + 1 - r_i)  (h_i = 1 if r_i = 1, 0 if r_i = 0)
Going down from i = k, stop at the first i that succeeds with probability h_i, else tau = 0.
Emit d_1..d_tau, then a token from the residual norm((r_tau p_{tau+1} - q_{tau+1})+) over
p_{tau+1}'s support if tau < k (drawn from p_{tau+1} if it is zero, which only rounding can
cause), or the bonus from p_{k+1} if tau = k. The output is distributed as the target
(tests/test_accept_block.py checks it by exact enumeration and by chi-square), the expected
number of accepted drafts is never below the token rule's, and for k = 1 the rule is the
token rule. h_i = 1 when r_i = 1 is the limit rho_i / rho_i; the case rho_i = 0 there cannot
occur in exact arithmetic, and taking h_i = 1 keeps one-hot p exact-match under rounding.
A one-hot p (one entry > 0) counts as exactly 1 at its token, as in the token rule.

Randomness consumed by the block rule (one uniform = one xoshiro step):
    the forward pass (r_i): none.
    stop test at i (i = k, k - 1, ... down to tau): one uniform iff 0 < h_i < 1 (none when
        r_i = 0, r_i = 1, rho_i = 0, or at i = k when r_{k-1} p_k(d_k) >= q_k(d_k)); accepted
        iff u * den < num with h_i = num / den (num = r_{k-1} p_k(d_k), den = q_k(d_k) at k;
        num = rho_i, den = rho_i + 1 - r_i below). Positions below tau are not looked at.
    then one draw: the bonus (one uniform unless p_{k+1} is one-hot), or the residual at tau
        (none if p_{tau+1} is one-hot; else accept's recovered-token draw on q / r_tau in
        float32: one uniform below 2,048 entries, two per try of the rejection draw above).
    p one-hot everywhere: no randomness, and the tokens of the exact-match rule.
    k = 1: the same tokens and the same uniforms as accept_draft, bit for bit.

Kernels (numba, cache=True; no input checks, preconditions as accept.accept_draft_kernel):
    accept_draft_kernel(p_ids, p_probs, p_lens, draft_tokens, q_ids, q_probs, q_lens,
                        rng_state, scratch, out) -> n_accepted
    accept_block_kernel(same arguments) -> n_accepted
        out has length >= k + 1 and receives the n_accepted + 1 emitted tokens.
Wrappers (validation in Python, as accept.accept_step; UnnormalizedError when p or q does not
sum to 1 +- 1e-3; validate=False passes typed arrays straight to the kernel):
    accept_draft(p_ids, p_probs, p_lens, draft_tokens, q_ids, q_probs, q_lens, rng_state,
                 scratch=None, n_vocab=None, validate=True) -> (emitted, n_accepted)
    accept_block(same arguments) -> (emitted, n_accepted)
The plain-numpy reference of the block rule, on the same RNG stream, is
llama_spec.testing.reference.accept_block_reference.
"""

from __future__ import annotations

import numba
import numpy as np

from llama_spec.kernels.token import (
    _LARGE_SUPPORT,
    UnnormalizedError,
    _accept_step,
    _as_ids,
    _as_probs,
    _bonus_token,
    _check_rng,
    _check_vocab,
    _draw,
    _draw_residual_by_rejection,
    _get_scratch,
    _inner,
    _max_id,
    _n_positive_upto2,
    _next_uniform,
    _rows_2d,
    _thread_scratch,
    _validate_position,
    p_is_normalized,
)

__all__ = ["accept_block", "accept_block_kernel", "accept_draft", "accept_draft_kernel"]


# --------------------------------------------------------------------------------------------
# Block rule helpers (register_jitable: compiled into the entry points, see accept._inner).


@_inner
def _first(ids, probs, token):
    """probs at the first entry of ids equal to token, as float64; 0.0 if token is absent."""
    for j in range(ids.shape[0]):
        if ids[j] == token:
            return np.float64(probs[j])
    return 0.0


@_inner
def _p_of(p_ids, p_probs, token):
    """p(token), a one-hot p counting as exactly 1 at its positive entry."""
    n_pos, first = _n_positive_upto2(p_probs)
    if n_pos == 1:
        return 1.0 if p_ids[first] == token else 0.0
    return _first(p_ids, p_probs, token)


@_inner
def _stop(num, den, rng_state):
    """Bernoulli(num / den); certain, with no uniform, when num <= 0 or num >= den."""
    if num <= 0.0:
        return False
    if num >= den:
        return True
    return _next_uniform(rng_state) * den < num


@_inner
def _residual_mass(p_ids, p_probs, q_ids, q_probs, r, scratch):
    """rho = sum over p's support of max(r p - q, 0), in accept._draw's order: blocks of 8
    summed as ((w0 + w1) + (w2 + w3)) + ((w4 + w5) + (w6 + w7)), the block sums added in
    order (fixed, so the reference reproduces it; one dependent add per block). Written out
    here, not in a helper, for the reason given in accept._draw."""
    n_pos, first = _n_positive_upto2(p_probs)
    if n_pos == 1:
        return max(r - _first(q_ids, q_probs, p_ids[first]), 0.0)
    n = p_ids.shape[0]
    for j in range(q_ids.shape[0]):  # dense q: O(|p| + |q|)
        scratch[q_ids[j]] = q_probs[j]
    # Large supports: a bitmap of q's ids (L1-sized) replaces most random reads of scratch;
    # q = 0 off q's support, so the weights, and the sums, are the same either way.
    small = n < _LARGE_SUPPORT
    in_q = np.zeros(1 if small else (scratch.shape[0] + 63) // 64, np.uint64)
    if not small:
        for j in range(q_ids.shape[0]):
            in_q[q_ids[j] >> 6] |= np.uint64(1) << np.uint64(q_ids[j] & 63)
    w = np.empty(8)
    total = 0.0
    for b in range((n + 7) // 8):
        i0 = 8 * b
        for j in range(8):
            x = 0.0
            if i0 + j < n:
                t = p_ids[i0 + j]
                x = r * np.float64(p_probs[i0 + j])
                if small or (in_q[t >> 6] >> np.uint64(t & 63)) & np.uint64(1):
                    x -= np.float64(scratch[t])
                if x < 0.0:
                    x = 0.0
            w[j] = x
        total += ((w[0] + w[1]) + (w[2] + w[3])) + ((w[4] + w[5]) + (w[6] + w[7]))
    for j in range(q_ids.shape[0]):  # leave scratch all zero
        scratch[q_ids[j]] = 0.0
    return total


@_inner
def _draw_block_residual(p_ids, p_probs, q_ids, q_probs, r, rng_state, scratch):
    """A draw from norm((r p - q)+) = norm((p - q / r)+): accept's recovered-token draw with
    q / r (float32) in scratch; r > 0. From p if the residual is zero (rounding only)."""
    n_pos, first = _n_positive_upto2(p_probs)
    if n_pos == 1:  # one-hot p: the residual is that token (or zero): no randomness
        return np.int64(p_ids[first])
    for j in range(q_ids.shape[0]):
        scratch[q_ids[j]] = np.float64(q_probs[j]) / r  # r = 1 gives q itself: the token rule
    token = np.int64(-1)
    if p_ids.shape[0] >= _LARGE_SUPPORT:
        token = _draw_residual_by_rejection(p_ids, p_probs, scratch, rng_state)
    if token < 0:
        token = _draw(p_ids, p_probs, scratch, rng_state)
    for j in range(q_ids.shape[0]):
        scratch[q_ids[j]] = 0.0
    if token >= 0:
        return token
    return _draw(p_ids, p_probs, None, rng_state)


@_inner
def _accept_block(p_ids, p_probs, p_lens, draft_tokens, q_ids, q_probs, q_lens, rng_state,
                  scratch, out):
    k = draft_tokens.shape[0]
    r = np.empty(k + 1)  # r[i]: the residual mass after i drafts, r[0] = 1
    r[0] = 1.0
    num = den = 0.0
    for i in range(k):  # forward: r_i, no randomness
        d = draft_tokens[i]
        num = r[i] * _p_of(p_ids[i, : p_lens[i]], p_probs[i, : p_lens[i]], d)
        den = _first(q_ids[i, : q_lens[i]], q_probs[i, : q_lens[i]], d)
        r[i + 1] = 0.0 if num <= 0.0 else (1.0 if num >= den else num / den)
    tau = 0
    if k > 0 and _stop(num, den, rng_state):  # h_k = r_k, tested without a division
        tau = k
    else:
        for i in range(k - 1, 0, -1):  # backward: the first success is tau
            if r[i] <= 0.0:
                continue
            if r[i] >= 1.0:
                tau = i
                break
            n_p, n_q = p_lens[i], q_lens[i]
            rho = _residual_mass(p_ids[i, :n_p], p_probs[i, :n_p], q_ids[i, :n_q],
                                 q_probs[i, :n_q], r[i], scratch)
            if _stop(rho, rho + (1.0 - r[i]), rng_state):
                tau = i
                break
    for i in range(tau):
        out[i] = draft_tokens[i]
    n_p = p_lens[tau]
    if tau == k:
        out[k] = _bonus_token(p_ids[k, :n_p], p_probs[k, :n_p], rng_state)
    else:
        n_q = q_lens[tau]
        out[tau] = _draw_block_residual(p_ids[tau, :n_p], p_probs[tau, :n_p], q_ids[tau, :n_q],
                                        q_probs[tau, :n_q], r[tau], rng_state, scratch)
    return tau


# Entry points: the only cached dispatchers.


@numba.njit(cache=True)
def accept_draft_kernel(
    p_ids, p_probs, p_lens, draft_tokens, q_ids, q_probs, q_lens, rng_state, scratch, out
):
    k = draft_tokens.shape[0]
    for i in range(k):
        np_, nq = p_lens[i], q_lens[i]
        token, accepted = _accept_step(
            p_ids[i, :np_], p_probs[i, :np_], draft_tokens[i],
            q_ids[i, :nq], q_probs[i, :nq], rng_state, scratch,
        )
        out[i] = token
        if not accepted:
            return i
    out[k] = _bonus_token(p_ids[k, : p_lens[k]], p_probs[k, : p_lens[k]], rng_state)
    return k


@numba.njit(cache=True)
def accept_block_kernel(
    p_ids, p_probs, p_lens, draft_tokens, q_ids, q_probs, q_lens, rng_state, scratch, out
):
    return _accept_block(p_ids, p_probs, p_lens, draft_tokens, q_ids, q_probs, q_lens,
                         rng_state, scratch, out)


# --------------------------------------------------------------------------------------------
# Python side: validation of the padded rows, wrappers.


def _check_shapes(p_ids, p_probs, p_lens, draft_tokens, q_ids, q_probs, q_lens):
    """The padded arrays as numpy arrays, after checking their shapes, dtypes and lengths."""
    drafts = np.asarray(draft_tokens)
    if drafts.ndim != 1 or drafts.dtype.kind not in "iu":
        raise ValueError(f"draft_tokens must be a 1-D integer array, got {drafts.dtype} "
                         f"shape {drafts.shape}")
    k = drafts.shape[0]
    p_ids = _rows_2d(p_ids, "p_ids", k + 1, "iu")
    p_probs = _rows_2d(p_probs, "p_probs", k + 1, "f")
    q_ids = _rows_2d(q_ids, "q_ids", k, "iu")
    q_probs = _rows_2d(q_probs, "q_probs", k, "f")
    if p_ids.shape != p_probs.shape or q_ids.shape != q_probs.shape:
        raise ValueError("ids and probs arrays must have the same shape")
    p_lens = np.asarray(p_lens)
    q_lens = np.asarray(q_lens)
    if p_lens.shape != (k + 1,) or q_lens.shape != (k,) or p_lens.dtype.kind not in "iu" \
            or q_lens.dtype.kind not in "iu":
        raise ValueError(f"p_lens must be ({k + 1},) and q_lens ({k},) integer arrays")
    if ((p_lens < 1) | (p_lens > p_ids.shape[1])).any() or (
        k and ((q_lens < 1) | (q_lens > q_ids.shape[1])).any()
    ):
        raise ValueError("a length in p_lens/q_lens is outside [1, row width]")
    return p_ids, p_probs, p_lens, drafts, q_ids, q_probs, q_lens


def _checked_rows(p_ids, p_probs, p_lens, draft_tokens, q_ids, q_probs, q_lens, scratch, n_vocab):
    """Every position checked like accept.accept_step, repacked into contiguous typed arrays:
    the kernel's arguments without rng_state and out."""
    p_ids, p_probs, p_lens, drafts, q_ids, q_probs, q_lens = _check_shapes(
        p_ids, p_probs, p_lens, draft_tokens, q_ids, q_probs, q_lens)
    k = drafts.shape[0]
    pi = np.zeros(p_ids.shape, np.int32)
    pp = np.zeros(p_ids.shape, np.float32)
    qi = np.zeros(q_ids.shape, np.int32)
    qp = np.zeros(q_ids.shape, np.float32)
    n_needed = 1
    for i in range(k + 1):
        n = int(p_lens[i])
        if i < k:
            m = int(q_lens[i])
            a, b, _, c, d = _validate_position(
                p_ids[i, :n], p_probs[i, :n], int(drafts[i]), q_ids[i, :m], q_probs[i, :m],
                n_vocab,
            )
            qi[i, :m], qp[i, :m] = c, d
            n_needed = max(n_needed, int(c.max()) + 1)
        else:
            a = _as_ids(p_ids[i, :n], "p_ids", n_vocab)
            b = _as_probs(p_probs[i, :n], "p_probs", n)
            if not p_is_normalized(b):
                raise UnnormalizedError("p", float(b.sum(dtype=np.float64)), 1e-3)
        pi[i, :n], pp[i, :n] = a, b
        n_needed = max(n_needed, int(a.max()) + 1)
    scratch = _get_scratch(scratch, n_needed if n_vocab is None else n_vocab)
    if scratch[pi.ravel()].any() or scratch[qi.ravel()].any():
        raise ValueError("scratch is not zero at the ids in use (it must start all zero)")
    return (pi, pp, p_lens.astype(np.int64), drafts.astype(np.int64), qi, qp,
            q_lens.astype(np.int64), scratch)


def _call(kernel, p_ids, p_probs, p_lens, draft_tokens, q_ids, q_probs, q_lens, rng_state,
          scratch, n_vocab, validate) -> tuple[np.ndarray, int]:
    """Run a padded-row kernel, after validation unless validate is False."""
    if validate:
        _check_rng(rng_state)
        p_ids, p_probs, p_lens, draft_tokens, q_ids, q_probs, q_lens, scratch = _checked_rows(
            p_ids, p_probs, p_lens, draft_tokens, q_ids, q_probs, q_lens, scratch,
            _check_vocab(n_vocab))
    elif scratch is None:
        scratch = _thread_scratch(_max_id(p_ids, q_ids) + 1)
    out = np.empty(draft_tokens.shape[0] + 1, dtype=np.int32)
    n_acc = kernel(p_ids, p_probs, p_lens, draft_tokens, q_ids, q_probs, q_lens, rng_state,
                   scratch, out)
    return out[: n_acc + 1], int(n_acc)


def accept_draft(p_ids, p_probs, p_lens, draft_tokens, q_ids, q_probs, q_lens, rng_state,
                 scratch=None, n_vocab=None, validate=True) -> tuple[np.ndarray, int]:
    """k positions of the token rule plus the bonus draw; returns (emitted, n_accepted).

    p_ids/p_probs: (k + 1, Lp) padded rows, row i valid up to p_lens[i]; q_ids/q_probs:
    (k, Lq) likewise with q_lens; draft_tokens: (k,). emitted is an int32 array of length
    n_accepted + 1: the accepted drafts, then the recovered token (n_accepted < k) or the
    bonus token (n_accepted == k). Same tokens and RNG state as k accept_step calls.
    """
    return _call(accept_draft_kernel, p_ids, p_probs, p_lens, draft_tokens, q_ids, q_probs,
                 q_lens, rng_state, scratch, n_vocab, validate)


def accept_block(p_ids, p_probs, p_lens, draft_tokens, q_ids, q_probs, q_lens, rng_state,
                 scratch=None, n_vocab=None, validate=True) -> tuple[np.ndarray, int]:
    """The block rule over k positions (module docstring); returns (emitted, n_accepted).

    Arguments as accept_draft: p (k + 1, Lp) rows, q (k, Lq) rows, draft_tokens (k,).
    validate=False: the caller passes int32 ids, float32 probs, int64 lens/drafts, a uint64[4]
    state, and guarantees the preconditions (check p_is_normalized per row)."""
    return _call(accept_block_kernel, p_ids, p_probs, p_lens, draft_tokens, q_ids, q_probs,
                 q_lens, rng_state, scratch, n_vocab, validate)
