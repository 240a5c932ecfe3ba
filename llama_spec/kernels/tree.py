"""Tree rule: recursive rejection sampling without replacement over a tree proposal.

Words (docs/design.md): a tree proposal has nodes (token, parent, q); siblings share a parent and were
drawn from the drafter's q at the parent *without replacement*, in increasing node index (that
order is the draw order, and the rule tries siblings in it). A path runs from the root to a leaf.

At a position with target p and siblings c_1 .. c_m (q_1 = q at the parent):
    for i = 1 .. m: accept c_i with probability min(1, p_i(c_i) / q_i(c_i)); on rejection
        p_{i+1} = norm((p_i - q_i)+) and q_{i+1} = q_i without c_i, renormalized;
    the first accepted child is emitted and the rule descends into it (p at that child);
    all rejected: the *recovered* token is drawn from p_{m+1};
    a position without children (an accepted leaf, or the root of an empty tree): the *bonus*
        token is drawn from p there.
Every emitted token is distributed as p (Jeon et al. 2024, "Recursive Speculative Decoding";
SpecInfer / Sequoia use the same residual recursion). With one child everywhere it *is* the token
rule: those positions call accept.py's step itself, so the decisions and the RNG stream are the
token rule's bit for bit (accept_draft on the chain).

Array layout (rows: r = 0 is the root position, the last emitted token; r = i + 1 is node i)
    node_token[n]   int: the draft token of node i (n <= MAX_TREE_NODES = 64; n = 0 allowed).
    node_parent[n]  int: -1 for a child of the root, else a node index < i (topological order).
                    Siblings carry distinct tokens.
    p_ids[n + 1, Lp], p_probs[n + 1, Lp], p_lens[n + 1]: row r = the target's p at position r
                    (the distribution of the token *after* node r - 1), first p_lens[r] entries.
                    The verification batch [root, node 0 .. node n - 1] yields them in this order.
    q_ids[n + 1, Lq], q_probs[n + 1, Lq], q_lens[n + 1]: row r = the drafter's q at position r,
                    from which the children of row r were drawn; every child is in it with q > 0.
                    Rows of positions without children are ignored (q_lens[r] = 0 is allowed).
    Returns (emitted int32[n_accepted + 1], path int32[n_accepted], n_accepted): the accepted
    drafts then the recovered or bonus token; path = the accepted node indices, root to leaf.

Randomness consumed (accept_rng, the xoshiro256** state of accept.py; one uniform = one step):
    one child: exactly the token rule's accept_step (see accept.py's docstring).
    no child: the bonus draw, one uniform unless p is one-hot.
    m >= 2 children, per sibling tried: none if p_i is one-hot (the matching sibling, if any, is
        accepted, else that token is emitted: deterministic), none if p_i(c) >= q_i(c) or
        p_i(c) = 0, else one uniform u, accepted iff u * q_i(c) < p_i(c). All rejected: one uniform
        for the recovered draw from p_{m+1} (two passes over p's support in accept._draw).
    Same state + same inputs -> same output, bit for bit (testing/reference_tree.py mirrors it).

Numerics: residuals are kept in float64 in units where p outside q's support never changes
(the residual only moves on q's support, at most 64 entries): W_1 = p, T_1 = 1, S_1 = 1, and
p_i = W_i / T_i, q_i = Q_i / S_i with W_{i+1} = (W_i - Q_i * T_i / S_i)+, T_{i+1} = sum W_{i+1}
(p's mass outside q plus the new W on q), Q_{i+1} = Q_i without c_i, S_{i+1} = sum Q_{i+1}. Step 1
therefore compares exactly what the token rule compares. If a residual has no positive entry
(only rounding can do that: it would mean a rejection of probability 0) the token is drawn from
the position's p instead.

Kernels (numba, cache=True, no checks: the caller guarantees the preconditions above, int32 ids,
float32 probs, a uint64[4] state, an all-zero float32 scratch of length > every id):
    accept_node_kernel(p_ids, p_probs, child_tokens, q_ids, q_probs, rng_state, scratch)
        -> (token, index): one position; index of the accepted child in child_tokens, or -1 when
        the token is recovered (or the bonus, for zero children). The loop calls this one per
        position when the target sampler must accept tokens between positions.
    accept_tree_kernel(node_token, node_parent, p_ids, p_probs, p_lens, q_ids, q_probs, q_lens,
                       rng_state, scratch, out_tokens, out_path) -> n_accepted
        out_tokens has length >= depth + 1, out_path >= depth (n + 1 and n always suffice).
Python wrapper: accept_tree(...) validates (ValueError naming the argument; UnnormalizedError
when valid but p or q does not sum to 1 +- 1e-3) and calls the kernel.
"""

