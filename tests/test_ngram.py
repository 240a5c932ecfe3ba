"""N-gram drafters (ngram-simple, ngram-map-k, ngram-mod) and the chained drafter.

Most tests need no model: drafts on crafted token sequences against hand-derived answers and
against naive transcriptions of llama.cpp's algorithms (common/ngram-map.cpp, speculative.cpp),
q as the empirical distribution, sampled drafts distributed as q, seeds, request resets and the
chain's routing. The last tests run SpeculativeGenerator on smollm2-135m at temperature 0.
"""

from __future__ import annotations

import random
from collections import Counter

import numpy as np
import pytest
from scipy import stats

from llama_spec.drafters.base import Drafter, Proposal
from llama_spec.drafters.chain import ChainDrafter
from llama_spec.drafters.ngram import (
    NGRAM_CLI_FLAGS,
    NgramMapDrafter,
    NgramModDrafter,
    NgramPool,
    NgramSimpleDrafter,
    build_ngram_drafter,
    parse_spec_types,
)
from llama_spec.drafters.ngram_index import HistoryIndex
from llama_spec.llama.sampling import SamplerParams

HOT = SamplerParams(temp=0.8)
GREEDY = SamplerParams(temp=0.0)
ALPHA = 1e-4


# ---- naive transcriptions of llama.cpp's drafters (tokens = history[:-1], sampled = history[-1]) ----

def simple_oracle(h: list[int], n: int, m: int) -> list[int]:
    tokens, sampled = h[:-1], h[-1]
    cur = len(tokens)
    if cur <= n + m + 1:
        return []
    pattern = tokens[cur - n + 1 :] + [sampled]
    for j in range(cur - n - 1, 0, -1):
        if tokens[j : j + n] == pattern:
            copy = min(m, cur - (j + n))
            return tokens[j + n : j + n + copy] if copy >= n else []
    return []


class MapKOracle:
    def __init__(self, n: int, m: int, prompt: list[int]) -> None:
        self.n, self.m = n, m
        self.key_map: dict[tuple, int] = {}
        self.kmli = 0
        self.slb = len(prompt) - 1
        self.keys: dict[tuple, int] = {}
        self.last = None

    def draft(self, h: list[int]) -> list[int]:
        n, m, tokens = self.n, self.m, h[:-1]
        self.last = None
        cur = len(tokens)
        if cur < 2 * n + m:
            return []
        key = tokens[cur - n + 1 :] + [h[-1]]
        match = 0
        idx = self.key_map.get(tuple(key), 0)
        if idx != 0 and idx < cur - n - m - 1 and tokens[idx : idx + n] == key:
            match = idx
        if match == 0 and self.slb > n + m + 1:
            for j in range(self.slb - n - m - 1, self.kmli, -1):
                if tokens[j : j + n] == key:
                    match = j
                    break
        if match == 0:
            j = cur - n - m - 1
            while j > self.slb and j > self.kmli:
                if tokens[j : j + n] == key:
                    match = j
                    break
                j -= 1
        if self.slb > n + m + 1:
            for j in range(self.slb - n - m - 1, self.kmli, -1):
                self.key_map.setdefault(tuple(tokens[j : j + n]), j)
        for j in range(cur - n - m - 1, max(self.slb, self.kmli), -1):
            self.key_map.setdefault(tuple(tokens[j : j + n]), j)
        self.kmli = max(cur - n - m - 1, self.kmli)
        if match == 0:
            return []
        self.last = tuple(key)
        return tokens[match + n : match + n + min(m, self.keys.setdefault(tuple(key), m))]

    def accept(self, n_acc: int) -> None:
        if self.last is not None:
            self.keys[self.last] = n_acc


class ModOracle:
    def __init__(self, n: int, n_min: int, n_max: int, prompt: list[int]) -> None:
        self.n, self.n_min, self.n_max = n, n_min, n_max
        self.pool: dict[tuple, int] = {}
        p = prompt[:-1]
        self.i_last = 0
        if len(p) >= n:
            for i in range(len(p) - n):
                self.pool[tuple(p[i : i + n])] = p[i + n]
            self.i_last = len(p) - n

    def draft(self, h: list[int]) -> list[int]:
        n, tokens = self.n, h[:-1]
        cur = len(tokens)
        if cur < n:
            return []
        if self.i_last + 32 < cur:
            for i in range(self.i_last, cur - n):
                self.pool[tuple(tokens[i : i + n])] = tokens[i + n]
            self.i_last = cur - n
        res = tokens[cur - n + 1 :] + [h[-1]]
        for i in range(self.n_max):
            t = self.pool.get(tuple(res[i : i + n]))
            if t is None:
                if i < self.n_min:
                    return []
                break
            res.append(t)
        return res[n:]


