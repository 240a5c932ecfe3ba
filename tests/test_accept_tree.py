"""The tree rule (llama_spec.kernels.tree): exact law by enumeration, chi-square with stated power,
kernel == numpy reference bit for bit, width 1 == the token rule, greedy, bad input.

Statistics: 20 chi-square tests (4 trees x 5 (p, q) families) share a family-wise false-alarm
budget of 1e-4 (Bonferroni: alpha = 5e-6 each); each test's N is the smallest of a grid for which
the noncentral chi-square power against a broken rule is > 1 - 1e-4, and the broken rules are run
through the same harness and must fail it.
"""

from __future__ import annotations

import functools
import itertools

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from scipy import stats

from llama_spec.kernels import token as A
from llama_spec.kernels.block import accept_draft
from llama_spec.kernels.tree import accept_node_kernel, accept_tree, accept_tree_kernel
from llama_spec.kernels.tree_shape import build_tree
from llama_spec.testing import reference_tree as RT

FULL_VOCAB = 151_936
TREES = ((3, 1), (2, 2), (4,), (2, 1, 1))
FAMILIES = ("q_outside_p", "one_hot_p", "q_near_p", "q_far_from_p", "full_vocab_p")
ALPHA = 1e-4 / (len(TREES) * len(FAMILIES))
POWER_MIN = 1 - 1e-4
N_GRID = (4_000, 8_000, 16_000, 32_000, 64_000, 128_000)
BROKEN = ("keep_rejected_in_q", "unnormalized_residual")


def _f32(w):
    w = np.asarray(w, np.float64)
    return (w / w.sum()).astype(np.float32)


# ---------------------------------------------------------------------------------------------
# (p, q) families as context tables.


def _family(name: str, depth: int, seed: int) -> RT.ContextTables:
    """Target and drafter tables for one (p, q) shape family over a tree of `depth` levels.
    p is over 8 tokens (0..7) except at the root of full_vocab_p; q over 8 tokens."""
    rng = np.random.default_rng(seed)
    small = np.arange(8, dtype=np.int32)
    rows: dict = {}

    def dirichlet(a=1.0):
        return rng.dirichlet(np.full(8, a))

    if name == "full_vocab_p":  # the root's p covers the whole vocabulary
        logits = rng.normal(0.0, 1.0, FULL_VOCAB)
        w = np.exp(logits)
        top = rng.choice(FULL_VOCAB, 6, replace=False)
        w[top] = w.sum() * np.array([0.3, 0.2, 0.15, 0.1, 0.05, 0.02]) / 0.18  # 82 % on 6 tokens
        root_p = (np.arange(FULL_VOCAB, dtype=np.int32), _f32(w))
        extra = rng.choice(np.setdiff1d(np.arange(FULL_VOCAB), top), 2, replace=False)
        root_q = (np.concatenate([top, extra]).astype(np.int32), _f32(dirichlet()))
        pool = [(small, _f32(dirichlet())) for _ in range(8)]
        return RT.build_tables(FULL_VOCAB, depth,
                               lambda pre: root_p if not pre else pool[hash(pre) % 4],
                               lambda pre: root_q if not pre else pool[4 + hash(pre) % 4])

    def target(pre):
        if ("p", pre) not in rows:
            w = dirichlet()
            if name == "one_hot_p" and pre and pre[-1] % 2 == 0:  # one-hot at half the nodes
                w = np.eye(8)[rng.integers(8)]
            rows[("p", pre)] = (small, _f32(w))
        return rows[("p", pre)]

    def drafter(pre):
        if ("q", pre) in rows:
            return rows[("q", pre)]
        p64 = target(pre)[1].astype(np.float64)
        if name == "q_outside_p":  # 4 of p's tokens and 4 that p gives probability 0
            row = (np.array([0, 1, 2, 3, 8, 9, 10, 11], np.int32), _f32(dirichlet()))
        elif name == "q_near_p":
            row = (small, _f32(0.6 * p64 + 0.4 * dirichlet()))
        elif name == "q_far_from_p":
            row = (small, _f32(1.0 / (p64 + 0.05)))
        else:
            row = (small, _f32(dirichlet()))
        rows[("q", pre)] = row
        return row

    return RT.build_tables(12, depth, target, drafter)


