"""The chain's gate (drafters/chain_gate.py): a costly member is asked only while asking it pays.

Timing is injected (a fake clock) so every decision here is deterministic; the end-to-end test
uses the real clock and checks only what must hold whatever the gate decides (greedy = plain).
"""

from __future__ import annotations

import pytest

from llama_spec.drafters.base import Drafter, Proposal
from llama_spec.drafters.chain import ChainDrafter
from llama_spec.drafters.chain_gate import MemberGate


class FakeClock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


class Costly(Drafter):
    """A model-like member: each draft costs `cost` seconds on the fake clock, proposes `k` tokens."""

    costly = True

    def __init__(self, clock: FakeClock, cost: float, k: int, name: str = "costly") -> None:
        self.clock, self.cost, self.k, self.name, self.drafts = clock, cost, k, name, 0

    def draft(self, history, n_max, p_min):
        self.drafts += 1
        self.clock.t += self.cost
        return Proposal(tokens=[7] * min(self.k, n_max), q_ids=None, q_probs=None)


class Never(Drafter):
    name = "never"

    def draft(self, history, n_max, p_min):
        return Proposal(tokens=[], q_ids=None, q_probs=None)


def run_steps(chain: ChainDrafter, clock: FakeClock, n: int, kept: int, step_s: float = 1.0) -> list[bool]:
    """n verification steps: the target step costs step_s; a proposal keeps `kept` drafts.
    Returns, per step, whether a proposal was verified."""
    out = []
    for _ in range(n):
        prop = chain.draft([1, 2, 3], 8, 0.0)
        clock.t += step_s
        chain.accepted(kept if len(prop) else 0)
        out.append(len(prop) > 0)
    return out


def test_gate_bootstraps_alternating_then_follows_the_better_arm_and_explores():
    g = MemberGate(min_turns=3, explore_every=4)
    first = []
    for _ in range(3):      # ask: 2 tok/s; skip: 1 tok/s
        a = g.should_ask()
        first.append(a)
        g.record(a, 2 if a else 1, 1.0)
        b = g.should_ask()
        first.append(b)
        g.record(b, 2 if b else 1, 1.0)
    assert first == [True, False] * 3
    assert g.explore_interval() == 4 * 2 ** 2          # explore_every x (rate ratio)^2
    picks = [g.should_ask() for _ in range(32)]
    assert picks == ([True] * 15 + [False]) * 2        # the better arm, the other once per interval
    g2 = MemberGate(min_turns=1, explore_every=4, max_stretch=3.0)
    g2.record(True, 100, 1.0)
    g2.record(False, 1, 1.0)
    assert g2.explore_interval() == 12                 # the stretch is capped


def test_a_member_that_costs_more_than_it_gains_is_skipped():
    clock = FakeClock()
    slow = Costly(clock, cost=2.0, k=3)        # asked: 2 tokens in 3 s; skipped: 1 token in 1 s
    chain = ChainDrafter([Never(), slow], gate=True, clock=clock)
    verified = run_steps(chain, clock, 8 + 160, kept=1)
    assert verified[:8] == [True, False] * 4                 # the bootstrap: each arm 4 turns
    # then only the exploration turns: one per 16 x (1.0 / (2/3))^2 = 36 turns
    assert sum(verified[8:]) == 160 // 36
    s = chain.stats_by_drafter()["costly"]
    assert s["skipped"] == 4 + 156 and s["verifications"] == 4 + 4 == slow.drafts
    assert s["ask_tok_per_s"] == pytest.approx(2 / 3, abs=1e-3)
    assert s["skip_tok_per_s"] == pytest.approx(1.0, abs=1e-3)


def test_a_member_that_pays_is_asked_and_an_earlier_winner_leaves_its_gate_alone():
    clock = FakeClock()
    fast = Costly(clock, cost=0.1, k=4)        # asked: 4 tokens in 1.1 s
    chain = ChainDrafter([Never(), fast], gate=True, clock=clock)
    verified = run_steps(chain, clock, 8 + 64, kept=3)
    assert sum(verified[8:]) == 64   # 3.6x the skip rate: explored once per 16 x 3.6^2 = 211 turns
    # an earlier member that proposes takes the turn: the gated member is not reached, nothing is recorded
    free = Costly(clock, cost=0.0, k=1, name="free")
    free.costly = False
    slow = Costly(clock, cost=5.0, k=1)
    chain2 = ChainDrafter([free, slow], gate=True, clock=clock)
    run_steps(chain2, clock, 20, kept=1)
    assert list(chain2.gates) == [1] and chain2.gates[1].ask_arm.turns == chain2.gates[1].skip_arm.turns == 0
    assert slow.drafts == 0


def test_gate_off_is_the_plain_chain():
    clock = FakeClock()
    slow = Costly(clock, cost=2.0, k=3)
    chain = ChainDrafter([Never(), slow], clock=clock)
    assert chain.gates == {}
    assert all(run_steps(chain, clock, 40, kept=1))


def test_bad_gate_settings_are_refused():
    for kw in ({"min_turns": 0}, {"explore_every": 1}, {"decay": 0.0}, {"decay": 1.5}, {"max_stretch": 0.5}):
        with pytest.raises(ValueError, match="gate"):
            MemberGate(**kw)


def test_gated_chain_greedy_equals_plain_decoding(smollm):
    # whatever the (real-clock) gate decides, greedy output is plain decoding's (repack off)
    from llama_spec import SamplerParams
    from llama_spec.drafters.draft_model import DraftModelDrafter
    from llama_spec.drafters.ngram import NgramModDrafter
    from llama_spec.generation.solo import SpeculativeGenerator

    prompt, greedy = "List the planets of the solar system, one per line:\n", SamplerParams(temp=0.0)
    plain = SpeculativeGenerator(smollm, None, n_ctx=1024)
    try:
        want = plain.generate(prompt, sampling=greedy, n_predict=48).tokens
    finally:
        plain.close()
    chain = ChainDrafter([NgramModDrafter(4, 8, 2), DraftModelDrafter(smollm, n_ctx=1024)], gate=True)
    gen = SpeculativeGenerator(smollm, chain, n_ctx=1024, n_max=4)
    try:
        res = gen.generate(prompt, sampling=greedy, n_predict=48)
    finally:
        gen.close()
    assert res.tokens == want
    s = chain.stats_by_drafter()["draft-simple"]
    assert s["ask_turns"] >= 4 and s["skip_turns"] >= 4   # the bootstrap ran both arms
    assert s["skipped"] == s["skip_turns"]