# ---- hand-derived cases ------------------------------------------------------------------

def test_simple_hand_cases():
    d = NgramSimpleDrafter(size_n=2, size_m=3)
    # key (5, 6): the newest earlier occurrence starts at 6 and is followed by 4 3 1
    h = [0, 5, 6, 7, 8, 9, 5, 6, 4, 3, 1, 5, 6]
    assert d.draft(h, 8, 0.0).tokens == [4, 3, 1]
    assert d.draft(h, 2, 0.0).tokens == [4, 3]
    assert d.draft(h[:7], 8, 0.0).tokens == []          # L - 1 <= n + m + 1: too short
    # the only match leaves 1 token before the end (< n): nothing (the overlapping one is skipped)
    assert NgramSimpleDrafter(2, 3).draft([0, 1, 2, 3, 4, 5, 9, 9, 9, 9], 8, 0.0).tokens == []
    assert NgramSimpleDrafter(2, 3).draft([0, 1, 2, 3, 4, 5, 6, 7, 8, 9], 8, 0.0).tokens == []
    # position 0 is never a match (llama.cpp's "0 = no match")
    assert NgramSimpleDrafter(2, 3).draft([5, 6, 1, 2, 3, 4, 7, 8, 5, 6], 8, 0.0).tokens == []


def test_map_k_hand_cases():
    # first registration wins: (5, 6) is registered at 5 (the newest in the prompt when the map
    # was built), so later it still drafts 8 2, where ngram-simple takes the newest (at 14): 3 3
    prompt = [0, 5, 6, 7, 1, 5, 6, 8, 2, 3, 4, 1, 2, 3]
    d = NgramMapDrafter(size_n=2, size_m=2)
    d.begin(prompt)
    assert d.draft(prompt, 8, 0.0).tokens == [4, 1]     # key (2, 3) at 8
    h = prompt + [5, 6, 3, 3, 3, 3, 3, 5, 6]
    assert d.draft(h, 8, 0.0).tokens == [8, 2]
    assert NgramSimpleDrafter(2, 2).draft(h, 8, 0.0).tokens == [3, 3]
    # the draft length follows what was kept the last time this key drafted
    d.accepted(1)
    h2 = h + [8, 4, 4, 4, 5, 6]
    assert d.draft(h2, 8, 0.0).tokens == [8]
    d.accepted(0)
    assert d.draft(h2 + [8, 2, 2, 5, 6], 8, 0.0).tokens == []
    assert d.draft(h2 + [8, 2, 2, 2, 3], 8, 0.0).tokens == [4, 1]   # other keys are unaffected


def test_mod_hand_cases():
    d = NgramModDrafter(n_match=2, n_max=4, n_min=2)
    p = [1, 2, 3, 4, 1, 2, 3]
    d.begin(p)            # learns (1,2)->3 (2,3)->4 (3,4)->1 (4,1)->2 from p[:-1]
    assert d.draft(p, 8, 0.0).tokens == [4, 1, 2, 3]    # chained through the pool
    assert d.draft(p, 3, 0.0).tokens == [4, 1, 2]
    d2 = NgramModDrafter(n_match=2, n_max=4, n_min=2)
    d2.begin([1, 2, 3, 9, 9])
    assert d2.draft([1, 2, 3, 9, 9], 8, 0.0).tokens == []          # (9, 9) unknown
    d3 = NgramModDrafter(n_match=2, n_max=8, n_min=2)
    d3.begin([1, 2, 3, 9, 1, 2])                        # (1,2)->3 (2,3)->9 (3,9)->1
    assert d3.draft([1, 2, 3, 9, 1, 2], 8, 0.0).tokens == [3, 9, 1]  # miss at 3 >= n_min
    d4 = NgramModDrafter(n_match=2, n_max=8, n_min=4)
    d4.begin([1, 2, 3, 9, 1, 2])
    assert d4.draft([1, 2, 3, 9, 1, 2], 8, 0.0).tokens == []         # miss at 3 < n_min


