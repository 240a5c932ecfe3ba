"""Plain-numpy references of the acceptance kernels, on the same RNG stream (tests, benchmarks).

Each function is its kernel's rule written out in numpy and Python floats: the same decisions,
the same summation order and the same uniforms, so a test can compare a kernel with its
reference token for token and state word for state word.
    accept_step_reference(p_ids, p_probs, draft_token, q_ids, q_probs, rng_state, scratch)
        -> (token, accepted)                      -- llama_spec.kernels.token.accept_step_kernel
    accept_block_reference(p_ids, p_probs, p_lens, draft_tokens, q_ids, q_probs, q_lens,
                           rng_state, scratch) -> (emitted int32 array, n_accepted)
                                                  -- llama_spec.kernels.block.accept_block_kernel
scratch is the kernels' all-zero float32 buffer (llama_spec.kernels.token.new_scratch); it is left
all zero. Production code never imports this module.
"""

from __future__ import annotations

import numpy as np

from llama_spec.kernels.token import _BLOCK, _LARGE_SUPPORT, _M64, _MAX_TRIES

__all__ = ["accept_block_reference", "accept_step_reference"]


def _py_next_uniform(state: np.ndarray) -> float:
    """The same step as _next_uniform, in Python ints (for the references)."""

    def rotl(x: int, k: int) -> int:
        return ((x << k) | (x >> (64 - k))) & _M64

    s0, s1, s2, s3 = (int(v) for v in state)
    result = (rotl((s1 * 5) & _M64, 7) * 9) & _M64
    t = (s1 << 17) & _M64
    s2 ^= s0
    s3 ^= s1
    s1 ^= s2
    s0 ^= s3
    s2 ^= t
    s3 = rotl(s3, 45)
    state[:] = (s0, s1, s2, s3)
    return float(result >> 11) * (1.0 / 9007199254740992.0)


def accept_step_reference(p_ids, p_probs, draft_token, q_ids, q_probs, rng_state, scratch):
    """accept_step_kernel in plain numpy: same rule, same summation order, same RNG stream."""
    p = p_probs.astype(np.float64)
    positive = np.flatnonzero(p > 0)
    if positive.size == 1:  # greedy path
        forced = int(p_ids[positive[0]])
        return forced, forced == draft_token
    hit_p = np.flatnonzero(p_ids == draft_token)
    hit_q = np.flatnonzero(q_ids == draft_token)
    px = p[hit_p[0]] if hit_p.size else 0.0
    qx = float(q_probs[hit_q[0]]) if hit_q.size else 0.0
    if px > 0.0 and (px >= qx or _py_next_uniform(rng_state) * qx < px):
        return int(draft_token), True
    scratch[q_ids] = q_probs
    dense_q = scratch[p_ids].astype(np.float64)
    scratch[q_ids] = 0.0
    token = -1
    if p_ids.shape[0] >= _LARGE_SUPPORT:
        token = _reference_residual_by_rejection(p_ids, p, dense_q, rng_state)
    if token < 0:
        token = _reference_draw(p_ids, np.maximum(p - dense_q, 0.0), rng_state)
    if token < 0:  # residual zero by rounding: draw from p
        token = _reference_draw(p_ids, np.maximum(p, 0.0), rng_state)
    return token, False