@functools.cache
def _case(tree: tuple[int, ...], family: str):
    """(tables, aligned arrays (law keys, exact probabilities, {variant: broken probabilities}))."""
    tables = _family(family, len(tree), seed=FAMILIES.index(family) * 10 + len(tree))
    law = RT.exact_tree_law(tables, tree)
    keys = sorted(law)
    e = np.array([law[k] for k in keys])
    b = {}
    for v in BROKEN:
        broken = RT.exact_tree_law(tables, tree, v)
        b[v] = np.array([broken.get(k, 0.0) for k in keys])
    return tables, (keys, e, b)


# ---------------------------------------------------------------------------------------------
# The chi-square harness: pooled cells, p-value, computed power.


def _pooled(x: np.ndarray, big: np.ndarray) -> np.ndarray:
    """Cells with expected count >= 5 kept apart, the others pooled into one cell."""
    return np.append(x[big], x[~big].sum()) if (~big).any() else x[big]


def chisquare_pvalue(cells: np.ndarray, tables: RT.ContextTables, arrays) -> float:
    """Goodness of fit of the emitted (context, token) cells to the exact law. A cell outside the
    law's support (probability 0) gives p-value 0."""
    keys, e, _ = arrays
    ids = np.array([c * tables.n_vocab + t for c, t in keys], np.int64)
    order = np.argsort(ids)
    at = np.minimum(np.searchsorted(ids[order], cells), ids.shape[0] - 1)
    if (ids[order][at] != cells).any():
        return 0.0
    obs = np.bincount(order[at], minlength=ids.shape[0]).astype(np.float64)
    big = e * cells.shape[0] >= 5.0
    o, x = _pooled(obs, big), _pooled(e, big)
    return float(stats.chisquare(o, x * o.sum() / x.sum()).pvalue)


def power(arrays, variant: str, n: int, alpha: float) -> float:
    """Power of the harness at n against the broken rule `variant` (noncentral chi-square
    approximation; broken mass on impossible cells is caught with probability 1 - e^{-n m})."""
    _, e, b = arrays
    big = e * n >= 5.0
    ep, bp = _pooled(e, big), _pooled(b[variant], big)
    outside = max(0.0, 1.0 - float(b[variant].sum()))
    lam = n * float(np.sum((bp - ep) ** 2 / ep))
    df = ep.shape[0] - 1
    chi = float(stats.ncx2.sf(stats.chi2.isf(alpha, df), df, lam)) if df > 0 else 0.0
    return 1.0 - (1.0 - chi) * float(np.exp(-n * outside))


def _design(tree, family):
    """(N, variant, power): the smallest N of the grid with power > POWER_MIN against a variant."""
    arrays = _case(tree, family)[1]
    for n in N_GRID:
        best = max(BROKEN, key=lambda v: power(arrays, v, n, ALPHA))
        pw = power(arrays, best, n, ALPHA)
        if pw > POWER_MIN:
            return n, best, pw
    return N_GRID[-1], best, pw


# ---------------------------------------------------------------------------------------------
# 1. Exact enumeration on tiny vocabularies: the extended law equals the target's.