def test_mod_pool_shared_and_low_acceptance_reset():
    pool = NgramPool(n_match=2)
    a = NgramModDrafter(2, 4, 1, pool=pool)
    b = NgramModDrafter(2, 4, 1, pool=pool)
    a.begin([7, 8, 9, 7, 8])                        # learns (7,8)->9 (8,9)->7
    assert b.draft([5, 7, 8], 8, 0.0).tokens == [9, 7]           # b reads what a learned
    with pytest.raises(ValueError, match="n_match"):
        NgramModDrafter(3, pool=pool)
    gen = pool.generation
    for _ in range(4):
        assert b.draft([5, 7, 8], 4, 0.0).tokens
        b.accepted(0)
    assert pool.generation == gen and len(pool) > 0
    b.draft([5, 7, 8], 4, 0.0)
    b.accepted(0)                                   # the fifth round in a row below 25 %
    assert pool.generation == gen + 1 and len(pool) == 0


# ---- against the naive transcriptions on random sequences ------------------------------------

def _random_run(seed: int, length: int = 160, alphabet: int = 3):
    rng = random.Random(seed)
    prompt = [0] + [rng.randrange(1, alphabet + 1) for _ in range(rng.randrange(20, 60))]
    rest = [rng.randrange(1, alphabet + 1) for _ in range(length)]
    return rng, prompt, rest


@pytest.mark.parametrize("seed", range(6))
def test_simple_matches_llama_algorithm(seed):
    rng, prompt, rest = _random_run(seed)
    n, m = rng.choice([(2, 3), (3, 4), (2, 6)])
    d = NgramSimpleDrafter(n, m)
    d.begin(prompt)
    h = list(prompt)
    for t in rest:
        assert d.draft(h, 64, 0.0).tokens == simple_oracle(h, n, m)
        h.append(t)


@pytest.mark.parametrize("seed", range(6))
def test_map_k_matches_llama_algorithm(seed):
    rng, prompt, rest = _random_run(seed)
    n, m = rng.choice([(2, 2), (2, 3), (3, 2)])
    d, o = NgramMapDrafter(n, m), MapKOracle(n, m, prompt)
    d.begin(prompt)
    h = list(prompt)
    i = 0
    while i < len(rest):
        got, want = d.draft(h, 64, 0.0).tokens, o.draft(h)
        assert got == want
        n_acc = rng.randrange(len(got) + 1)   # a verification keeps a prefix, then one new token
        d.accepted(n_acc)
        o.accept(n_acc)
        step = got[:n_acc] + rest[i : i + 1 + rng.randrange(3)]
        h.extend(step)
        i += len(step) - n_acc


@pytest.mark.parametrize("seed", range(4))
def test_mod_matches_llama_algorithm(seed):
    rng, prompt, rest = _random_run(seed, length=200, alphabet=3)
    n, n_min, n_max = rng.choice([(3, 1, 4), (4, 2, 6), (3, 0, 5)])
    d, o = NgramModDrafter(n, n_max, n_min), ModOracle(n, n_min, n_max, prompt)
    d.begin(prompt)
    h = list(prompt)
    for t in rest:
        got = d.draft(h, 64, 0.0).tokens
        assert got == o.draft(h)
        d.accepted(len(got))        # keep everything: no low-acceptance reset in the oracle
        h.append(t)


def test_history_index_incremental_equals_fresh():
    rng = random.Random(3)
    idx = HistoryIndex(3)
    toks: list[int] = []
    for _ in range(300):
        if rng.random() < 0.2 and toks:
            toks = toks[: rng.randrange(len(toks))]
        else:
            toks = toks + [rng.randrange(3) for _ in range(rng.randrange(1, 6))]
        idx.sync(toks, full=True)
        fresh = HistoryIndex(3)
        fresh.extend(toks)
        assert idx.tokens == toks and idx._pos == fresh._pos


# ---- q ----------------------------------------------------------------------------------------

# key (5, 6) followed by 7 1, 7 1, 7 2, 4 1, 9 3, 9 3: q_1 = {7: 3/6, 4: 1/6, 9: 2/6}
SEGMENTS = [(7, 1), (7, 1), (7, 2), (4, 1), (9, 3), (9, 3)]
CRAFTED = [0] + [t for a, b in SEGMENTS for t in (5, 6, a, b, 0)] + [5, 6]
JOINT = {(7, 1): 2 / 6, (7, 2): 1 / 6, (4, 1): 1 / 6, (9, 3): 2 / 6}


