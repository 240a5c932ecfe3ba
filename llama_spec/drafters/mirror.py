"""The drafter's sampler, mirroring the target's temperature and truncation.

q must be close to p for the rejection rule to accept often, so the drafter samples with the
target's top-n-sigma, top-k (clamped to [2, 64] so a huge or disabled top-k does not make every
draft step scan the vocabulary), typical-p, top-p, min-p, min-keep and temperature. Penalties,
DRY, XTC, logit bias and the reasoning budget are not mirrored: they depend on state the drafter
does not have, and a slightly wrong q only costs acceptance, never correctness.
A greedy target gets a greedy drafter with a one-hot q.

A grammar is mirrored when the drafter is given a clone of the target's grammar state
(``Drafter.grammar_clone``): each draft row is masked by it before the mirrored chain, and the
clone is advanced by each drafted token, so every draft is grammar-valid and q is the law it was
drawn from (``Proposal.q_grammar_masked``). The mask is applied to the row's GRAMMAR_TOP largest
logits, and to the full row only when none of those is allowed: any q keeps the rules exact, and
the tail beyond the top 256 carries next to no mass after the mirrored top-k.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from .._ffi import ffi, lib
from ..llama.sampling import CandidateBuffers, SamplerChain, SamplerParams
from .base import TOPK_WIDTH, Proposal

if TYPE_CHECKING:
    from ..llama.grammar import GrammarState
    from ..llama.model import Model

TOP_K_MIN, TOP_K_MAX = 2, 64
GRAMMAR_TOP = 256  # a grammar-masked draft row: the mask runs on this many largest logits first


def mirror_params(target: SamplerParams) -> SamplerParams:
    top_k = target.top_k if target.top_k > 0 else TOP_K_MAX
    return SamplerParams(
        temp=target.temp,
        top_k=min(max(top_k, TOP_K_MIN), TOP_K_MAX),
        top_p=target.top_p,
        min_p=target.min_p,
        typical_p=target.typical_p,
        top_n_sigma=target.top_n_sigma,
        min_keep=target.min_keep,
        dynatemp_range=target.dynatemp_range,
        dynatemp_exponent=target.dynatemp_exponent,
        penalty_last_n=0,
    )


# (token, q_ids int32 (n,), q_probs float32 (n,), top_ids int32 (k,) | None, top_probs float32 (k,) | None)
Draw = tuple[int, np.ndarray, np.ndarray, "np.ndarray | None", "np.ndarray | None"]


def _knobs(p: SamplerParams) -> tuple[float | int, ...]:
    return (p.temp, p.top_k, p.top_p, p.min_p, p.typical_p, p.top_n_sigma, p.min_keep,
            p.dynatemp_range, p.dynatemp_exponent)


class MirrorSampler:
    """Sample a draft token and report q over its support. Rebuilt only when knobs change."""

    def __init__(self, n_vocab: int, model: Model, seed: int = 0) -> None:
        self.n_vocab = n_vocab
        self.model = model
        self._rng = np.random.default_rng(seed)
        self._knobs: tuple[float | int, ...] | None = None
        self._chain = ffi.NULL
        self._chain_h: SamplerChain | None = None
        self._cb = CandidateBuffers(n_vocab)
        self.params: SamplerParams | None = None
        self.n_rebuilds = 0

    def configure(self, target: SamplerParams) -> None:
        k = _knobs(target)
        if k == self._knobs:
            return
        self.params = mirror_params(target)
        old = self._chain_h
        self._chain_h = SamplerChain(self.params, self.model, with_dist=False)  # its lifetime: NativeHandle
        self._chain = self._chain_h.ptr
        if old is not None:
            old.close()
        self._knobs = k
        self.n_rebuilds += 1

    def reseed(self, seed: int) -> None:
        self._rng = np.random.default_rng(seed)

    def sample(self, logits_row: np.ndarray, *, topk: int = 0, grammar: GrammarState | None = None) -> Draw | None:
        """Return (token, q_ids, q_probs, top_ids, top_probs); arrays are fresh copies.

        With `grammar`, the row is masked by it first (the state is not advanced) and None is
        returned when it allows no token of the row."""
        row = np.ascontiguousarray(logits_row, dtype=np.float32)
        params = self.params
        if params is None:
            raise RuntimeError("MirrorSampler.configure() must run before sample()")
        if grammar is not None:
            return self._sample_masked(row, params, grammar, topk)
        if params.greedy:
            j = int(np.argmax(row))
            ids = np.array([j], dtype=np.int32)
            probs = np.ones(1, dtype=np.float32)
            top_ids = top_p = None
            if topk:
                # rank the head's own (temperature 1) distribution for the statistics
                order = np.argpartition(-row, topk)[:topk]
                order = order[np.argsort(-row[order], kind="stable")]
                z = np.exp(row - row.max())
                top_ids, top_p = order.astype(np.int32), (z[order] / z.sum()).astype(np.float32)
            return j, ids, probs, top_ids, top_p
        # top-k is the chain's first cut unless top-n-sigma runs (it needs the whole row):
        # start from the k largest logits instead of the full vocabulary (see _shim.h).
        k = params.top_k if params.top_n_sigma <= 0 else 0
        lib.llama_sampler_apply(self._chain, self._cb.fill(row, k))
        ids, probs = self._cb.probs_view()
        return self._draw(ids.copy(), probs.copy(), topk)

    def _draw(self, ids: np.ndarray, probs: np.ndarray, topk: int) -> Draw:
        """Draw from q = probs (float32 (n,)) over ids (int32 (n,)), zero entries dropped."""
        keep = probs > 0
        if not keep.all():
            ids, probs = ids[keep], probs[keep]
        cdf = np.cumsum(probs, dtype=np.float64)
        j = int(np.searchsorted(cdf, self._rng.random() * cdf[-1], side="right"))
        j = min(j, len(ids) - 1)
        top_ids = top_p = None
        if topk:
            order = np.argsort(-probs, kind="stable")[:topk]
            top_ids, top_p = ids[order], probs[order]
        return int(ids[j]), ids, probs, top_ids, top_p

    def _masked_candidates(self, row: np.ndarray, grammar: GrammarState) -> Any:
        """Candidates of `row` that the grammar allows (compacted, order kept): among the row's
        GRAMMAR_TOP largest logits, or the full row when none of those is allowed; may be empty."""
        cur = None
        for k in (GRAMMAR_TOP, 0):
            cur = self._cb.fill(row, k)
            grammar.apply(cur)
            cand = self._cb.cand[: cur.size]
            keep = cand["logit"] != -np.inf
            n = int(np.count_nonzero(keep))
            if n < cur.size:
                cand[:n] = cand[keep]
                cur.size = n
            if n:
                break
        return cur

    def _sample_masked(self, row: np.ndarray, params: SamplerParams, grammar: GrammarState, topk: int) -> Draw | None:
        cur = self._masked_candidates(row, grammar)
        if cur.size == 0:
            return None
        if params.greedy:
            cand = self._cb.cand[: cur.size]
            tok = int(cand["id"][int(np.argmax(cand["logit"]))])  # ties: the lower id, as greedy
            top_ids = top_p = None
            if topk:  # the allowed tokens ranked by the head's own (temperature 1) distribution
                ids, probs = self._cb.probs_view()
                order = np.argsort(-probs, kind="stable")[:topk]
                top_ids, top_p = ids[order].copy(), probs[order].copy()
            return tok, np.array([tok], dtype=np.int32), np.ones(1, dtype=np.float32), top_ids, top_p
        lib.llama_sampler_apply(self._chain, cur)
        ids, probs = self._cb.probs_view()
        return self._draw(ids.copy(), probs.copy(), topk)


class ProposalBuilder:
    """Builds one proposal from the drafter's logits rows, one row per draft position.

    Shared by the model drafters (draft-simple, draft-mtp): with ``sample`` the token is drawn
    from the mirror and q recorded; without it the token is the argmax and the proposal has no
    q (the exact-match rule). The old rule with no p_min and no statistics skips the mirror.
    """

    def __init__(self, mirror: MirrorSampler, *, sample: bool, collect_topk: bool, p_min: float,
                 grammar: GrammarState | None = None) -> None:
        # grammar: a clone of the target's grammar state (owned by the builder, advanced per token)
        self.mirror = mirror
        self.sample = sample
        self.collect_topk = collect_topk
        self.p_min = p_min
        self.grammar = grammar
        self.argmax_only = not sample and p_min <= 0 and not collect_topk and grammar is None
        self.prop = Proposal(q_grammar_masked=grammar is not None)
        if collect_topk:
            self.prop.topk_ids, self.prop.topk_probs = [], []

    def add(self, row: np.ndarray) -> int | None:
        """Propose a token from `row`; None when its top probability is below p_min or the grammar
        allows no token (stop). With a grammar, q is masked by it and it accepts the token."""
        prop = self.prop
        if self.argmax_only:
            tok = int(np.argmax(row))
            prop.tokens.append(tok)
            return tok
        g = self.grammar
        got = self.mirror.sample(row, topk=TOPK_WIDTH if self.collect_topk else 0, grammar=g)
        if got is None:
            return None
        tok, q_ids, q_probs, top_ids, top_p = got
        if not self.sample:  # the old rule: argmax draft (of the allowed tokens), no q
            tok = int(np.argmax(row)) if g is None else int(q_ids[int(np.argmax(q_probs))])
        if q_probs.max() < self.p_min:
            return None
        if g is not None:
            g.accept(tok)
        prop.tokens.append(tok)
        assert prop.q_ids is not None and prop.q_probs is not None  # lists until finish()
        prop.q_ids.append(q_ids)
        prop.q_probs.append(q_probs)
        if self.collect_topk:
            assert prop.topk_ids is not None and prop.topk_probs is not None
            assert top_ids is not None and top_p is not None  # asked for with topk > 0
            prop.topk_ids.append(top_ids)
            prop.topk_probs.append(top_p)
        return tok

    def finish(self) -> Proposal:
        if not self.sample:
            self.prop.q_ids = self.prop.q_probs = None
        return self.prop
