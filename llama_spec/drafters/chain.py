"""Chained drafters (``--spec-type ngram-mod,draft-simple``): the first member that proposes wins.

Per verification the members are asked in order; the first non-empty proposal is the one
verified (llama.cpp's common_speculative_draft). Every member still sees the whole request:
``configure``, ``bind_grammar``, ``prepare_target``, ``begin``, ``snapshot_prompt``, ``restore_prompt``,
``observe`` (every target decode: MTP replays them) and ``close`` go to all of them. After the
verification the winner gets ``accepted(n)`` and every other member ``other_accepted(n)``. The
n-gram drafters override it (a proposal that was not theirs must not tune them, as llama.cpp's
``is_other``); the default forwards to ``accepted(n)`` (draft-mtp needs the kept count of every
verification to pick its hidden row and roll back; draft-simple re-syncs its KV by itself).

Every member is told ``sit_out_observes()``; draft-simple then turns ``observe_batches`` off: it
decodes nothing while an earlier member wins, and when its turn comes its lazy sync decodes the
tokens it missed in one prefill (n_batch chunks) instead of one draft-model decode per
verification. This is what keeps
``ngram-mod,draft-simple`` close to ngram-mod alone on text that repeats (issue 16). Drafts only
change speed, so what is emitted is unchanged.

With ``gate=True`` each costly member (``Drafter.costly``: it runs a model) also has a
:class:`~.chain_gate.MemberGate`: on its turn the chain asks it only while steps that ask it emit
more tokens per second than steps that skip it (chain_gate.py says how, and why this is opt-in for
seeded sampling).

Trees (``--spec-draft-tree``): a chain drafts them with its first member that does
(:class:`~.tree.TreeDrafting`: draft-simple), which then counts as the winner; without one, asking
for a tree is a ValueError. Under the speculation controller the tree is one arm among the
members' (generation/controller.py); without it every verification is that member's tree.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, cast

import numpy as np

from .base import Drafter, Proposal, TargetRows, pack_parts, unpack_parts
from .chain_gate import MemberGate, StepClock
from .tree import TreeDrafting, TreeProposal

if TYPE_CHECKING:  # annotations only: the chain needs no compiled binding itself
    from ..llama.context import Context
    from ..llama.grammar import GrammarState
    from ..llama.sampling import SamplerParams


@dataclass
class DrafterCounters:
    """One member's share of the verifications (cumulative over requests until reset)."""

    verifications: int = 0   # verifications that carried this member's proposal
    drafted: int = 0         # draft tokens it proposed (and were verified)
    accepted: int = 0        # of those, kept
    skipped: int = 0         # turns its gate skipped it (gate=True, costly members only)


