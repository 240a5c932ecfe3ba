"""Verification rules as objects: the words, the interface, and the one place fallbacks are decided.

Words (docs/design.md, defined once here for every rule):

* **p**: the target's distribution at a position after its sampler chain (what ``dist`` draws
  from), from ``TargetSampler.candidates*``; **q**: the drafter's distribution at that position
  over its **support**; a **proposal** is the draft tokens d_1..d_k with one q per token.
* A verification decodes [last emitted token, d_1 .. d_k] in one target batch: k + 1 logits rows.
  Row i gives p at draft position i (row k: the position after the last draft).
* **accepted**: a draft token that is kept; **recovered**: the token emitted at the first
  rejection (drawn from a residual); **bonus**: the token drawn from p at row k when every draft
  was kept. A verification emits n_accepted + 1 tokens (fewer if the request stops early).
* **rules**: **exact-match** (the target samples; a draft is kept only if equal — llama.cpp's
  rule), **token** (keep d_i with min(1, p/q), recover from norm((p - q)+)), **block** (the drafts
  verified jointly, Sun et al., ICLR 2025). Every rule emits tokens distributed exactly as p.

Interface: ``Rule.verify(v)`` decides the tokens of one verification and hands each one, in
order, to ``v.emit(token, accepted_draft)``; emit calls the target sampler's ``accept`` (so it
runs exactly once per emitted position, invariant 5) and returns False once the request stopped,
after which the rule emits nothing more. ``verify`` returns n_accepted. Greedy (p one-hot) and
random paths are separate methods: on the greedy path every rule *is* exact-match and uses no
accept randomness (invariant 2).

Fallbacks to exact-match (invariant 3) are decided here and nowhere else: ``choose`` per
verification (no proposal, q missing or of the wrong length, q not normalized, the switch off,
a grammar when q is not grammar-masked) and ``p_falls_back`` per position (p not normalized;
the rules that see p call it and then use the target's own sample there).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

import numpy as np

from ..drafters.base import Proposal
from ..kernels.token import p_is_normalized

if TYPE_CHECKING:
    from ..drafters.tree import TreeProposal
    from ..llama.sampling import TargetSampler

VerifyName = Literal["token", "block", "exact-match"]
RULE_NAMES: tuple[str, ...] = ("token", "block", "exact-match")

# (emitted index, p ids int32 (n,), p probs float32 (n,), q ids | None, q probs | None)
PQEntry = tuple[int, np.ndarray, np.ndarray, "np.ndarray | None", "np.ndarray | None"]


@dataclass
class TreeOutcome:
    """What the tree rule decided for one tree proposal (filled by TreeRule.verify)."""

    path: list[int] = field(default_factory=list)  # accepted nodes, root to leaf
    n_chain: int = 0             # leading accepted first children: what the chain would have kept
    ended_at_leaf: bool = False  # every position on the path was accepted up to a leaf (bonus)


@dataclass(eq=False)
class Verification:
    """One request's verification state, reused for every verification (no per-step allocation).

    The loop sets the per-verification fields before ``Rule.verify``; the rule fills n_accepted,
    n_extra, n_fallback and (when ``record_pq``) pq; ``emit`` appends to ``emitted``. Observers
    read it after the rule ran; views (logits) are valid only during that call.
    """

    sampler: TargetSampler
    rng: np.ndarray                 # uint64 (4,): the accept RNG (separate from dist's)
    scratch: np.ndarray             # float32 (>= n_vocab,), all zero between calls
    emit: Callable[[int, bool], bool] = field(repr=False, default=lambda t, a: True)
    record_pq: bool = False         # an observer asked for p and q of every decided position
    # -- per verification -------------------------------------------------------------------
    pos0: int = 0                   # position of batch[0] (the last token emitted before)
    batch: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int32))  # int32 (k+1,)
    logits: np.ndarray = field(default_factory=lambda: np.zeros((0, 0), dtype=np.float32))  # (k+1, n_vocab)
    proposal: Proposal | TreeProposal = field(default_factory=Proposal)
    tree: TreeProposal | None = None   # the proposal, when it is a tree (the tree rule reads it)
    tree_outcome: TreeOutcome = field(default_factory=TreeOutcome)
    rule: str = "exact-match"       # the rule that decided (after fallbacks)
    first: bool = False             # the first token after the prompt (nothing to verify)
    emitted_index: int = 0          # index in the generation of emitted[0]
    emitted: list[int] = field(default_factory=list)
    n_accepted: int = 0
    n_extra: int = 0                # kept although the target's own sample there was another token
    n_fallback: int = 0             # positions where p was not normalized (exact-match used there)
    pq: list[PQEntry] | None = None

    def begin(self, pos0: int, batch: np.ndarray, logits: np.ndarray, proposal: Proposal | TreeProposal, rule: str,
              emitted_index: int, first: bool = False, *, tree: TreeProposal | None = None) -> None:
        """Reset the per-verification fields (the loop calls it before Rule.verify); tree: the
        proposal again when it is a tree (requires: tree is None or tree is proposal)."""
        self.pos0, self.batch, self.logits, self.proposal, self.rule = pos0, batch, logits, proposal, rule
        self.tree = tree
        self.tree_outcome = TreeOutcome()
        self.emitted_index, self.first = emitted_index, first
        self.emitted.clear()
        self.n_accepted = self.n_extra = self.n_fallback = 0
        self.pq = [] if self.record_pq else None

    def log_p(self, i: int, ids: np.ndarray, probs: np.ndarray) -> None:
        """Copy p at draft position i (and q there, if any) into pq; only when record_pq."""
        prop = self.proposal
        has_q = i < len(prop) and prop.q_ids is not None and prop.q_probs is not None and i < len(prop.q_ids)
        assert self.pq is not None
        self.pq.append((self.emitted_index + i, ids.copy(), probs.copy(),
                        prop.q_ids[i] if has_q else None, prop.q_probs[i] if has_q else None))  # type: ignore[index]


class Rule:
    """A verification rule. Subclasses implement ``random`` (and ``greedy`` if not exact-match)."""

    name: str = "rule"
    uses_q: bool = True   # False: the rule never reads q (exact-match)

    def verify(self, v: Verification) -> int:
        """Decide and emit the tokens of one verification; return n_accepted."""
        n = self.greedy(v) if v.sampler.greedy else self.random(v)
        v.n_accepted = n
        return n

    def greedy(self, v: Verification) -> int:
        """p is one-hot at every position: the exact-match rule, no accept randomness."""
        return exact_match(v)

    def random(self, v: Verification) -> int:  # pragma: no cover - interface
        raise NotImplementedError


def exact_match(v: Verification) -> int:
    """The target samples each position with its own dist; a draft is kept only if equal."""
    sampler, drafts, rows = v.sampler, v.proposal.tokens, v.logits
    k = len(drafts)
    for i in range(k + 1):
        if v.pq is not None:
            ids, probs, tok = sampler.candidates_and_sample(rows[i])  # same dist draw as sample()
            v.log_p(i, ids, probs)
        else:
            tok = sampler.sample(rows[i])
        ok = i < k and tok == drafts[i]
        if not v.emit(tok, ok) or not ok:
            return i + 1 if ok else i
    return k


# -- fallbacks: the one place (invariant 3) --------------------------------------------------------
def choose(requested: Rule, exact: Rule, proposal: Proposal | TreeProposal, sampler: TargetSampler, switch_on: bool) -> Rule:
    """The rule that verifies this proposal: `requested`, or `exact` when a fallback applies."""
    if not requested.uses_q:
        return requested
    if not switch_on or len(proposal) == 0 or not proposal.has_q:
        return exact  # the switch off; no proposal; q missing or q length != draft length
    if sampler.has_grammar and not proposal.q_grammar_masked:
        # q ignores the grammar p obeys: drafts are often grammar-invalid, and a sampler clone
        # (block rule) cannot accept an invalid token. A q masked with a clone of the target's
        # grammar state (drafts all valid) keeps the rejection rules exact.
        return exact
    for qp in proposal.q_probs:  # type: ignore[union-attr]
        if not p_is_normalized(qp):
            return exact
    return requested


def p_falls_back(p_probs: np.ndarray) -> bool:
    """Per position: p not summing to 1 +- 1e-3 -> the target's own sample decides there."""
    return not p_is_normalized(p_probs)