def _reference_residual_by_rejection(ids, p, q_at_p, rng_state):
    n = p.shape[0]
    n_blocks = -(-n // _BLOCK)
    padded = np.zeros(n_blocks * _BLOCK)
    padded[:n] = p
    lanes = np.cumsum(padded.reshape(n_blocks, _BLOCK // 8, 8), axis=1)[:, -1, :]  # sequential per lane
    sums = ((lanes[:, 0] + lanes[:, 1]) + (lanes[:, 2] + lanes[:, 3])) + (
        (lanes[:, 4] + lanes[:, 5]) + (lanes[:, 6] + lanes[:, 7]))
    cum = np.concatenate(([0.0], np.cumsum(sums)))
    total = cum[-1]
    if not total > 0.0:
        return -1
    for _ in range(_MAX_TRIES):
        target = _py_next_uniform(rng_state) * total
        b = int(np.searchsorted(cum[:n_blocks], target, side="right")) - 1
        c, j = cum[b], -1
        for i in range(b * _BLOCK, min(b * _BLOCK + _BLOCK, n)):
            if p[i] > 0.0:
                c += p[i]
                j = i
                if target < c:
                    break
        u = _py_next_uniform(rng_state)
        if j >= 0 and q_at_p[j] < p[j] and u * p[j] >= q_at_p[j]:
            return int(ids[j])
    return -1


def _reference_draw(ids, weights, rng_state):
    blocks = np.zeros(-(-weights.shape[0] // 8) * 8)
    blocks[: weights.shape[0]] = weights
    w = blocks.reshape(-1, 8)
    sums = ((w[:, 0] + w[:, 1]) + (w[:, 2] + w[:, 3])) + ((w[:, 4] + w[:, 5]) + (w[:, 6] + w[:, 7]))
    cum = np.cumsum(sums)  # np.cumsum adds sequentially, like the kernel's running sum
    if not cum[-1] > 0.0:
        return -1
    target = _py_next_uniform(rng_state) * cum[-1]
    b = int(np.searchsorted(cum, target, side="right"))
    if b == cum.shape[0]:
        return int(ids[np.flatnonzero(weights)[-1]])
    start = cum[b - 1] if b else 0.0
    inner = np.cumsum(np.concatenate(([start], w[b])))[1:]
    j = int(np.searchsorted(inner, target, side="right"))
    if j == 8:
        j = int(np.flatnonzero(w[b])[-1])
    return int(ids[8 * b + j])



# --------------------------------------------------------------------------------------------
# Block rule (llama_spec.kernels.block): see that module's docstring for the formulas.


def _ref_first(ids, probs, token) -> float:
    """probs at the first entry of ids equal to token, as a float; 0.0 if token is absent."""
    hit = np.flatnonzero(ids == token)
    return float(probs[hit[0]]) if hit.size else 0.0


def _ref_p_of(p_ids, p, token) -> float:
    """p(token), a one-hot p counting as exactly 1 at its positive entry (p: float64)."""
    positive = np.flatnonzero(p > 0)
    if positive.size == 1:
        return 1.0 if int(p_ids[positive[0]]) == token else 0.0
    return _ref_first(p_ids, p, token)


def _ref_stop(num: float, den: float, rng_state) -> bool:
    """Bernoulli(num / den), certain (no uniform) when num <= 0 or num >= den."""
    if num <= 0.0:
        return False
    if num >= den:
        return True
    return _py_next_uniform(rng_state) * den < num


def _ref_residual_mass(p_ids, p, q_ids, q, r, scratch) -> float:
    """sum over p's support of max(r p - q, 0): blocks of 8 summed as ((w0 + w1) + (w2 + w3))
    + ((w4 + w5) + (w6 + w7)), the block sums added in order -- the kernel's order."""
    positive = np.flatnonzero(p > 0)
    if positive.size == 1:
        return max(r - _ref_first(q_ids, q, int(p_ids[positive[0]])), 0.0)
    scratch[q_ids] = q
    dense_q = scratch[p_ids].astype(np.float64)
    scratch[q_ids] = 0.0
    n = p.shape[0]
    padded = np.zeros(-(-n // 8) * 8)
    padded[:n] = np.maximum(r * p - dense_q, 0.0)
    w = padded.reshape(-1, 8)
    sums = ((w[:, 0] + w[:, 1]) + (w[:, 2] + w[:, 3])) + ((w[:, 4] + w[:, 5]) + (w[:, 6] + w[:, 7]))
    return float(np.cumsum(sums)[-1])  # np.cumsum adds sequentially, like the kernel


def _ref_block_residual(p_ids, p, q_ids, q, r, rng_state, scratch) -> int:
    """A draw from norm((r p - q)+): the token rule's residual draw with q / r (in float32)."""
    positive = np.flatnonzero(p > 0)
    if positive.size == 1:
        return int(p_ids[positive[0]])
    with np.errstate(over="ignore"):  # q / r beyond float32 is inf: weight 0, as in the kernel
        scratch[q_ids] = (q.astype(np.float64) / r).astype(np.float32)
    dense_q = scratch[p_ids].astype(np.float64)
    scratch[q_ids] = 0.0
    token = -1
    if p_ids.shape[0] >= _LARGE_SUPPORT:
        token = _reference_residual_by_rejection(p_ids, p, dense_q, rng_state)
    if token < 0:
        token = _reference_draw(p_ids, np.maximum(p - dense_q, 0.0), rng_state)
    if token < 0:  # residual zero by rounding: draw from p
        token = _reference_draw(p_ids, np.maximum(p, 0.0), rng_state)
    return token


def accept_block_reference(p_ids, p_probs, p_lens, draft_tokens, q_ids, q_probs, q_lens,
                           rng_state, scratch):
    """accept_block_kernel in plain numpy: same rule, same summation order, same RNG stream.
    Arrays as accept_block (typed and valid: no checks). Returns (emitted int32, n_accepted)."""
    k = len(draft_tokens)
    ps = [(p_ids[i, : p_lens[i]], p_probs[i, : p_lens[i]].astype(np.float64)) for i in range(k + 1)]
    qs = [(q_ids[i, : q_lens[i]], q_probs[i, : q_lens[i]]) for i in range(k)]
    r = [1.0]  # r[i]: the residual mass after i drafts (the paper's p_i)
    num = den = 0.0
    for i in range(k):
        d = int(draft_tokens[i])
        num = r[i] * _ref_p_of(*ps[i], d)
        den = _ref_first(*qs[i], d)
        r.append(0.0 if num <= 0.0 else 1.0 if num >= den else num / den)
    tau = 0
    if k and _ref_stop(num, den, rng_state):  # h_k = r_k
        tau = k
    else:
        for i in range(k - 1, 0, -1):
            if r[i] <= 0.0:
                continue
            if r[i] >= 1.0:
                tau = i
                break
            rho = _ref_residual_mass(*ps[i], *qs[i], r[i], scratch)
            if _ref_stop(rho, rho + (1.0 - r[i]), rng_state):
                tau = i
                break
    out = np.empty(tau + 1, dtype=np.int32)
    out[:tau] = np.asarray(draft_tokens[:tau])
    if tau == k:
        pk_ids, pk = ps[k]
        positive = np.flatnonzero(pk > 0)
        out[tau] = (int(pk_ids[positive[0]]) if positive.size == 1
                    else _reference_draw(pk_ids, np.maximum(pk, 0.0), rng_state))
    else:
        out[tau] = _ref_block_residual(*ps[tau], *qs[tau], r[tau], rng_state, scratch)
    return out, tau