def _full_tables(n_vocab: int, depth: int, seed: int) -> RT.ContextTables:
    """Every context to `depth` over the whole (tiny) vocabulary; q covers it, with some zeros."""
    rng = np.random.default_rng(seed)
    ids = np.arange(n_vocab, dtype=np.int32)

    def row(_):
        w = rng.dirichlet(np.full(n_vocab, 0.7))
        w[rng.random(n_vocab) < 0.2] = 0.0
        if np.count_nonzero(w) < 2:
            w[:2] += 0.5
        return ids, _f32(w)

    def q_row(_):
        w = rng.dirichlet(np.full(n_vocab, 0.7))
        w[rng.integers(n_vocab)] = 0.0 if rng.random() < 0.3 else w[0]
        w[: 2 if np.count_nonzero(w) < 2 else 0] += 0.3
        return ids, _f32(w)

    return RT.build_tables(n_vocab, depth, row, q_row)


def _extended_laws(tables: RT.ContextTables, law: dict, depth: int):
    """(emitted law extended with target draws to depth + 1 tokens, target law), dense V^(d+1)."""
    v = tables.n_vocab
    index = {pre: c for c, pre in enumerate(tables.prefix)}

    def p_of(pre):
        return RT._dense(tables.p(index[pre]), v)

    target = np.zeros((v,) * (depth + 1))
    for seq in itertools.product(range(v), repeat=depth + 1):
        prob = 1.0
        for k in range(depth + 1):
            prob *= p_of(seq[:k])[seq[k]]
        target[seq] = prob
    got = np.zeros_like(target)
    for (ctx, tok), prob in law.items():
        pre = tables.prefix[ctx] + (tok,)
        for tail in itertools.product(range(v), repeat=depth + 1 - len(pre)):
            seq, pr = pre + tail, prob
            for k in range(len(pre), depth + 1):
                pr *= p_of(seq[:k])[seq[k]]
            got[seq] += pr
    return got, target


@pytest.mark.parametrize("tree", [(2,), (3,), (2, 1), (2, 2)])
@pytest.mark.parametrize("n_vocab", [3, 4, 5])
def test_exact_law_equals_target(tree, n_vocab):
    for seed in range(3):
        tables = _full_tables(n_vocab, len(tree), seed=100 * n_vocab + seed)
        law = RT.exact_tree_law(tables, tree)
        assert abs(sum(law.values()) - 1.0) < 1e-12
        got, target = _extended_laws(tables, law, len(tree))
        assert np.max(np.abs(got - target)) < 1e-9
        # the same check rejects both broken rules
        if seed == 0 and max(tree) > 1 and n_vocab > 3:
            for v in BROKEN:
                bad, _ = _extended_laws(tables, RT.exact_tree_law(tables, tree, v), len(tree))
                assert np.max(np.abs(bad - target)) > 1e-3, v


def _token_rule_chain_law(tables: RT.ContextTables, k: int) -> dict:
    """The token rule over a k-chain, written independently: accept x w.p. min(p, q)(x)."""
    out: dict = {}

    def walk(ctx, prob, level):
        p = RT._dense(tables.p(ctx), tables.n_vocab)
        if level == k:
            for t in np.flatnonzero(p > 0):
                out[(ctx, int(t))] = out.get((ctx, int(t)), 0.0) + prob * p[t]
            return
        q_ids, q_probs = tables.q(ctx)
        q = RT._dense((q_ids, q_probs), tables.n_vocab)
        resid = np.maximum(p - q, 0.0)
        for t in np.flatnonzero(resid > 0):
            out[(ctx, int(t))] = out.get((ctx, int(t)), 0.0) + prob * resid[t]
        for j, t in enumerate(q_ids.tolist()):
            if min(p[t], q[t]) > 0:
                walk(int(tables.child[ctx, j]), prob * min(p[t], q[t]), level + 1)

    walk(0, 1.0, 0)
    return out


@pytest.mark.parametrize("k", [1, 2, 3])
def test_width_one_law_is_the_token_rule(k):
    tables = _full_tables(4, k, seed=7 + k)
    law = RT.exact_tree_law(tables, (1,) * k)
    want = _token_rule_chain_law(tables, k)
    assert set(law) == set(want)
    assert max(abs(law[c] - want[c]) for c in want) < 1e-12


