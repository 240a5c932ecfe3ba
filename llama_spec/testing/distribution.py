"""End-to-end distribution check: the rejection rule's emitted tokens vs plain sampling.

Used by tests/test_distribution.py (small N, still able to fail) and scripts/dist_check.py
(full N). For each seed, a request emits a few tokens; tokens 2 and 3 (the first ones the
verifier decides) form one joint sample. The two arms' joint histograms are compared with a
chi-square test of homogeneity over the pooled top cells (cells with a pooled count < 10 are
merged into one "other" cell so every expected count is comfortably above 5).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable

import numpy as np
from scipy import stats


def joint_samples(gen, prompt, seeds: Iterable[int], *, sampling, spec_draft_sample: bool | None = True,
                  n_predict: int = 5, progress: Callable[[int], None] | None = None) -> Counter:
    out: Counter = Counter()
    for i, seed in enumerate(seeds):
        r = gen.generate(prompt, sampling=sampling, seed=seed, n_predict=n_predict,
                         spec_draft_sample=spec_draft_sample, ignore_eos=True)
        out[(r.tokens[1], r.tokens[2])] += 1
        if progress is not None:
            progress(i)
    return out


def homogeneity_pvalue(a: Counter, b: Counter, min_pooled: int = 10) -> tuple[float, int]:
    """Chi-square two-sample test on the cells of the pooled histogram; returns (p, n_cells)."""
    pooled = a + b
    cells = [c for c, n in pooled.most_common() if n >= min_pooled]
    if not cells:
        return 1.0, 0
    table = [[a.get(c, 0) for c in cells], [b.get(c, 0) for c in cells]]
    rest_a = sum(a.values()) - sum(table[0])
    rest_b = sum(b.values()) - sum(table[1])
    if rest_a + rest_b > 0:
        table[0].append(rest_a)
        table[1].append(rest_b)
    if len(table[0]) < 2:
        return 1.0, len(table[0])
    res = stats.chi2_contingency(np.array(table))
    return float(res.pvalue), len(table[0])


def broken_accept_step(p_ids, p_probs, draft_token, q_ids, q_probs, rng_state, scratch):
    """A deliberately wrong rule: accept with min(1, p/q) but recover from p, not the residual.

    Emits min(p, q) + (1 - sum min(p, q)) * p instead of p: the test must catch it.
    """
    from llama_spec.accept import _py_next_uniform

    pos = p_probs > 0
    if pos.sum() == 1:
        f = int(p_ids[np.argmax(p_probs)])
        return f, f == draft_token
    px = float(p_probs[p_ids == draft_token].sum())
    qx = float(q_probs[q_ids == draft_token].sum())
    if px > 0 and (px >= qx or _py_next_uniform(rng_state) * qx < px):
        return int(draft_token), True
    cdf = np.cumsum(p_probs, dtype=np.float64)
    j = int(np.searchsorted(cdf, _py_next_uniform(rng_state) * cdf[-1], side="right"))
    return int(p_ids[min(j, len(p_ids) - 1)]), False
