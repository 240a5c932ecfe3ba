"""The tree rule: recursive rejection sampling without replacement over a tree proposal.

The loop decodes [root, node 0 .. node n - 1] in one target batch (row r = 0 the root, r = i + 1
node i, docs/design.md words) and calls ``TreeRule.verify``. The rule walks the tree one position at
a time, as the token rule walks a chain: p at row r is computed only when the walk reaches r,
after the target sampler accepted the token emitted before it (invariant 5, stateful chains
exact without clones). At each position with children it calls accept_tree.accept_node_kernel
(siblings tried in draw order; p <- norm((p - q)+), q <- q without the rejected sibling); the
accepted child is emitted and the walk descends; a recovered token ends it; at a leaf the bonus
is the target's own sample from p (as the token rule's bonus). With one child everywhere every
call is the token rule's accept step: same decisions, same accept RNG stream (invariant 10).

Deterministic trees (greedy target, the exact-match switch, a grammar the drafter's q ignores,
q not normalized) are walked with the exact-match rule: the target samples each position with
its own dist, and the walk descends into the child equal to that sample, if any.
"""

from __future__ import annotations

import numpy as np

from ..drafters.tree import TreeProposal
from ..kernels import token as _accept
from ..kernels.tree import accept_node_kernel
from .base import Rule, TreeOutcome, Verification, p_falls_back


class TreeRule(Rule):
    name = "tree"
    # The per-position kernel; an attribute so a test can verify a deliberately broken variant.
    node_kernel = staticmethod(accept_node_kernel)

    def verify(self, v: Verification) -> int:
        """requires: v.tree is the proposal (Verification.begin(..., tree=...)); fills v.tree_outcome."""
        prop = v.tree
        if prop is None:
            raise ValueError("the tree rule verifies tree proposals only (Verification.begin(..., tree=...))")
        exact = v.sampler.greedy or not _usable_q(prop, v.sampler.has_grammar)
        v.rule = "exact-match" if exact else self.name
        v.tree_outcome = out = TreeOutcome()
        n = self._walk(v, prop, out, exact)
        v.n_accepted = n
        return n

    def _walk(self, v: Verification, prop: TreeProposal, out: TreeOutcome, exact: bool) -> int:
        """Emit the accepted path and its recovered/bonus token; fill out.path and n_chain."""
        sampler, rows, rng, scratch = v.sampler, v.logits, v.rng, v.scratch
        chain, r, depth = True, 0, 0
        while True:
            kids = prop.children[r]
            if v.pq is None and (exact or not kids):
                ids = probs = None
                sampled = sampler.sample(rows[r])  # the same dist draw as candidates_and_sample
            else:
                ids, probs, sampled = sampler.candidates_and_sample(rows[r])
                if v.pq is not None:
                    has_q = bool(kids) and not exact
                    v.pq.append((v.emitted_index + depth, ids.copy(), probs.copy(),
                                 prop.row_q_ids[r] if has_q else None, prop.row_q_probs[r] if has_q else None))
            if not kids:  # a leaf (or an empty tree): the bonus, the target's own sample
                out.ended_at_leaf = True
                v.emit(sampled, False)
                return depth
            toks = [prop.tokens[i] for i in kids]
            if exact or (probs is not None and p_falls_back(probs)):
                v.n_fallback += 0 if exact else 1
                tok = sampled
                idx = toks.index(tok) if tok in toks else -1
            else:
                t, j = self.node_kernel(ids, probs, np.asarray(toks, dtype=np.int32), prop.row_q_ids[r],
                                        prop.row_q_probs[r], rng, scratch)
                tok, idx = int(t), int(j)
                if idx >= 0 and sampled != tok:
                    v.n_extra += 1
            ok = idx >= 0
            if ok:
                chain = chain and idx == 0
                out.path.append(kids[idx])
                out.n_chain += int(chain)
            if not v.emit(tok, ok) or not ok:
                return depth + 1 if ok else depth
            depth += 1
            r = kids[idx] + 1

def _usable_q(prop: TreeProposal, has_grammar: bool) -> bool:
    """q present and normalized at every row with children (and grammar-masked under a grammar)."""
    if not prop.sampled or not prop.has_q or (has_grammar and not prop.q_grammar_masked):
        return False
    return all(qp is None or _accept.p_is_normalized(qp)
               for qp, kids in zip(prop.row_q_probs, prop.children, strict=True) if kids)