from __future__ import annotations

import numba
import numpy as np

from llama_spec.kernels.token import (
    UnnormalizedError,
    _accept_step,
    _as_ids,
    _as_probs,
    _bonus_token,
    _check_rng,
    _check_vocab,
    _draw,
    _get_scratch,
    _inner,
    _max_id,
    _next_uniform,
    _rows_2d,
    _thread_scratch,
    p_is_normalized,
)
from llama_spec.kernels.tree_shape import MAX_TREE_NODES, validate_parents

__all__ = ["accept_node_kernel", "accept_tree", "accept_tree_kernel"]


@_inner
def _forced_choice(forced, child_tokens, start, m):
    """p_i one-hot on `forced`: the matching sibling from `start` on (no randomness), else -1."""
    for j in range(start, m):
        if child_tokens[j] == forced:
            return np.int64(forced), np.int64(j)
    return np.int64(forced), np.int64(-1)


@_inner
def _accept_many(p_ids, p_probs, child_tokens, m, q_ids, q_probs, rng_state, scratch):
    """m >= 2 siblings at one position; see the module docstring for the recursion."""
    nq = q_ids.shape[0]
    n_p = p_ids.shape[0]
    for j in range(nq):  # mark q's support: scratch holds index + 1 (exact in float32)
        scratch[q_ids[j]] = j + 1
    w = np.zeros(nq)  # W on q's support (0 where p has no entry)
    pos = np.full(nq, -1, np.int64)  # where q's entry sits in p's support
    out_sum = 0.0  # p's mass outside q's support (never changes)
    out_pos = 0  # positive p entries outside q's support
    out_first = -1
    for i in range(n_p):
        k = np.int64(scratch[p_ids[i]])
        x = np.float64(p_probs[i])
        if k > 0:
            w[k - 1] = x
            pos[k - 1] = i
        elif x > 0.0:
            out_sum += x
            out_pos += 1
            if out_first < 0:
                out_first = i
    for j in range(nq):
        scratch[q_ids[j]] = 0.0
    qv = np.empty(nq)
    for j in range(nq):
        qv[j] = np.float64(q_probs[j])
    t = 1.0  # sum of W (p treated as normalized at step 1, as the token rule does)
    s = 1.0  # sum of Q
    for i in range(m):
        n_pos = out_pos
        forced = np.int64(-1) if out_first < 0 else np.int64(p_ids[out_first])
        for j in range(nq):
            if w[j] > 0.0:
                n_pos += 1
                forced = np.int64(q_ids[j])
        if n_pos == 1:
            return _forced_choice(forced, child_tokens, i, m)
        if n_pos == 0:  # residual lost to rounding: draw from p at this position
            return _bonus_token(p_ids, p_probs, rng_state), np.int64(-1)
        c = child_tokens[i]
        k = 0
        while q_ids[k] != c:
            k += 1
        wx, qx = w[k], qv[k]
        if wx > 0.0:
            if wx * s >= qx * t:  # p_i(c) >= q_i(c): certain, no uniform
                return np.int64(c), np.int64(i)
            if _next_uniform(rng_state) * (qx * t) < wx * s:  # u < p_i(c) / q_i(c)
                return np.int64(c), np.int64(i)
        ratio = t / s  # W_{i+1} = (W_i - Q_i * T_i / S_i)+ on q's support
        for j in range(nq):
            x = w[j] - qv[j] * ratio
            w[j] = x if x > 0.0 else 0.0
        qv[k] = 0.0
        s = 0.0
        t = out_sum
        for j in range(nq):
            s += qv[j]
            t += w[j]
    # All m rejected: the recovered token from the residual p_{m+1} over p's support.
    work = np.empty(n_p)
    for i in range(n_p):
        work[i] = np.float64(p_probs[i])
    for j in range(nq):
        if pos[j] >= 0:
            work[pos[j]] = w[j]
    token = _draw(p_ids, work, None, rng_state)
    if token < 0:
        token = _bonus_token(p_ids, p_probs, rng_state)
    return token, np.int64(-1)