# ---------------------------------------------------------------------------------------------
# 2. Chi-square on the emitted tokens' joint law, with stated power; broken rules caught.


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("tree", TREES, ids=lambda t: ",".join(map(str, t)))
def test_emitted_law_chi_square(tree, family):
    tables, arrays = _case(tree, family)
    n, variant, pw = _design(tree, family)
    assert pw > POWER_MIN, f"N={n}: power {pw:.6f} against {variant} (grid too small)"
    seed = 1000 + 10 * TREES.index(tree) + FAMILIES.index(family)
    cells = RT.sample_tree_cells(tables, tree, n, seed)
    pvalue = chisquare_pvalue(cells, tables, arrays)
    assert pvalue > ALPHA, f"{tree} {family}: p-value {pvalue:.3g} (N={n}, power {pw:.6f} vs {variant})"


@pytest.mark.parametrize("variant", BROKEN)
def test_broken_rules_fail_the_same_harness(variant):
    """The broken rule (numpy reference with `variant`) on the case where the design says the
    harness has the most power against it at the smallest N; it must fail."""
    cases = [(t, f) for t in TREES for f in FAMILIES if f != "full_vocab_p"]
    best = None
    for tree, family in cases:
        arrays = _case(tree, family)[1]
        for n in N_GRID[:3]:
            pw = power(arrays, variant, n, ALPHA)
            if pw > POWER_MIN:
                if best is None or n < best[0]:
                    best = (n, tree, family, pw)
                break
    assert best is not None, f"no case detects {variant} with N <= {N_GRID[2]}"
    n, tree, family, pw = best
    tables, arrays = _case(tree, family)
    cells = RT.sample_reference_cells(tables, tree, n, seed=77, variant=variant)
    pvalue = chisquare_pvalue(cells, tables, arrays)
    assert pvalue < ALPHA, f"{variant} passed on {tree} {family} (N={n}, power {pw:.6f})"
    # and the exact reference passes the same case (sanity of the reference driver)
    cells = RT.sample_reference_cells(tables, tree, n, seed=78, variant="exact")
    assert chisquare_pvalue(cells, tables, arrays) > ALPHA


# ---------------------------------------------------------------------------------------------
# 3. Kernel == reference bit for bit; same state -> same output; greedy; width 1 == accept_draft.


def _probs(rng, n, shape):
    if shape == "one_hot":
        w = np.zeros(n)
        w[rng.integers(n)] = 1.0
    elif shape == "zeros":
        w = rng.dirichlet(np.ones(n))
        w[rng.random(n) < 0.5] = 0.0
        if not w.any():
            w[rng.integers(n)] = 1.0
    elif shape == "tiny":
        w = 10.0 ** rng.uniform(-30, -1, n)
        w[rng.integers(n)] = 1.0
    else:
        w = rng.dirichlet(np.full(n, 0.3 if shape == "skewed" else 1.0))
    p = _f32(w)
    if not p.any():
        p[np.argmax(w)] = 1.0
    return p