def _q(prop: Proposal, i: int) -> dict[int, float]:
    return dict(zip(prop.q_ids[i].tolist(), prop.q_probs[i].tolist(), strict=True))


@pytest.mark.parametrize("cls", [NgramSimpleDrafter, NgramMapDrafter])
def test_q_is_the_empirical_distribution(cls):
    d = cls(2, 2)
    d.configure(HOT, 5)
    d.begin(CRAFTED)
    for _ in range(20):
        prop = d.draft(CRAFTED, 8, 0.0)
        assert len(prop) == 2 and prop.has_q
        assert _q(prop, 0) == pytest.approx({7: 0.5, 4: 1 / 6, 9: 1 / 3})
        d1 = prop.tokens[0]
        cond = {b: p / sum(v for (a, _), v in JOINT.items() if a == d1) for (a, b), p in JOINT.items() if a == d1}
        assert _q(prop, 1) == pytest.approx(cond)
        for qp in prop.q_probs:
            assert qp.dtype == np.float32 and abs(float(qp.sum()) - 1.0) < 1e-6


def test_deterministic_modes():
    d = NgramSimpleDrafter(2, 2)
    d.configure(GREEDY, 1)                     # greedy target: llama.cpp's draft, one-hot q
    prop = d.draft(CRAFTED, 8, 0.0)
    assert prop.tokens == [9, 3] and _q(prop, 0) == {9: 1.0} and _q(prop, 1) == {3: 1.0}
    d.configure(HOT, 1, sample=False)          # exact-match rule: no q
    prop = d.draft(CRAFTED, 8, 0.0)
    assert prop.tokens == [9, 3] and prop.q_ids is None and not prop.has_q
    d = NgramSimpleDrafter(2, 2, deterministic=True)
    d.configure(HOT, 1)
    assert d.draft(CRAFTED, 8, 0.0).tokens == [9, 3]
    d = NgramSimpleDrafter(2, 2, greedy_pick="mode")   # the most frequent continuation instead
    d.configure(GREEDY, 1)
    prop = d.draft(CRAFTED, 8, 0.0)
    assert prop.tokens == [7, 1] and _q(prop, 0) == pytest.approx({7: 0.5, 4: 1 / 6, 9: 1 / 3})


class _UniformSimple(NgramSimpleDrafter):
    """Broken on purpose: draws uniformly over the support but reports the empirical q."""

    def _choose_sample(self, ids, counts):
        return int(self._rng.integers(len(ids)))


def _joint_pvalue(cls, n: int, seed: int) -> float:
    d = cls(2, 2)
    d.configure(HOT, seed)
    seen = Counter(tuple(d.draft(CRAFTED, 2, 0.0).tokens) for _ in range(n))
    cells = sorted(JOINT)
    assert set(seen) <= set(cells)
    obs = np.array([seen[c] for c in cells], dtype=float)
    exp = np.array([JOINT[c] * n for c in cells])
    return float(stats.chisquare(obs, exp).pvalue)


def test_sampled_drafts_are_distributed_as_q():
    # (d_1, d_2) over 4 cells, N = 4000: a correct drafter fails with probability 1e-4; the
    # uniform variant (P(7, .) = 1/3 instead of 1/2) has power ~1 (chi-square noncentrality ~900)
    assert _joint_pvalue(NgramSimpleDrafter, 4000, 11) > ALPHA
    assert _joint_pvalue(_UniformSimple, 4000, 11) < ALPHA


def test_mod_q_counts_and_sampling():
    pool = NgramPool(2)
    d = NgramModDrafter(2, 1, 1, pool=pool)
    seq = [0, 1, 2, 3, 8, 1, 2, 3, 8, 1, 2, 7, 8, 1, 2]
    d.begin(seq)
    d.configure(GREEDY, 0)
    assert d.draft(seq, 1, 0.0).tokens == [7]           # llama.cpp: the last token seen after (1, 2)
    d.configure(HOT, 0)
    seen = Counter()
    for _ in range(3000):
        prop = d.draft(seq, 1, 0.0)
        assert _q(prop, 0) == pytest.approx({3: 2 / 3, 7: 1 / 3})
        seen[prop.tokens[0]] += 1
    assert stats.chisquare([seen[3], seen[7]], [2000, 1000]).pvalue > ALPHA


