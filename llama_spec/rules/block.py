"""The block rule (Sun, Mendlovic, Leviathan, Aharoni, Ro, Beirami, Suresh: "Block Verification
Accelerates Speculative Decoding", ICLR 2025): the k drafts are verified jointly.

The kernel (llama_spec.kernels.block) needs p at every draft position before it decides, so p_i
is computed first for i = 0..k, each with a sampler that accepted d_1 .. d_i-1: the real target
sampler when its chain is stateless (accept() changes nothing: no penalties, DRY, grammar or
reasoning budget), else one clone per verification that accepts the drafts in turn. The real
sampler's accept() then runs once per *emitted* token (through Verification.emit), in order.
"""

from __future__ import annotations

import numpy as np

from ..kernels.block import accept_block_kernel
from .base import Rule, Verification, p_falls_back


class _Padded:
    """Reusable padded rows (rows, width) of ids/probs plus lengths; width grows as needed."""

    def __init__(self, rows: int) -> None:
        self.ids = np.zeros((rows, 64), dtype=np.int32)
        self.probs = np.zeros((rows, 64), dtype=np.float32)
        self.lens = np.zeros(rows, dtype=np.int32)

    def ensure(self, rows: int, width: int) -> None:
        r, w = self.ids.shape
        if rows > r or width > w:
            r, w = max(rows, r), max(width, w)
            ids, probs = np.zeros((r, w), dtype=np.int32), np.zeros((r, w), dtype=np.float32)
            ids[: self.ids.shape[0], : self.ids.shape[1]] = self.ids
            probs[: self.probs.shape[0], : self.probs.shape[1]] = self.probs
            self.ids, self.probs = ids, probs
            self.lens = np.resize(self.lens, r)

    def put(self, i: int, ids: np.ndarray, probs: np.ndarray) -> None:
        n = len(ids)
        if n > self.ids.shape[1]:
            self.ensure(self.ids.shape[0], max(n, 2 * self.ids.shape[1]))
        self.ids[i, :n] = ids
        self.probs[i, :n] = probs
        self.lens[i] = n


class BlockRule(Rule):
    name = "block"
    # The kernel; an attribute so a test can verify a deliberately broken variant and the
    # profiler can time it. Signature: accept_block_kernel(p_ids, p_probs, p_lens, draft_tokens,
    # q_ids, q_probs, q_lens, rng_state, scratch, out) -> n_accepted (out: int32 (>= k+1,)).
    block_kernel = staticmethod(accept_block_kernel)

    def __init__(self) -> None:
        self._p = _Padded(4)
        self._q = _Padded(3)
        self._drafts = np.zeros(3, dtype=np.int32)
        self._sampled = np.zeros(4, dtype=np.int64)
        self._out = np.zeros(4, dtype=np.int32)

    def _fill_p(self, v: Verification, k: int) -> int:
        """p rows 0..k into the padded buffer (row i after d_1..d_i-1); returns #unnormalized rows."""
        sampler, rows, drafts = v.sampler, v.logits, v.proposal.tokens
        clone = sampler.clone() if (sampler.stateful and k > 0) else None
        bad = 0
        for i in range(k + 1):
            s = sampler
            if clone is not None and i > 0:
                clone.accept(drafts[i - 1])
                s = clone
            ids, probs, sampled = s.candidates_and_sample(rows[i])
            if v.pq is not None:
                v.log_p(i, ids, probs)
            bad += p_falls_back(probs)
            self._p.put(i, ids, probs)
            self._sampled[i] = sampled
        return bad

    def _fill_q(self, v: Verification, k: int) -> None:
        prop = v.proposal
        assert prop.q_ids is not None and prop.q_probs is not None  # choose() guarantees q
        for i in range(k):
            self._q.put(i, prop.q_ids[i], prop.q_probs[i])
            self._drafts[i] = prop.tokens[i]

    def _ensure(self, k: int) -> None:
        if len(self._drafts) < k:
            self._drafts = np.zeros(k, dtype=np.int32)
            self._sampled = np.zeros(k + 1, dtype=np.int64)
            self._out = np.zeros(k + 1, dtype=np.int32)
        self._p.ensure(k + 1, 1)
        self._q.ensure(k, 1)

    def random(self, v: Verification) -> int:
        k = len(v.proposal)
        self._ensure(k)
        bad = self._fill_p(v, k)
        drafts = v.proposal.tokens
        if bad:  # some p unnormalized: the target's own samples decide (exact-match on them)
            v.n_fallback += bad
            for i in range(k + 1):
                tok = int(self._sampled[i])
                ok = i < k and tok == drafts[i]
                if not v.emit(tok, ok) or not ok:
                    return i + 1 if ok else i
            return k
        self._fill_q(v, k)
        p, q = self._p, self._q
        out = self._out
        n_acc = int(self.block_kernel(p.ids[: k + 1], p.probs[: k + 1], p.lens[: k + 1], self._drafts[:k],
                                      q.ids[:k], q.probs[:k], q.lens[:k], v.rng, v.scratch, out))
        sampled = self._sampled
        for i in range(n_acc + 1):
            ok = i < n_acc
            if ok and sampled[i] != drafts[i]:
                v.n_extra += 1
            if not v.emit(int(out[i]), ok):
                return i + 1 if ok else i
        return n_acc
