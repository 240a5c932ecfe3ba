"""Chained drafters (``--spec-type ngram-mod,draft-simple``): the first member that proposes wins.

Per verification the members are asked in order; the first non-empty proposal is the one
verified (llama.cpp's common_speculative_draft). Every member still sees the whole request:
``configure``, ``bind_grammar``, ``prepare_target``, ``begin``, ``snapshot_prompt``, ``restore_prompt``,
``observe`` (every target decode: MTP replays them) and ``close`` go to all of them. After the
verification the winner gets ``accepted(n)``; every other member gets ``other_accepted(n)`` when
it has one (the n-gram drafters: a proposal that was not theirs must not tune them, as llama.cpp's
``is_other``), else ``accepted(n)`` (draft-mtp needs the kept count of every verification to pick
its hidden row and roll back; draft-simple re-syncs its KV from the history by itself).

A member with an ``observe_batches`` switch (draft-simple) has it turned off: it decodes nothing
while an earlier member wins, and when its turn comes its lazy sync decodes the tokens it missed in
one prefill (n_batch chunks) instead of one draft-model decode per verification. This is what keeps
``ngram-mod,draft-simple`` close to ngram-mod alone on text that repeats (issue 16). Drafts only
change speed, so what is emitted is unchanged.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING

import numpy as np

from .base import Drafter, Proposal

if TYPE_CHECKING:  # annotations only: the chain needs no compiled binding itself
    from ..context import Context
    from ..grammar import GrammarState
    from ..sampling import SamplerParams


@dataclass
class DrafterCounters:
    """One member's share of the verifications (cumulative over requests until reset)."""

    verifications: int = 0   # verifications that carried this member's proposal
    drafted: int = 0         # draft tokens it proposed (and were verified)
    accepted: int = 0        # of those, kept


class ChainDrafter(Drafter):
    """A list of drafters tried in order for every verification; statistics per member."""

    def __init__(self, drafters: Sequence[Drafter]) -> None:
        if not drafters:
            raise ValueError("drafters: a chain needs at least one drafter")
        vocab = {d.vocab_size for d in drafters if d.vocab_size}
        if len(vocab) > 1:
            raise ValueError(f"drafters: members disagree on the vocabulary size ({sorted(vocab)})")
        self.drafters: list[Drafter] = list(drafters)
        for d in self.drafters:
            if hasattr(d, "observe_batches"):  # see the module docstring
                d.observe_batches = False
        self.name = ",".join(d.name for d in self.drafters)
        self.vocab_size = vocab.pop() if vocab else 0
        self.counters: list[DrafterCounters] = [DrafterCounters() for _ in self.drafters]
        self.winner: int | None = None   # index of the member whose proposal is being verified
        self.observe_without_target_outputs = all(d.observe_without_target_outputs for d in self.drafters)

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
        for d in self.drafters:
            d.begin(prompt)

    def snapshot_prompt(self, n_tokens: int) -> None:
        for d in self.drafters:
            d.snapshot_prompt(n_tokens)

    def restore_prompt(self, n_tokens: int) -> None:
        self.winner = None
        for d in self.drafters:
            d.restore_prompt(n_tokens)

    def observe(self, tokens: np.ndarray, pos0: int, target: Context) -> None:
        for d in self.drafters:
            d.observe(tokens, pos0, target)

    def draft(self, history: list[int], n_max: int, p_min: float) -> Proposal:
        """The first member's non-empty proposal (at most n_max tokens); empty if none has one."""
        self.winner = None
        for i, d in enumerate(self.drafters):
            prop = d.draft(history, n_max, p_min)
            if len(prop) > 0:
                self.winner = i
                c = self.counters[i]
                c.verifications += 1
                c.drafted += min(len(prop), n_max)
                return prop
        return Proposal()

    def accepted(self, n_accepted: int) -> None:
        w, self.winner = self.winner, None
        if w is not None:
            self.counters[w].accepted += int(n_accepted)
        for i, d in enumerate(self.drafters):
            if i == w or w is None:
                d.accepted(n_accepted)   # no winner: every member's own (empty) draft got 0
                continue
            other = getattr(d, "other_accepted", None)
            if other is not None:
                other(n_accepted)
            else:
                d.accepted(n_accepted)

    def close(self) -> None:
        for d in self.drafters:
            d.close()
