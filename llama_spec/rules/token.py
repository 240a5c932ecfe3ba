"""The token rule (Leviathan et al. 2023): keep d_i with min(1, p/q), recover from norm((p - q)+).

Positions are decided one at a time: p at position i is computed after the target sampler
accepted the token emitted at i - 1, so a stateful chain (penalties, grammar, budget) is exact
without clones.
"""

from __future__ import annotations

from ..kernels import token as _accept
from .base import Rule, Verification, p_falls_back


class TokenRule(Rule):
    name = "token"
    # The per-position kernel; an attribute so a test can verify a deliberately broken variant
    # (llama_spec.testing.distribution) and the profiler can time it.
    step_kernel = staticmethod(_accept.accept_step_kernel)

    def random(self, v: Verification) -> int:
        sampler, prop, rows, rng, scratch = v.sampler, v.proposal, v.logits, v.rng, v.scratch
        drafts, q_ids, q_probs = prop.tokens, prop.q_ids, prop.q_probs
        assert q_ids is not None and q_probs is not None  # choose() guarantees q for this rule
        step = self.step_kernel
        k = len(drafts)
        for i in range(k):
            d = drafts[i]
            ids, probs, sampled = sampler.candidates_and_sample(rows[i])
            if v.pq is not None:
                v.log_p(i, ids, probs)
            if p_falls_back(probs):
                v.n_fallback += 1
                tok, ok = sampled, sampled == d
            else:
                t, a = step(ids, probs, d, q_ids[i], q_probs[i], rng, scratch)
                tok, ok = int(t), bool(a)
                if ok and sampled != d:
                    v.n_extra += 1
            if not v.emit(tok, ok):
                return i + 1 if ok else i
            if not ok:
                return i
        # bonus: every draft kept; the target's own draw from p at row k
        if v.pq is not None:
            ids, probs, tok = sampler.candidates_and_sample(rows[k])
            v.log_p(k, ids, probs)
        else:
            tok = sampler.sample(rows[k])
        v.emit(tok, False)
        return k