def test_seed_determinism_and_request_reset():
    def run(seed):
        d = NgramSimpleDrafter(2, 2)
        d.configure(HOT, seed)
        return [tuple(d.draft(CRAFTED, 2, 0.0).tokens) for _ in range(40)]

    assert run(3) == run(3) and run(3) != run(4)
    d = NgramSimpleDrafter(2, 2)
    d.begin(CRAFTED)
    d.draft(CRAFTED, 2, 0.0)
    other = [0, 1, 2, 3, 4, 9, 9, 9, 1, 2]     # a new request: nothing of CRAFTED may remain
    d.begin(other)
    assert d.index.tokens == other
    assert d.draft(other, 8, 0.0).tokens == simple_oracle(other, 2, 2)
    d.restore_prompt(5)                        # prompt-cache hit on the first 5 tokens
    assert d.index.tokens == other[:5]
    m = NgramMapDrafter(2, 2)
    m.begin(CRAFTED)
    m.draft(CRAFTED, 8, 0.0)
    m.begin(other)
    assert m._registered == {} and m._size_begin == len(other) - 1


def test_parse_and_build():
    assert parse_spec_types("draft-simple,ngram-mod") == ["ngram-mod", "draft-simple"]
    assert parse_spec_types("draft-simple,ngram-mod", keep_order=True) == ["draft-simple", "ngram-mod"]
    assert parse_spec_types("ngram-mod,none") == []
    with pytest.raises(ValueError, match="spec_type"):
        parse_spec_types("ngram-foo")
    d = build_ngram_drafter("ngram-map-k", size_n=3, size_m=5)
    assert isinstance(d, NgramMapDrafter) and (d.size_n, d.size_m) == (3, 5)
    assert isinstance(build_ngram_drafter("ngram-mod"), NgramModDrafter)
    with pytest.raises(ValueError, match="not implemented"):
        build_ngram_drafter("ngram-map-k4v")
    with pytest.raises(ValueError, match="size_n"):
        build_ngram_drafter("ngram-simple", size_n=0)
    for _flag, (t, knob, default) in NGRAM_CLI_FLAGS.items():
        assert getattr(build_ngram_drafter(t), knob) == default


# ---- the chain ------------------------------------------------------------------------------------

class _Fixed(Drafter):
    def __init__(self, name, tokens):
        self.name, self.tokens, self.log = name, tokens, []

    def draft(self, history, n_max, p_min):
        self.log.append("draft")
        return Proposal(tokens=list(self.tokens[:n_max]), q_ids=None, q_probs=None)

    def begin(self, prompt):
        self.log.append("begin")

    def accepted(self, n):
        self.log.append(("accepted", n))


def test_chain_precedence_stats_and_routing():
    empty, a, b = _Fixed("e", []), _Fixed("a", [1, 2, 3]), _Fixed("b", [4])
    mapk = NgramMapDrafter(2, 2)
    chain = ChainDrafter([empty, mapk, a, b])
    chain.begin(CRAFTED)
    assert all("begin" in d.log for d in (empty, a, b))
    prop = chain.draft(CRAFTED, 8, 0.0)            # map-k has a match: it wins over a and b
    assert prop.tokens == [9, 3] and chain.winner == 1 and "draft" not in b.log
    assert chain.proposer() == "ngram-map-k"       # the key of per-drafter statistics (draft_length)
    chain.accepted(1)
    assert mapk._n_kept[(5, 6)] == 1               # the winner tunes itself
    assert ("accepted", 1) in a.log                # others without other_accepted still hear n
    h = CRAFTED + [9, 8]                           # no n-gram match: a wins
    assert chain.draft(h, 2, 0.0).tokens == [1, 2] and chain.winner == 2
    chain.accepted(2)
    assert mapk._n_kept[(5, 6)] == 1               # not the winner: map-k is not tuned
    s = chain.stats_by_drafter()
    assert list(s) == ["e", "ngram-map-k", "a", "b"]
    assert s["ngram-map-k"] == {"verifications": 1, "drafted": 2, "accepted": 1, "skipped": 0, "acceptance_rate": 0.5}
    assert s["a"]["verifications"] == 1 and s["a"]["drafted"] == 2 and s["a"]["accepted"] == 2
    assert s["b"]["verifications"] == 0
    assert chain.name == "e,ngram-map-k,a,b" and chain.vocab_size == 0
    chain2 = ChainDrafter([empty, _Fixed("e", [])])
    assert len(chain2.draft(h, 4, 0.0)) == 0 and chain2.winner is None
    assert chain2.member_names() == ["e", "e#2"]


