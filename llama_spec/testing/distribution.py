"""End-to-end distribution check: the rejection rule's emitted tokens vs plain sampling.

Used by tests/test_distribution.py (small N, still able to fail) and scripts/dist_check.py
(full N). For each seed, a request emits a few tokens; the first two (t0, the target's own
sample after the prompt, and t1, the first token the verifier decides) form one joint sample.
The two arms' joint histograms are compared with a chi-square test of homogeneity over the pooled
top cells (cells with a pooled count < 10 are merged into one "other" cell so every expected
count is comfortably above 5).

`FirstTwoLaws` rebuilds the exact law of (t0, t1) from the p and q logged by a ``PQLog``
observer, under the correct rule and under the broken one, so a test can state the power
its N gives against the broken rule instead of hoping for it.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable

import numpy as np
from scipy import stats

from llama_spec.observe.observers import PQLog
from llama_spec.rules import BlockRule, TokenRule, Verification


class FirstTwoLaws:
    """Exact laws of (t0, t1) under plain sampling and under `broken_accept_step`.

    p0 is logged at the first token; p1 and q1 are logged at t1's verification, once per t0 seen
    (the models are deterministic, so they depend on t0 only). Mass of t0 values never seen is
    left out of both laws alike (it lands in the "other" cell with zero difference), so the
    power computed from them is a lower bound.
    """

    def __init__(self) -> None:
        self.p0: dict[int, float] = {}
        self.cond: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}

    def observe(self, log: PQLog, tokens: list[int]) -> None:
        """Collect p0 and (p1, q1) from the p/q log of one request that emitted `tokens`."""
        entries = log.entries
        first = [e for e in entries if e[0] == 0]
        if first and not self.p0:
            _, ids, probs, _, _ = first[0]
            self.p0 = dict(zip(ids.tolist(), probs.tolist(), strict=True))
        t0 = int(tokens[0])
        for idx, ids, probs, q_ids, q_probs in entries:
            if idx == 1 and q_ids is not None and t0 not in self.cond:
                self.add(t0, ids, probs, q_ids, q_probs)

    def add(self, t0: int, ids, probs, q_ids, q_probs) -> None:
        """Record p1 and q1 (the laws of t1's target and draft) after first token t0."""
        q = dict(zip(q_ids.tolist(), q_probs.tolist(), strict=True))
        m = np.array([min(pp, q.get(i, 0.0)) for i, pp in zip(ids.tolist(), probs.tolist(), strict=True)])
        self.cond[int(t0)] = (np.array(ids), np.asarray(probs, dtype=np.float64), m)

    def plain_and_broken(self) -> tuple[dict, dict]:
        plain: dict = {}
        broken: dict = {}
        for t0, (ids, p1, m) in self.cond.items():
            w = self.p0.get(t0, 0.0)
            b1 = m + (1.0 - m.sum()) * p1  # accept min(1, p/q), recover from p: the broken law
            for i, pp, bb in zip(ids.tolist(), p1.tolist(), b1.tolist(), strict=True):
                plain[(t0, i)] = w * pp
                broken[(t0, i)] = w * bb
        return plain, broken

    def acceptance(self) -> float:
        """P(t1's draft is accepted) = E_t0 sum min(p1, q1), over the t0 seen."""
        seen = sum(self.p0.get(t, 0.0) for t in self.cond)
        return sum(self.p0.get(t, 0.0) * float(m.sum()) for t, (_, _, m) in self.cond.items()) / max(seen, 1e-12)


def broken_rule_power(laws: FirstTwoLaws, n: int, alpha: float, min_pooled: int = 10) -> tuple[float, float, int]:
    """(power, noncentrality, cells) of the two-sample chi-square test at level `alpha` with n
    samples per arm, plain vs broken rule, cells merged as `homogeneity_pvalue` merges them.

    Uses the standard noncentral chi-square approximation: lambda = n/2 * sum (b - p)^2 / pooled.
    """
    plain, broken = laws.plain_and_broken()
    cells = [c for c in plain if (plain[c] + broken[c]) * n >= min_pooled]
    p = np.array([plain[c] for c in cells] + [max(1.0 - sum(plain[c] for c in cells), 0.0)])
    b = np.array([broken[c] for c in cells] + [max(1.0 - sum(broken[c] for c in cells), 0.0)])
    pooled = np.maximum((p + b) / 2, 1e-300)
    lam = n / 2 * float(np.sum((b - p) ** 2 / pooled))
    df = len(p) - 1
    if df < 1:
        return 0.0, lam, len(p)
    crit = stats.chi2.isf(alpha, df)
    return float(stats.ncx2.sf(crit, df, lam)), lam, len(p)


def joint_samples(gen, prompt, seeds: Iterable[int], *, sampling, spec_draft_sample: bool | None = True,
                  n_predict: int = 3, progress: Callable[[int], None] | None = None,
                  laws: FirstTwoLaws | None = None, verify="token") -> Counter:
    """Histogram of (t0, t1) over `seeds`. n_predict >= 3 lets the drafter propose for t1
    (a request keeps room for the bonus token). With `laws`, p and q are logged and collected.
    `verify`: a rule name or a Rule object (e.g. the broken rules below)."""
    out: Counter = Counter()
    log = PQLog()
    obs = [log] if laws is not None else []
    for i, seed in enumerate(seeds):
        r = gen.generate(prompt, sampling=sampling, seed=seed, n_predict=n_predict,
                         spec_draft_sample=spec_draft_sample, verify=verify, ignore_eos=True, observers=obs)
        out[(r.tokens[0], r.tokens[1])] += 1
        if laws is not None:
            laws.observe(log, r.tokens)
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
    from llama_spec.testing.reference import _py_next_uniform

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


class BrokenTokenRule(TokenRule):
    """The token rule with `broken_accept_step`: recovers from p instead of the residual."""

    name = "token"
    step_kernel = staticmethod(broken_accept_step)


class BrokenBlockRule(BlockRule):
    """The block rule, broken the same way: at a rejection the emitted token is redrawn from p at
    that position instead of the kernel's residual. Emits min(p, q) + (1 - sum min(p, q)) p at
    k = 1, exactly the broken token rule's law, so FirstTwoLaws states its power as well."""

    name = "block"

    def __init__(self) -> None:
        super().__init__()
        self.block_kernel = self._broken_kernel

    def _broken_kernel(self, p_ids, p_probs, p_lens, drafts, q_ids, q_probs, q_lens, rng, scratch, out):
        from llama_spec.testing.reference import _py_next_uniform

        n_acc = int(BlockRule.block_kernel(p_ids, p_probs, p_lens, drafts, q_ids, q_probs, q_lens, rng, scratch, out))
        if n_acc < len(drafts):
            n = int(p_lens[n_acc])
            cdf = np.cumsum(p_probs[n_acc, :n], dtype=np.float64)
            j = int(np.searchsorted(cdf, _py_next_uniform(rng) * cdf[-1], side="right"))
            out[n_acc] = p_ids[n_acc, min(j, n - 1)]
        return n_acc


__all__ = ["BrokenBlockRule", "BrokenTokenRule", "FirstTwoLaws", "Verification", "broken_accept_step",
           "broken_rule_power", "homogeneity_pvalue", "joint_samples"]
