"""The tree rule in plain numpy (same rule, same float64 operations, same RNG stream as
llama_spec.kernels.tree's kernel), its exact law by enumeration, and a Monte Carlo driver.

For tests and benchmarks only; production code never imports this module.

- accept_node_reference / accept_tree_reference: mirrors of accept_node_kernel / accept_tree_kernel.
  ``variant`` selects deliberately broken rules so tests can show their harness catches them:
  "keep_rejected_in_q" (a rejected sibling stays in q, q not renormalized) and
  "unnormalized_residual" (p <- (p - q)+ without dividing by its mass).
- ContextTables: p and q for every context (token prefix) a tree of a given depth can reach, the
  target and drafter as lookup tables. Rows are shared between contexts (ctx_p, ctx_q), so one
  full-vocabulary p row costs its size once.
- exact_tree_law: the law of the emitted tokens, integrating analytically over the drafts (drawn
  without replacement) and every accept decision: {(context of the last accepted node, final
  token): probability}. expected_accepted: the mean number of accepted drafts, from the same sums.
- sample_tree_cells: n rounds of draft (Gumbel-top-k, its own RNG) + the kernel's tree walk,
  compiled with numba; returns one cell id ctx * n_vocab + final token per round.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numba
import numpy as np

from llama_spec.kernels import token as A
from llama_spec.kernels.tree import _accept_tree
from llama_spec.kernels.tree_shape import _gumbel_top_k, draw_children
from llama_spec.testing import reference as R0

VARIANTS = ("exact", "keep_rejected_in_q", "unnormalized_residual")


def _seq_sum(start: float, x: np.ndarray) -> float:
    """start + x[0] + x[1] + ... left to right, as the kernel adds (np.cumsum is sequential)."""
    return float(np.cumsum(np.concatenate(([start], x)))[-1])


def _bonus_reference(p_ids, p_probs, rng_state) -> int:
    positive = np.flatnonzero(p_probs > 0)
    if positive.size == 1:
        return int(p_ids[positive[0]])
    return R0._reference_draw(p_ids, p_probs.astype(np.float64), rng_state)


def _many_reference(p_ids, p_probs, children, q_ids, q_probs, rng_state, variant):
    """accept_tree._accept_many in numpy, operation for operation."""
    where = {int(t): j for j, t in enumerate(q_ids.tolist())}
    k_of_p = np.array([where.get(int(t), -1) for t in p_ids.tolist()], np.int64)
    p64 = p_probs.astype(np.float64)
    nq = q_ids.shape[0]
    w = np.zeros(nq)
    pos = np.full(nq, -1, np.int64)
    inside = np.flatnonzero(k_of_p >= 0)
    w[k_of_p[inside]] = p64[inside]
    pos[k_of_p[inside]] = inside
    outside = np.flatnonzero((k_of_p < 0) & (p64 > 0))
    out_sum = _seq_sum(0.0, p64[outside])
    qv = q_probs.astype(np.float64)
    t = s = 1.0
    for i, c in enumerate(children):
        n_pos = outside.size + int(np.count_nonzero(w > 0))
        if n_pos == 1:
            forced = int(p_ids[outside[0]]) if outside.size else int(q_ids[np.flatnonzero(w > 0)[-1]])
            later = [j for j in range(i, len(children)) if children[j] == forced]
            return forced, (later[0] if later else -1)
        if n_pos == 0:
            return _bonus_reference(p_ids, p_probs, rng_state), -1
        k = where[int(c)]
        wx, qx = w[k], qv[k]
        if wx > 0.0 and (wx * s >= qx * t or R0._py_next_uniform(rng_state) * (qx * t) < wx * s):
            return int(c), i
        x = w - qv * (t / s)
        w = np.where(x > 0.0, x, 0.0)
        if variant != "keep_rejected_in_q":
            qv[k] = 0.0
        s = _seq_sum(0.0, qv)
        t = 1.0 if variant == "unnormalized_residual" else _seq_sum(out_sum, w)
    work = p64.copy()
    work[pos[pos >= 0]] = w[pos >= 0]
    token = R0._reference_draw(p_ids, work, rng_state)
    if token < 0:
        token = _bonus_reference(p_ids, p_probs, rng_state)
    return token, -1


def accept_node_reference(p_ids, p_probs, children, q_ids, q_probs, rng_state, scratch,
                          variant: str = "exact") -> tuple[int, int]:
    """accept_node_kernel in numpy: (token, accepted child index or -1)."""
    children = [int(c) for c in children]
    if not children:
        return _bonus_reference(p_ids, p_probs, rng_state), -1
    if len(children) == 1:
        token, accepted = R0.accept_step_reference(p_ids, p_probs, children[0], q_ids, q_probs,
                                                  rng_state, scratch)
        return int(token), (0 if accepted else -1)
    return _many_reference(p_ids, p_probs, children, q_ids, q_probs, rng_state, variant)


def accept_tree_reference(node_token, node_parent, p_ids, p_probs, p_lens, q_ids, q_probs, q_lens,
                          rng_state, scratch, variant: str = "exact"):
    """accept_tree_kernel in numpy -> (emitted int32[n_acc + 1], path int32[n_acc], n_acc)."""
    node_token = np.asarray(node_token)
    node_parent = np.asarray(node_parent)
    emitted: list[int] = []
    path: list[int] = []
    r = 0
    while True:
        kids = np.flatnonzero(node_parent == r - 1)
        kids = kids[kids >= r]
        n, m = int(p_lens[r]), int(q_lens[r])
        token, idx = accept_node_reference(p_ids[r, :n], p_probs[r, :n], node_token[kids],
                                           q_ids[r, :m], q_probs[r, :m], rng_state, scratch, variant)
        emitted.append(token)
        if idx < 0:
            return np.array(emitted, np.int32), np.array(path, np.int32), len(path)
        path.append(int(kids[idx]))
        r = int(kids[idx]) + 1


# --------------------------------------------------------------------------------------------
# Context tables, the exact law and the Monte Carlo driver.

Row = tuple[np.ndarray, np.ndarray]  # (int32 ids, float32 probs)


@dataclass
class ContextTables:
    """Target and drafter as tables over contexts; context 0 is the root (empty prefix)."""

    n_vocab: int
    p_ids: np.ndarray  # int32[Rp, Lp]
    p_probs: np.ndarray  # float32[Rp, Lp]
    p_lens: np.ndarray  # int64[Rp]
    q_ids: np.ndarray  # int32[Rq, Lq]
    q_probs: np.ndarray  # float32[Rq, Lq]
    q_lens: np.ndarray  # int64[Rq]
    ctx_p: np.ndarray  # int64[C]: p row of each context
    ctx_q: np.ndarray  # int64[C]: q row of each context
    child: np.ndarray  # int64[C, Lq]: context after drafting q support entry j, -1 if none
    prefix: list[tuple[int, ...]]

    def p(self, ctx: int) -> Row:
        r = self.ctx_p[ctx]
        return self.p_ids[r, : self.p_lens[r]], self.p_probs[r, : self.p_lens[r]]

    def q(self, ctx: int) -> Row:
        r = self.ctx_q[ctx]
        return self.q_ids[r, : self.q_lens[r]], self.q_probs[r, : self.q_lens[r]]


def _pad(rows: list[Row]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    width = max(1, max(len(a) for a, _ in rows))
    ids = np.zeros((len(rows), width), np.int32)
    probs = np.zeros((len(rows), width), np.float32)
    for i, (a, b) in enumerate(rows):
        ids[i, : len(a)], probs[i, : len(a)] = a, b
    return ids, probs, np.array([len(a) for a, _ in rows], np.int64)


def build_tables(n_vocab: int, depth: int, target: Callable[[tuple[int, ...]], Row],
                 drafter: Callable[[tuple[int, ...]], Row]) -> ContextTables:
    """Contexts reachable by drafting `depth` levels: every q support token of a context of
    depth < `depth` opens a child context. target/drafter map a prefix to a row; rows returned
    as the same object are stored once."""
    p_rows: dict[int, int] = {}
    q_rows: dict[int, int] = {}
    p_list: list[Row] = []
    q_list: list[Row] = [(np.zeros(0, np.int32), np.zeros(0, np.float32))]  # row 0: no q
    ctx_p: list[int] = []
    ctx_q: list[int] = []
    prefixes: list[tuple[int, ...]] = []
    children: list[list[int]] = []

    def row_of(obj, table, lst):
        if id(obj) not in table:
            table[id(obj)] = len(lst)
            lst.append(obj)
        return table[id(obj)]

    queue: list[tuple[int, ...]] = [()]
    while queue:
        prefix = queue.pop(0)
        prefixes.append(prefix)
        ctx_p.append(row_of(target(prefix), p_rows, p_list))
        if len(prefix) < depth:
            q = drafter(prefix)
            ctx_q.append(row_of(q, q_rows, q_list))
            children.append([len(prefixes) + len(queue) + j for j in range(len(q[0]))])
            queue.extend(prefix + (int(t),) for t in q[0])
        else:
            ctx_q.append(0)
            children.append([])
    pi, pp, pl = _pad(p_list)
    qi, qp, ql = _pad(q_list)
    child = np.full((len(prefixes), qi.shape[1]), -1, np.int64)
    for c, kids in enumerate(children):
        child[c, : len(kids)] = kids
    return ContextTables(n_vocab, pi, pp, pl, qi, qp, ql, np.array(ctx_p, np.int64),
                         np.array(ctx_q, np.int64), child, prefixes)


def _dense(row: Row, n_vocab: int) -> np.ndarray:
    out = np.zeros(n_vocab)
    out[row[0]] = row[1].astype(np.float64)
    return out / out.sum()


def node_outcomes(p: np.ndarray, q: np.ndarray, draws: Sequence[int], variant: str = "exact"):
    """Exact outcome law at one position for fixed siblings (dense float64 p, q):
    (probability each sibling is accepted [m], law of the recovered token [n_vocab])."""
    p0, p, q = p, p.copy(), q.copy()
    acc = np.zeros(len(draws))
    reach = 1.0
    for i, c in enumerate(draws):
        if np.count_nonzero(p > 0) == 1:  # one-hot: deterministic, as the kernel
            f = int(np.flatnonzero(p > 0)[0])
            later = [j for j in range(i, len(draws)) if draws[j] == f]
            if later:
                acc[later[0]] += reach
                return acc, np.zeros_like(p)
            out = np.zeros_like(p)
            out[f] = reach
            return acc, out
        a = min(1.0, p[c] / q[c])
        acc[i] = reach * a
        reach *= 1.0 - a
        if reach == 0.0:
            return acc, np.zeros_like(p)
        r = np.maximum(p - q, 0.0)
        if not r.sum() > 0.0:  # residual lost to rounding: the kernel draws from the position's p
            return acc, reach * p0
        p = r if variant == "unnormalized_residual" else r / r.sum()
        if variant != "keep_rejected_in_q":
            q[c] = 0.0
            q = q / q.sum() if q.sum() > 0 else q
    return acc, reach * p / p.sum()


def _ordered_draws(q: np.ndarray, m: int):
    """(draw sequence, probability) for every ordered draw of m tokens without replacement."""
    support = np.flatnonzero(q > 0).tolist()
    for seq in itertools.permutations(support, min(m, len(support))):
        prob, removed = 1.0, np.zeros_like(q, dtype=bool)
        for c in seq:
            prob *= q[c] / q[~removed].sum()
            removed[c] = True
        yield list(seq), prob


def exact_tree_law(tables: ContextTables, shape: Sequence[int], variant: str = "exact"):
    """{(ctx, token): probability} of (context of the last accepted node, final token)."""
    memo: dict[int, dict[tuple[int, int], float]] = {}

    def law(ctx: int, level: int) -> dict[tuple[int, int], float]:
        if ctx in memo:
            return memo[ctx]
        p = _dense(tables.p(ctx), tables.n_vocab)
        out: dict[tuple[int, int], float] = {}
        if level == len(shape):
            own = p
        else:
            # Compress to q's support + one lumped token for the rest of p (q = 0 there, so the
            # recursion only rescales it): exact, and small even for a full-vocabulary p.
            q_ids, q_probs = tables.q(ctx)
            q = _dense((q_ids, q_probs), tables.n_vocab)
            support = np.array(sorted(set(q_ids.tolist())), np.int64)
            rest = np.ones(tables.n_vocab, bool)
            rest[support] = False
            pc = np.append(p[support], p[rest].sum())
            qc = np.append(q[support], 0.0)
            slot = {int(t): j for j, t in enumerate(q_ids.tolist())}
            own_c = np.zeros(pc.shape[0])
            for draws, prob in _ordered_draws(qc, shape[level]):
                acc, rec = node_outcomes(pc, qc, draws, variant)
                own_c += prob * rec
                for c, a in zip(draws, acc, strict=True):
                    if a > 0.0:
                        sub = law(int(tables.child[ctx, slot[int(support[c])]]), level + 1)
                        for key, v in sub.items():
                            out[key] = out.get(key, 0.0) + prob * a * v
            own = np.zeros(tables.n_vocab)
            own[support] = own_c[:-1]
            if pc[-1] > 0.0:
                own[rest] = own_c[-1] * p[rest] / pc[-1]
        for t in np.flatnonzero(own > 0).tolist():
            out[(ctx, t)] = float(own[t])
        memo[ctx] = out
        return out

    return law(0, 0)


def expected_accepted(tables: ContextTables, law: dict[tuple[int, int], float]) -> float:
    """Mean accepted drafts per verification: the depth of the final context, averaged."""
    return float(sum(v * len(tables.prefix[ctx]) for (ctx, _), v in law.items()))


@numba.njit(cache=True)
def _sample_rounds(widths, ctx_p, ctx_q, child, p_ids, p_probs, p_lens, q_ids, q_probs, q_lens,
                   n_vocab, n_rounds, draft_rng, accept_rng, scratch, cells):
    n_max = 0
    level = 1
    for w in widths:
        level *= w
        n_max += level
    node_token = np.empty(n_max, np.int64)
    node_parent = np.empty(n_max, np.int64)
    row_ctx = np.empty(n_max + 1, np.int64)
    row_p = np.empty(n_max + 1, np.int64)
    row_q = np.empty(n_max + 1, np.int64)
    frontier = np.empty(n_max + 1, np.int64)
    nxt = np.empty(n_max + 1, np.int64)
    picks = np.empty(q_ids.shape[1], np.int64)
    out_tokens = np.empty(n_max + 1, np.int32)
    out_path = np.empty(n_max + 1, np.int32)
    for t in range(n_rounds):
        n = 0
        row_ctx[0] = 0
        frontier[0] = 0
        n_front = 1
        for w in widths:  # draft breadth first: each position's children drawn from its q
            n_next = 0
            for f in range(n_front):
                r = frontier[f]
                qr = ctx_q[row_ctx[r]]
                cnt = _gumbel_top_k(q_probs[qr, : q_lens[qr]], w, draft_rng, picks)
                for j in range(cnt):
                    node_token[n] = q_ids[qr, picks[j]]
                    node_parent[n] = r - 1
                    row_ctx[n + 1] = child[row_ctx[r], picks[j]]
                    nxt[n_next] = n + 1
                    n_next += 1
                    n += 1
            frontier[:n_next] = nxt[:n_next]
            n_front = n_next
        for r in range(n + 1):
            row_p[r] = ctx_p[row_ctx[r]]
            row_q[r] = ctx_q[row_ctx[r]]
        n_acc = _accept_tree(node_token[:n], node_parent[:n], p_ids, p_probs, p_lens, row_p, q_ids,
                             q_probs, q_lens, row_q, accept_rng, scratch, out_tokens, out_path)
        last = 0 if n_acc == 0 else row_ctx[out_path[n_acc - 1] + 1]
        cells[t] = last * n_vocab + out_tokens[n_acc]


def sample_tree_cells(tables: ContextTables, shape: Sequence[int], n_rounds: int, seed: int) -> np.ndarray:
    """int64[n_rounds] cell ids ctx * n_vocab + final token, from the kernel's tree walk."""
    cells = np.empty(n_rounds, np.int64)
    scratch = A.new_scratch(tables.n_vocab)
    _sample_rounds(np.array(shape, np.int64), tables.ctx_p, tables.ctx_q, tables.child,
                   tables.p_ids, tables.p_probs, tables.p_lens, tables.q_ids, tables.q_probs,
                   tables.q_lens, tables.n_vocab, n_rounds, A.new_rng_state(seed),
                   A.new_rng_state(seed + 10**9), scratch, cells)
    assert not scratch.any()
    return cells


def sample_reference_cells(tables: ContextTables, shape: Sequence[int], n_rounds: int, seed: int,
                           variant: str) -> np.ndarray:
    """Like sample_tree_cells, through accept_node_reference with `variant` (plain Python)."""
    draft_rng, accept_rng = A.new_rng_state(seed), A.new_rng_state(seed + 10**9)
    scratch = A.new_scratch(tables.n_vocab)
    cells = np.empty(n_rounds, np.int64)
    for t in range(n_rounds):
        ctx, level = 0, 0
        while True:
            p_ids, p_probs = tables.p(ctx)
            q_ids, q_probs = tables.q(ctx)
            kids = (draw_children(q_ids, q_probs, shape[level], draft_rng) if level < len(shape)
                    else np.zeros(0, np.int32))
            token, idx = accept_node_reference(p_ids, p_probs, kids, q_ids, q_probs, accept_rng,
                                               scratch, variant)
            if idx < 0:
                cells[t] = ctx * tables.n_vocab + token
                break
            ctx = int(tables.child[ctx, int(np.flatnonzero(q_ids == kids[idx])[0])])
            level += 1
    return cells