class ChainDrafter(Drafter):
    """A list of drafters tried in order for every verification; statistics per member."""

    def __init__(self, drafters: Sequence[Drafter], *, gate: bool = False,
                 clock: Callable[[], float] | None = None) -> None:
        if not drafters:
            raise ValueError("drafters: a chain needs at least one drafter")
        vocab = {d.vocab_size for d in drafters if d.vocab_size}
        if len(vocab) > 1:
            raise ValueError(f"drafters: members disagree on the vocabulary size ({sorted(vocab)})")
        self.drafters: list[Drafter] = list(drafters)
        for d in self.drafters:
            d.sit_out_observes()   # see the module docstring
        self.name = ",".join(d.name for d in self.drafters)
        self.vocab_size = vocab.pop() if vocab else 0
        self.counters: list[DrafterCounters] = [DrafterCounters() for _ in self.drafters]
        self.winner: int | None = None   # index of the member whose proposal is being verified
        self.observe_without_target_outputs = all(d.observe_without_target_outputs for d in self.drafters)
        # gate: one MemberGate per costly member (index -> gate); clock: injectable for tests
        self.gates: dict[int, MemberGate] = ({i: MemberGate() for i, d in enumerate(self.drafters) if d.costly}
                                             if gate else {})
        self._step = StepClock(clock) if clock is not None else StepClock()
        self._n_won = 0   # drafts of the winner's proposal that are verified (truncated)

    # -- statistics ---------------------------------------------------------------------------
    def member_names(self) -> list[str]:
        """Member names, made unique with #2, #3 .. where a type repeats."""
        seen: dict[str, int] = {}
        out = []
        for d in self.drafters:
            seen[d.name] = seen.get(d.name, 0) + 1
            out.append(d.name if seen[d.name] == 1 else f"{d.name}#{seen[d.name]}")
        return out

    def stats_by_drafter(self) -> dict[str, dict[str, int | float]]:
        """{member name: {verifications, drafted, accepted, acceptance_rate}} in chain order."""
        out: dict[str, dict[str, int | float]] = {}
        for name, c in zip(self.member_names(), self.counters, strict=True):
            row: dict[str, int | float] = dict(asdict(c))
            row["acceptance_rate"] = c.accepted / c.drafted if c.drafted else 0.0
            out[name] = row
        names = self.member_names()
        for i, g in self.gates.items():
            out[names[i]].update(g.summary())
        return out

    def reset_counters(self) -> None:
        self.counters = [DrafterCounters() for _ in self.drafters]

    # -- the Drafter hooks, forwarded ---------------------------------------------------------
    def configure(self, params: SamplerParams, seed: int, *, sample: bool = True,
                  collect_topk: bool = False) -> None:
        super().configure(params, seed, sample=sample, collect_topk=collect_topk)
        for d in self.drafters:
            d.configure(params, seed, sample=sample, collect_topk=collect_topk)

    def bind_grammar(self, source: Callable[[], GrammarState | None] | None) -> None:
        super().bind_grammar(source)
        for d in self.drafters:
            d.bind_grammar(source)

    def prepare_target(self, target: Context) -> None:
        for d in self.drafters:
            d.prepare_target(target)

    def begin(self, prompt: list[int]) -> None:
        self.winner = None
        self._step.stop()   # a step cut short (a request that ended in draft) is not timed
        for d in self.drafters:
            d.begin(prompt)

    def begin_prefix(self, prompt: list[int], n_kept: int) -> int:
        """What every member keeps: each is asked again with a smaller count until they agree."""
        self.winner = None
        self._step.stop()
        n = n_kept
        while True:
            m = min(n, *(d.begin_prefix(prompt, n) for d in self.drafters))
            if m == n:
                return n
            n = m

    def save_prefix(self) -> bytes | None:
        return pack_parts([d.save_prefix() for d in self.drafters])

    def load_prefix(self, data: bytes | None) -> None:
        parts = unpack_parts(data) if data is not None else [None] * len(self.drafters)
        for d, part in zip(self.drafters, parts, strict=True):
            d.load_prefix(part)

    def snapshot_prompt(self, n_tokens: int) -> None:
        for d in self.drafters:
            d.snapshot_prompt(n_tokens)

    def restore_prompt(self, n_tokens: int) -> None:
        self.winner = None
        self._step.stop()
        for d in self.drafters:
            d.restore_prompt(n_tokens)

    def observe(self, tokens: np.ndarray, pos0: int, target: TargetRows) -> None:
        for d in self.drafters:
            d.observe(tokens, pos0, target)

    def prepare(self) -> None:
        for d in self.drafters:
            d.prepare()

    def draft(self, history: list[int], n_max: int, p_min: float) -> Proposal:
        """The first member's non-empty proposal (at most n_max tokens); empty if none has one."""
        self.winner = None
        self.prepare()   # (the gates time the step)
        self._step.start()
        for i, d in enumerate(self.drafters):
            gate = self.gates.get(i)
            if gate is not None:
                asked = gate.should_ask()
                self._step.arms.append((i, asked))
                if not asked:
                    self.counters[i].skipped += 1
                    continue
            prop = d.draft(history, n_max, p_min)
            if len(prop) > 0:
                self._won(i, prop, n_max)
                return prop
        return Proposal()

    def _won(self, i: int, prop: Proposal | TreeProposal, n_max: int) -> None:
        """Member i's non-empty proposal goes to verification: count it."""
        self.winner = i
        c = self.counters[i]
        c.verifications += 1
        c.drafted += min(len(prop), n_max)
        self._n_won = min(len(prop), n_max)

    def draft_member(self, i: int, history: list[int], n_max: int, p_min: float) -> Proposal:
        """Member i's proposal alone (the speculation controller chooses the member; no gate)."""
        self.winner = None
        self._step.start()   # (run_plan, its one caller, prepared member i)
        prop = self.drafters[i].draft(history, n_max, p_min)
        if len(prop) > 0:
            self._won(i, prop, n_max)
        return prop

    def tree_member(self) -> int | None:
        """The index of the first member that drafts trees (None: no member does)."""
        return next((i for i, d in enumerate(self.drafters) if isinstance(d, TreeDrafting)), None)

    def enable_tree(self, shape: tuple[int, ...]) -> None:
        i = self.tree_member()
        if i is None:
            raise ValueError(f"tree: no member of the chain {self.name!r} drafts trees (draft-simple does)")
        cast(TreeDrafting, self.drafters[i]).enable_tree(shape)

    def draft_tree(self, history: list[int], shape: tuple[int, ...], p_min: float) -> TreeProposal:
        """The tree member's tree (requires: enable_tree succeeded); it is the winner if non-empty."""
        i = self.tree_member()
        assert i is not None
        self.winner = None
        self._step.start()
        prop = cast(TreeDrafting, self.drafters[i]).draft_tree(history, shape, p_min)
        if len(prop) > 0:
            self._won(i, prop, len(prop))
        return prop

    def truncated(self, k: int) -> None:
        """The winner's proposal cut to k drafts (0: not verified at all; no winner then)."""
        w = self.winner
        if w is None:
            return
        n = self._n_won
        c = self.counters[w]
        c.drafted -= max(0, n - k)
        self._n_won = min(n, k)
        self.drafters[w].truncated(k)
        if k == 0:
            c.verifications -= 1
            self.winner = None

    def members(self) -> Sequence[Drafter]:
        return tuple(self.drafters)

    def accepted(self, n_accepted: int) -> None:
        w, self.winner = self.winner, None
        seconds = self._step.stop()
        if seconds is not None:
            for i, asked in self._step.arms:
                self.gates[i].record(asked, int(n_accepted) + 1, seconds)
        if w is not None:
            self.counters[w].accepted += int(n_accepted)
        for i, d in enumerate(self.drafters):
            if i == w or w is None:
                d.accepted(n_accepted)   # no winner: every member's own (empty) draft got 0
            else:
                d.other_accepted(n_accepted)

    def proposer(self) -> str:
        """The winning member's unique name (the chain's own name when no member proposed)."""
        return self.name if self.winner is None else self.member_names()[self.winner]

    def sit_out_observes(self) -> None:
        for d in self.drafters:
            d.sit_out_observes()

    def close(self) -> None:
        for d in self.drafters:
            d.close()