def _random_tree(rng, n_vocab, one_hot=False, chain=False, big=False):
    """A random valid tree proposal: (node_token, node_parent, p rows, q rows) padded."""
    n = int(rng.integers(0, 12))
    cap = min(n_vocab, 4)  # children per position (q needs that many positive entries)
    parent = np.zeros(n, np.int64)
    for i in range(n):
        free = [j for j in range(-1, i) if np.count_nonzero(parent[:i] == j) < cap]
        parent[i] = (i - 1) if chain else int(rng.choice(free))
    shapes = ["flat", "skewed", "zeros", "tiny", "one_hot"]
    p_rows, q_rows, tokens = [], [], np.zeros(n, np.int64)
    for r in range(n + 1):
        size = int(rng.integers(2_100, 3_000)) if big and rng.random() < 0.3 else int(rng.integers(1, 40))
        ids = rng.choice(n_vocab, size=min(size, n_vocab), replace=False).astype(np.int32)
        p_rows.append((ids, _probs(rng, ids.size, "one_hot" if one_hot else rng.choice(shapes))))
        kids = np.flatnonzero(parent == r - 1)
        m = int(rng.integers(max(kids.size, 1), 30))
        overlap = ids[: int(rng.integers(0, ids.size + 1))]
        drawn = rng.choice(n_vocab, min(m, n_vocab), replace=False)
        q_ids = np.unique(np.concatenate([overlap, drawn]))[:64]
        q_ids = rng.permutation(q_ids).astype(np.int32)
        q = _probs(rng, q_ids.size, rng.choice(shapes[:4]))
        while np.count_nonzero(q) < kids.size:
            q = _probs(rng, q_ids.size, "flat")
        q_rows.append((q_ids, q))
        if kids.size:
            pick = rng.choice(np.flatnonzero(q > 0), kids.size, replace=False)
            tokens[kids] = q_ids[pick]
    return tokens, parent, RT._pad(p_rows), RT._pad(q_rows)


def _run_both(case, seed, scratch1, scratch2):
    tokens, parent, (pi, pp, pl), (qi, qp, ql) = case
    s1 = A.new_rng_state(seed)
    s2 = s1.copy()
    got = accept_tree(tokens, parent, pi, pp, pl, qi, qp, ql, s1, scratch1)
    want = RT.accept_tree_reference(tokens, parent, pi, pp, pl, qi, qp, ql, s2, scratch2)
    return got, want, s1, s2


SETTINGS = dict(deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])


@settings(max_examples=100, **SETTINGS)
@given(st.integers(0, 2**32 - 1), st.sampled_from([5, 60, 4_000]))
def test_kernel_matches_reference_bit_for_bit(seed, n_vocab):
    rng = np.random.default_rng(seed)
    case = _random_tree(rng, n_vocab, big=n_vocab == 4_000)
    sc1, sc2 = A.new_scratch(n_vocab), A.new_scratch(n_vocab)
    (tok, path, n_acc), (rtok, rpath, rn), s1, s2 = _run_both(case, seed, sc1, sc2)
    assert tok.tolist() == rtok.tolist() and path.tolist() == rpath.tolist() and n_acc == rn
    assert np.array_equal(s1, s2)
    assert not sc1.any() and not sc2.any()
    tokens, parent = case[0], case[1]
    assert tok[:n_acc].tolist() == tokens[path].tolist()  # accepted = the path's drafts
    for a, b in itertools.pairwise([-1, *path.tolist()]):
        assert parent[b] == a  # the path descends parent -> child
    # same state -> same output
    s3 = A.new_rng_state(seed)
    again = accept_tree(tokens, parent, *case[2], *case[3], s3, sc1)
    assert again[0].tolist() == tok.tolist() and np.array_equal(s3, s1)


@settings(max_examples=100, **SETTINGS)
@given(st.integers(0, 2**32 - 1))
def test_one_hot_p_everywhere_is_greedy_and_free(seed):
    rng = np.random.default_rng(seed)
    tokens, parent, (pi, pp, pl), (qi, qp, ql) = _random_tree(rng, 60, one_hot=True)
    state = A.new_rng_state(seed)
    before = state.copy()
    tok, path, n_acc = accept_tree(tokens, parent, pi, pp, pl, qi, qp, ql, state)
    assert np.array_equal(state, before), "one-hot p must consume no randomness"
    # the greedy path: at each position emit argmax p; descend into the child with that token
    r, want = 0, []
    while True:
        forced = int(pi[r, : pl[r]][np.argmax(pp[r, : pl[r]])])
        want.append(forced)
        kids = [j for j in range(len(tokens)) if parent[j] == r - 1 and tokens[j] == forced]
        if not kids:
            break
        r = kids[0] + 1
    assert tok.tolist() == want and n_acc == len(want) - 1