@_inner
def _accept_node(p_ids, p_probs, child_tokens, m, q_ids, q_probs, rng_state, scratch):
    """One position: (token, index of the accepted child or -1)."""
    if m == 0:
        return _bonus_token(p_ids, p_probs, rng_state), np.int64(-1)
    if m == 1:  # the token rule itself: same decisions, same uniforms
        token, accepted = _accept_step(
            p_ids, p_probs, child_tokens[0], q_ids, q_probs, rng_state, scratch
        )
        return token, np.int64(0 if accepted else -1)
    return _accept_many(p_ids, p_probs, child_tokens, m, q_ids, q_probs, rng_state, scratch)


@_inner
def _accept_tree(node_token, node_parent, p_ids, p_probs, p_lens, p_row, q_ids, q_probs, q_lens,
                 q_row, rng_state, scratch, out_tokens, out_path):
    """The tree walk. p_row / q_row map a position row to a table row (None: the identity);
    testing/reference_tree.py's Monte Carlo driver uses them to share one table of contexts."""
    n = node_token.shape[0]
    sib_tok = np.empty(max(n, 1), np.int64)
    sib_node = np.empty(max(n, 1), np.int64)
    r = 0
    n_acc = 0
    while True:
        m = 0
        for j in range(r, n):  # children of row r (node r - 1) come after it
            if node_parent[j] == r - 1:
                sib_tok[m] = node_token[j]
                sib_node[m] = j
                m += 1
        pr = r
        if p_row is not None:
            pr = p_row[r]
        qr = r
        if q_row is not None:
            qr = q_row[r]
        npl, nql = p_lens[pr], q_lens[qr]
        token, idx = _accept_node(p_ids[pr, :npl], p_probs[pr, :npl], sib_tok, m,
                                  q_ids[qr, :nql], q_probs[qr, :nql], rng_state, scratch)
        out_tokens[n_acc] = token
        if idx < 0:
            return n_acc
        out_path[n_acc] = sib_node[idx]
        n_acc += 1
        r = sib_node[idx] + 1


@numba.njit(cache=True)
def accept_node_kernel(p_ids, p_probs, child_tokens, q_ids, q_probs, rng_state, scratch):
    return _accept_node(p_ids, p_probs, child_tokens, child_tokens.shape[0], q_ids, q_probs,
                        rng_state, scratch)


@numba.njit(cache=True)
def accept_tree_kernel(node_token, node_parent, p_ids, p_probs, p_lens, q_ids, q_probs, q_lens,
                       rng_state, scratch, out_tokens, out_path):
    return _accept_tree(node_token, node_parent, p_ids, p_probs, p_lens, None, q_ids, q_probs,
                        q_lens, None, rng_state, scratch, out_tokens, out_path)


# --------------------------------------------------------------------------------------------
# Python side: validation and the wrapper.


def _int_vector(x, name: str, n: int | None = None) -> np.ndarray:
    a = np.asarray(x)
    if a.ndim != 1 or (a.size and a.dtype.kind not in "iu"):
        raise ValueError(f"{name} must be a 1-D integer array, got dtype {a.dtype} shape {a.shape}")
    if n is not None and a.shape[0] != n:
        raise ValueError(f"{name} has length {a.shape[0]}, expected {n}")
    return a.astype(np.int64)


def _check_rows(ids, probs, lens, name: str, n_rows: int, min_len: int):
    ids = _rows_2d(ids, f"{name}_ids", n_rows, "iu")
    probs = _rows_2d(probs, f"{name}_probs", n_rows, "f")
    if ids.shape != probs.shape:
        raise ValueError(f"{name}_ids and {name}_probs must have the same shape")
    lens = _int_vector(lens, f"{name}_lens", n_rows)
    if ((lens < min_len) | (lens > ids.shape[1])).any():
        raise ValueError(f"a length in {name}_lens is outside [{min_len}, {ids.shape[1]}]")
    return ids, probs, lens


def _checked_row(ids, probs, n: int, name: str, n_vocab: int | None):
    """One support, checked like accept.py checks one; normalization last (UnnormalizedError)."""
    a = _as_ids(ids[:n], f"{name}_ids", n_vocab)
    b = _as_probs(probs[:n], f"{name}_probs", n)
    if not p_is_normalized(b):
        raise UnnormalizedError(name, float(b.sum(dtype=np.float64)), 1e-3)
    return a, b


def _validate_children(tokens: np.ndarray, parents: np.ndarray, qi, qp, q_lens) -> None:
    """Siblings distinct, each in its parent's q with q > 0 (they were drawn from it)."""
    for r in range(tokens.shape[0] + 1):
        kids = tokens[parents == r - 1]
        if not kids.size:
            continue
        if np.unique(kids).size != kids.size:
            raise ValueError(f"node_token: siblings under row {r} repeat a token "
                             "(children are drawn without replacement)")
        support = dict(zip(qi[r, : q_lens[r]].tolist(), qp[r, : q_lens[r]].tolist(), strict=True))
        for t in kids.tolist():
            if not support.get(t, 0.0) > 0.0:
                raise ValueError(f"node_token: child {t} of row {r} is not in q_ids[{r}] with q > 0")