# ---- end to end on a real model -----------------------------------------------------------------

REPEAT_PROMPT = (
    "Copy the following list exactly, twice.\n"
    "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu\n"
    "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu\n"
    "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu\n"
)


@pytest.fixture(scope="module")
def plain_tokens(smollm):
    from llama_spec.generation.solo import SpeculativeGenerator

    gen = SpeculativeGenerator(smollm, None, n_ctx=1024)
    try:
        return gen.generate(REPEAT_PROMPT, sampling=GREEDY, n_predict=64).tokens
    finally:
        gen.close()


def _greedy_run(model, drafter, n_max=8):
    from llama_spec.generation.solo import SpeculativeGenerator

    gen = SpeculativeGenerator(model, drafter, n_ctx=1024, n_max=n_max)
    try:
        return gen.generate(REPEAT_PROMPT, sampling=GREEDY, n_predict=64)
    finally:
        gen.close()


@pytest.mark.parametrize("make", [
    lambda: NgramSimpleDrafter(3, 8),
    lambda: NgramMapDrafter(3, 8),
    lambda: NgramModDrafter(4, 8, 2),
    lambda: NgramSimpleDrafter(),               # llama.cpp's defaults (n 12, m 48)
], ids=["simple", "map-k", "mod", "simple-defaults"])
def test_greedy_equals_plain_decoding(smollm, plain_tokens, make):
    res = _greedy_run(smollm, make())
    assert res.tokens == plain_tokens
    assert res.stats.drafted > 0 and res.stats.accepted > 0


def test_greedy_chain_equals_plain_decoding(smollm, plain_tokens):
    # ngram-mod,ngram-simple,draft-simple: draft-simple sits out the n-gram rounds and must
    # re-sync its own KV from the history when its turn comes
    from llama_spec.drafters.draft_model import DraftModelDrafter

    chain = ChainDrafter([NgramModDrafter(8, 8, 4), NgramSimpleDrafter(3, 8), DraftModelDrafter(smollm, n_ctx=1024)])
    res = _greedy_run(smollm, chain)
    assert res.tokens == plain_tokens and res.stats.accepted > 0
    s = chain.stats_by_drafter()
    assert s["draft-simple"]["verifications"] > 0
    assert s["ngram-mod"]["verifications"] + s["ngram-simple"]["verifications"] > 0
    assert sum(v["drafted"] for v in s.values()) == res.stats.drafted
    assert sum(v["accepted"] for v in s.values()) == res.stats.accepted


class _FirstN(Drafter):
    """Proposes [its token] for its first `n` drafts, then nothing (a stand-in n-gram drafter)."""

    def __init__(self, n, token):
        self.name, self.n, self.token = "first-n", n, token

    def draft(self, history, n_max, p_min):
        self.n -= 1
        return Proposal(tokens=[self.token] if self.n >= 0 else [], q_ids=None, q_probs=None)


def test_chain_draft_simple_member_decodes_nothing_while_another_member_wins(smollm, plain_tokens):
    # The chain turns its draft-simple member's observe off: while the first member wins, the draft
    # context holds nothing new; at its first turn its lazy sync catches up on the whole history
    # in one prefill, and the output is still plain decoding's (drafts change speed only).
    from llama_spec.drafters.draft_model import DraftModelDrafter

    ds = DraftModelDrafter(smollm, n_ctx=1024)
    calls = []
    real_prefill = ds.ctx.prefill
    ds.ctx.prefill = lambda toks, *a, **k: (calls.append(len(toks)), real_prefill(toks, *a, **k))[1]
    chain = ChainDrafter([_FirstN(6, plain_tokens[0]), ds])
    assert ds.observe_batches is False
    res = _greedy_run(smollm, chain)
    assert res.tokens == plain_tokens
    s = chain.stats_by_drafter()
    assert s["first-n"]["verifications"] == 6 and s["draft-simple"]["verifications"] > 0
    # the first prefill is the catch-up: the prompt plus the 6 n-gram rounds' tokens, in one call
    assert calls[0] >= 7 and all(c <= 2 for c in calls[1:])
    assert ds._kv == res.prompt_tokens + res.tokens[: len(ds._kv) - len(res.prompt_tokens)]