@settings(max_examples=100, **SETTINGS)
@given(st.integers(0, 2**32 - 1), st.sampled_from([60, 4_000]))
def test_width_one_chain_equals_accept_draft(seed, n_vocab):
    rng = np.random.default_rng(seed)
    tokens, parent, (pi, pp, pl), (qi, qp, ql) = _random_tree(rng, n_vocab, chain=True,
                                                                big=n_vocab == 4_000)
    k = tokens.shape[0]
    s1 = A.new_rng_state(seed)
    s2 = s1.copy()
    tok, path, n_acc = accept_tree(tokens, parent, pi, pp, pl, qi, qp, ql, s1)
    # accept_draft wants k q rows (no row for the last position) and q_lens >= 1
    d_tok, d_acc = accept_draft(pi, pp, pl, tokens, qi[:k], qp[:k], ql[:k], s2)
    assert tok.tolist() == d_tok.tolist() and n_acc == d_acc
    assert path.tolist() == list(range(n_acc))
    assert np.array_equal(s1, s2)


def test_node_kernel_and_tree_kernel_agree_on_a_star():
    """accept_node_kernel on the root's children (+ the bonus at an accepted leaf) ==
    accept_tree_kernel on the (4,) tree."""
    rng = np.random.default_rng(5)
    for case in range(300):
        p_ids = rng.choice(100, 30, replace=False).astype(np.int32)
        p = _probs(rng, 30, ("flat", "skewed", "zeros")[case % 3])
        q_ids = rng.choice(100, 10, replace=False).astype(np.int32)
        q = _probs(rng, 10, "flat")
        kids = q_ids[rng.choice(10, 4, replace=False)]
        s1, s2 = A.new_rng_state(case), A.new_rng_state(case)
        scratch = A.new_scratch(100)
        tok, idx = accept_node_kernel(p_ids, p, kids.astype(np.int64), q_ids, q, s1, scratch)
        pi = np.tile(p_ids, (5, 1))
        pp = np.tile(p, (5, 1))
        qi = np.tile(q_ids, (5, 1))
        qp = np.tile(q, (5, 1))
        out_t, out_p = np.empty(5, np.int32), np.empty(4, np.int32)
        n_acc = accept_tree_kernel(kids.astype(np.int32), np.full(4, -1, np.int32), pi, pp,
                                   np.full(5, 30), qi, qp, np.full(5, 10), s2, scratch, out_t, out_p)
        if idx < 0:
            assert n_acc == 0 and out_t[0] == tok
        else:
            assert n_acc == 1 and out_p[0] == idx and out_t[0] == tok
            # the tree walk went on to the accepted leaf: its bonus draw, from p at that row
            assert out_t[1] == A.bonus_token_kernel(p_ids, p, s1)
        assert np.array_equal(s1, s2)


# ---------------------------------------------------------------------------------------------
# 4. Expected accepted drafts per verification, exactly: a tree vs its width-1 sub-chain.


def test_tree_never_worse_than_its_sub_chain():
    """Exact means by enumeration on random instances; by coupling (the first sibling's subtree
    is the chain), the tree's mean accepted length is >= the chain's. Printed for the report."""
    rows = []
    for seed in range(6):
        for tree in ((2, 1), (3, 1), (2, 2)):
            tables = _full_tables(4, len(tree), seed=500 + seed)
            tree_mean = RT.expected_accepted(tables, RT.exact_tree_law(tables, tree))
            chain_mean = RT.expected_accepted(tables, RT.exact_tree_law(tables, (1,) * len(tree)))
            rows.append((seed, tree, chain_mean, tree_mean))
            assert tree_mean >= chain_mean - 1e-12, (seed, tree, chain_mean, tree_mean)
    gains = [t / c - 1 for _, _, c, t in rows if c > 0]
    print(f"\nmean accepted drafts, chain -> tree over {len(rows)} instances: "
          f"gain min {min(gains):+.1%}, median {np.median(gains):+.1%}, max {max(gains):+.1%}")
    assert np.median(gains) > 0.0