def _validate_tree(node_token, node_parent, p_ids, p_probs, p_lens, q_ids, q_probs, q_lens,
                   n_vocab):
    """Checked, repacked (int32 ids, float32 probs, int64 lens) arrays; see accept_tree."""
    tokens = _int_vector(node_token, "node_token")
    n = tokens.shape[0]
    if n > MAX_TREE_NODES:
        raise ValueError(f"node_token has {n} nodes, more than the cap of {MAX_TREE_NODES}")
    parents = validate_parents(_int_vector(node_parent, "node_parent", n), "node_parent")
    if n and (tokens.min() < 0 or (n_vocab is not None and tokens.max() >= n_vocab)):
        raise ValueError("node_token has ids outside the vocabulary")
    p_ids, p_probs, p_lens = _check_rows(p_ids, p_probs, p_lens, "p", n + 1, 1)
    q_ids, q_probs, q_lens = _check_rows(q_ids, q_probs, q_lens, "q", n + 1, 0)
    has_kids = np.zeros(n + 1, bool)
    has_kids[parents + 1] = True
    if (q_lens[has_kids] < 1).any():
        raise ValueError("q_lens is 0 at a position that has children")
    pi = np.zeros(p_ids.shape, np.int32)
    pp = np.zeros(p_ids.shape, np.float32)
    qi = np.zeros(q_ids.shape, np.int32)
    qp = np.zeros(q_ids.shape, np.float32)
    n_needed = int(tokens.max()) + 1 if n else 1
    for r in range(n + 1):
        a, b = _checked_row(p_ids[r], p_probs[r], int(p_lens[r]), "p", n_vocab)
        pi[r, : a.shape[0]], pp[r, : a.shape[0]] = a, b
        n_needed = max(n_needed, int(a.max()) + 1)
        if has_kids[r]:
            c, d = _checked_row(q_ids[r], q_probs[r], int(q_lens[r]), "q", n_vocab)
            qi[r, : c.shape[0]], qp[r, : c.shape[0]] = c, d
            n_needed = max(n_needed, int(c.max()) + 1)
        else:
            q_lens[r] = 0  # ignored rows: nothing of them reaches the kernel
    _validate_children(tokens, parents, qi, qp, q_lens)
    return tokens.astype(np.int32), parents.astype(np.int32), pi, pp, p_lens, qi, qp, q_lens, n_needed


def accept_tree(node_token, node_parent, p_ids, p_probs, p_lens, q_ids, q_probs, q_lens, rng_state,
                scratch=None, n_vocab=None, validate=True):
    """The tree rule over one tree proposal -> (emitted int32[n_acc + 1], path int32[n_acc], n_acc).

    Arrays as in the module docstring: node_token[n], node_parent[n] (-1 = child of the root),
    p_*[n + 1, Lp] with p_lens[n + 1], q_*[n + 1, Lq] with q_lens[n + 1]. validate=False passes
    the arrays straight to the kernel (the caller guarantees dtypes and preconditions)."""
    if validate:
        _check_rng(rng_state)
        n_vocab = _check_vocab(n_vocab)
        (node_token, node_parent, p_ids, p_probs, p_lens, q_ids, q_probs, q_lens,
         n_needed) = _validate_tree(node_token, node_parent, p_ids, p_probs, p_lens, q_ids, q_probs,
                                    q_lens, n_vocab)
        scratch = _get_scratch(scratch, n_needed if n_vocab is None else n_vocab)
        if scratch[p_ids.ravel()].any() or scratch[q_ids.ravel()].any():
            raise ValueError("scratch is not zero at the ids in use (it must start all zero)")
    elif scratch is None:
        scratch = _thread_scratch(_max_id(p_ids, q_ids) + 1)
    n = node_token.shape[0]
    out_tokens = np.empty(n + 1, np.int32)
    out_path = np.empty(max(n, 1), np.int32)
    n_acc = int(accept_tree_kernel(node_token, node_parent, p_ids, p_probs, p_lens, q_ids, q_probs,
                                   q_lens, rng_state, scratch, out_tokens, out_path))
    return out_tokens[: n_acc + 1], out_path[:n_acc], n_acc