# ---------------------------------------------------------------------------------------------
# 5. Bad input: ValueError before anything runs (the RNG state is untouched).


def _valid_star():
    p_ids = np.arange(6, dtype=np.int32)
    p = _f32(np.ones(6))
    rows = lambda a: np.tile(a, (3, 1))  # noqa: E731
    return dict(node_token=np.array([1, 2]), node_parent=np.array([-1, -1]),
                p_ids=rows(p_ids), p_probs=rows(p), p_lens=np.full(3, 6),
                q_ids=rows(p_ids[:4]), q_probs=rows(_f32(np.ones(4))), q_lens=np.array([4, 0, 0]))


BAD_TREES = {
    "parent after child": dict(node_parent=np.array([-1, 1])),
    "parent below -1": dict(node_parent=np.array([-2, -1])),
    "parent length": dict(node_parent=np.array([-1])),
    "float parents": dict(node_parent=np.array([-1.0, -1.0])),
    "duplicate siblings": dict(node_token=np.array([1, 1])),
    "child not in q": dict(node_token=np.array([1, 5])),
    "child with q = 0": dict(q_probs=np.tile(np.array([0.5, 0.5, 0.0, 0.0], np.float32), (3, 1))),
    "q_lens 0 with children": dict(q_lens=np.array([0, 0, 0])),
    "p rows": dict(p_ids=np.zeros((2, 6), np.int32)),
    "p_lens too long": dict(p_lens=np.full(3, 7)),
    "negative token": dict(node_token=np.array([1, -2])),
    "NaN in p": dict(p_probs=np.tile(np.array([np.nan, 0.2, 0.2, 0.2, 0.2, 0.2], np.float32), (3, 1))),
    "more than 64 nodes": dict(node_token=np.zeros(65, np.int64), node_parent=np.full(65, -1)),
}


@pytest.mark.parametrize("case", sorted(BAD_TREES))
def test_bad_input_raises_before_anything(case):
    state = A.new_rng_state(1)
    before = state.copy()
    kwargs = _valid_star() | BAD_TREES[case]
    with pytest.raises(ValueError) as info:
        accept_tree(**kwargs, rng_state=state)
    assert not isinstance(info.value, A.UnnormalizedError)
    assert np.array_equal(state, before)
    ok = accept_tree(**_valid_star(), rng_state=state)  # the valid call works
    assert ok[2] in (0, 1)


def test_unnormalized_rows_raise_unnormalized_error():
    kwargs = _valid_star()
    kwargs["p_probs"] = kwargs["p_probs"] * 0.9
    with pytest.raises(A.UnnormalizedError):
        accept_tree(**kwargs, rng_state=A.new_rng_state(1))


def test_layout_from_tree_shape_feeds_the_kernel():
    """build_tree's parents are in the order the kernel expects (children after parents)."""
    lay = build_tree((2, 2))
    rng = np.random.default_rng(0)
    ids = np.arange(8, dtype=np.int32)
    p_rows = [(ids, _probs(rng, 8, "flat")) for _ in range(lay.n_nodes + 1)]
    q_rows = [(ids, _probs(rng, 8, "flat")) for _ in range(lay.n_nodes + 1)]
    tokens = np.zeros(lay.n_nodes, np.int64)
    for r in range(lay.n_nodes + 1):
        kids = np.flatnonzero(lay.parent == r - 1)
        tokens[kids] = rng.choice(8, kids.size, replace=False)
    tok, path, n_acc = accept_tree(tokens, lay.parent, *RT._pad(p_rows), *RT._pad(q_rows),
                                   A.new_rng_state(3))
    assert len(tok) == n_acc + 1 and n_acc <= lay.max_depth
