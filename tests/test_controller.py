"""The speculation controller (generation/controller.py, cost_model.py) on synthetic costs.

A simulated loop feeds the controller exactly what the step core measures (draft seconds,
decode seconds, post seconds, kept drafts) from known cost functions and acceptance rates, so
each decision is deterministic and its throughput can be compared with the best fixed option.
The end-to-end tests with models are in tests/test_controller_loop.py.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from llama_spec.drafters.base import Drafter, Proposal
from llama_spec.generation import controller
from llama_spec.generation.controller import RequestView, SpecController, band_of, make_controller
from llama_spec.generation.cost_model import CostModel
from llama_spec.generation.plan_driver import run_plan


def simulate(ctl, steps, *, cost, accept, draft_s=None, k_cap=5, n_seqs=1, seed=0, costly=None,
             names=None, propose=None, gap_s=0.0, modes=None, argmax_band=None, together=(), need=None,
             begin=False):
    """`steps` steps of one sequence (priced as one of n_seqs alike). cost(N): seconds of a decode
    of N rows; accept[name]: keep probability per draft; draft_s[name]: seconds per drafted token;
    propose[name]: the probability the member has a draft at all (cheap members); gap_s: seconds a
    costly member's lazy sync takes per token it missed beyond one. Returns (tokens,
    seconds, choices) with choices[i] = (member name or None, k). modes / argmax_band: the costly
    members with the argmax draft mode and its band (accept["d argmax"]: its keep probability).
    together: members whose drafts are copies, kept or lost together (all k with accept[name], else none).
    need: the plan's sync_need (None: the controller estimates the sync from the steps missed).
    begin: the steps are a new request (``begin_request``: its own survival)."""
    rng = np.random.default_rng(seed)
    names = names or ["d"]
    costly = costly if costly is not None else [True] * len(names)
    draft_s = draft_s or {}
    propose = propose or {}
    ctl.attach(0, names, costly, modes)
    if begin:
        ctl.begin_request(0)
    band = "token/t<1" if argmax_band else "greedy"
    tokens, seconds, choices, hist, last = 0, 0.0, [], 100, {}
    for _ in range(steps):
        plan = ctl.plan(0, k_cap, RequestView(band, argmax_band=argmax_band), n_seqs, hist, need)
        held, t_draft = 0, 0.0
        while (ask := plan.next_ask()) is not None:
            m, cap = ask
            name = names[m]
            n = cap if rng.random() < propose.get(name, 1.0) else 0
            dt = draft_s.get(name, 0.0) * (n + 1 if costly[m] else 1)
            if costly[m]:
                dt += gap_s * max(hist - last.get(m, hist) - 1, 0)
                last[m] = hist
            t_draft += dt
            plan.drafted(m, n, dt)
            held = n
        k = plan.finish(held)
        rows = n_seqs * (k + 1)
        t = cost(rows)
        ctl.decoded(rows, n_seqs, t)
        kept = 0
        who = plan.member_name
        if who in together:
            kept = k if k and rng.random() < accept[who] else 0
        while who not in together and kept < k and rng.random() < accept.get(who, 0.0):
            kept += 1
        ctl.verified(0, kept, k + 1, 0.0)
        tokens += kept + 1
        seconds += t / n_seqs + t_draft
        choices.append((who, k))
        hist += kept + 1
    return tokens, seconds, choices


def line(a, b):
    return lambda n: a + b * n


def test_a_costly_drafter_whose_drafts_are_rarely_kept_loses_to_plain():
    ctl = SpecController()
    cost = line(0.030, 0.006)
    tok, sec, ch = simulate(ctl, 600, cost=cost, accept={"d": 0.1}, draft_s={"d": 0.018})
    late = ch[200:]
    assert sum(w is None for w, _ in late) / len(late) > 0.93
    plain_rate = 1 / cost(1)
    assert tok / sec > 0.95 * plain_rate    # exploration and the cold start cost < 5 %


def test_cheap_well_accepted_drafts_are_verified_at_a_sensible_length():
    ctl = SpecController()
    cost = line(0.030, 0.004)      # n = 6 costs 1.6x n = 1: long drafts pay at 90 % kept
    tok, sec, ch = simulate(ctl, 400, cost=cost, accept={"d": 0.9}, costly=[False], k_cap=8)
    late = [k for _, k in ch[100:]]
    assert np.median(late) >= 5
    assert tok / sec > 2.0 / cost(1)


@pytest.mark.parametrize("ramp", [True, False])
def test_a_long_copy_kept_whole_is_soon_verified_whole(ramp):
    # An edit prompt's n-gram draft: a 40-token copy of the prompt, kept whole 95 % of the time
    # (else lost at once), a verification cost like the 1.5B's on 2 cores (c(1) 63 ms, c(5) 184 ms),
    # the cost model known from earlier requests. Per position the survival beyond a cut is never
    # seen, so without the ramp (the broken variant, which must fail) the cut grows by one every
    # other step (1 1 2 2 3 3 ..: a 96-token request ends first); with it 1 2 3 4 8 16 32 40.
    cost = line(0.033, 0.030)
    ctl = SpecController(ramp=ramp)
    for n in (1, 6, 1, 6):
        ctl.decoded(n, 1, cost(n))
    tok, sec, ch = simulate(ctl, 20, cost=cost, accept={"c": 0.95}, costly=[False], names=["c"], k_cap=40,
                            together={"c"}, seed=0)
    cuts = [k for _, k in ch]
    assert (max(cuts[:8]) >= 32) == ramp, cuts   # (without the copies check: at step 12)
    if ramp:
        assert tok / sec >= 0.9 * (1 + 0.95 * 40) / cost(41)   # the best fixed option: verify it whole


def test_the_ramp_costs_little_where_drafts_are_lost_one_by_one():
    # Memoryless drafts (each kept with 0.85, as the survival model assumes): the model's cut is
    # the best there, so a ramp after a full verification only loses; it must lose < 3 % (1.7 %
    # measured; a ramp straight to 2 k without RAMP_KEEP's check lost 10 % at 0.7).
    cost = line(0.033, 0.030)
    rates = []
    for ramp in (True, False):
        r = [np.divide(*simulate(SpecController(ramp=ramp), 300, cost=cost, accept={"c": 0.85}, costly=[False],
                                 names=["c"], k_cap=40, seed=s)[:2]) for s in range(4)]
        rates.append(np.mean(r))
    assert rates[0] >= 0.97 * rates[1], rates


@pytest.mark.parametrize("margin", [True, False])
@pytest.mark.parametrize("gain, used", [(0.04, False), (0.15, True)])
def test_a_costly_drafter_is_used_only_where_it_pays_by_more_than_the_margin(gain, used, margin, monkeypatch):
    # A draft model whose fixed k = 3 is `gain` faster than plain, its costs and acceptance well
    # measured (as after many requests): a toss-up (2 %) decodes plainly (PLAIN_MARGIN 5 %), a
    # clear gain (15 %) speculates. Without the margin (the broken variant) the 2 % one speculates.
    if not margin:
        monkeypatch.setattr(controller, "PLAIN_MARGIN", 0.0)
    cost, acc, k = line(0.030, 0.010), 0.9, 3
    e = 1 + sum(acc ** i for i in range(1, k + 1))
    d = (e / ((1 + gain) / cost(1)) - cost(k + 1)) / (k + 1)    # seconds per drafted token for that gain
    ctl = SpecController()
    pattern = [0] * 10 + [1] * 9 + [2] * 8 + [3] * 73      # kept counts of 100 verifications at 0.9 exactly
    np.random.default_rng(1).shuffle(pattern)
    for kept in pattern * 3:
        for full in (False, True):
            ctl.accept.record_verify(("d", "greedy", full), k, kept)
        for n in (1, k + 1):
            ctl.decoded(n, 1, cost(n))
        ctl.cost.record_draft("d", k, 1, d * (k + 1))
    _, _, ch = simulate(ctl, 300, cost=cost, accept={"d": acc}, draft_s={"d": d}, k_cap=k)
    drafted = sum(w == "d" for w, _ in ch[100:]) / 200
    assert (drafted > 0.6) if used or not margin else (drafted < 0.2), drafted


def test_a_costly_drafter_that_pays_is_used_and_its_length_is_the_best_fixed_one():
    ctl = SpecController()
    cost = line(0.030, 0.004)
    acc, d = 0.8, 0.003            # a cheap draft model: 0.1 of a target step per token
    _, _, ch = simulate(ctl, 500, cost=cost, accept={"d": acc}, draft_s={"d": d}, k_cap=6)
    late = ch[200:]
    assert sum(w == "d" for w, _ in late) / len(late) > 0.9

    def fixed_rate(k):
        e = 1 + sum(acc ** i for i in range(1, k + 1))
        return e / (cost(k + 1) + d * (k + 1))
    best = max(range(1, 7), key=fixed_rate)
    ks = [k for w, k in late if w == "d"]
    assert abs(float(np.median(ks)) - best) <= 1, (best, np.bincount(ks))


def test_in_a_batch_the_price_is_b_times_k_plus_1_rows_against_b_plain_rows():
    cost = line(0.020, 0.010)     # steep in rows: a batch of 8 pays for every extra row
    solo, batch = SpecController(), SpecController()
    _, _, ch1 = simulate(solo, 400, cost=cost, accept={"d": 0.5}, costly=[False], k_cap=4, n_seqs=1)
    _, _, ch8 = simulate(batch, 400, cost=cost, accept={"d": 0.5}, costly=[False], k_cap=4, n_seqs=8)
    k1 = [k for _, k in ch1[150:]]
    k8 = [k for _, k in ch8[150:]]
    # B = 1: k = 1 (1.5 / 0.04 = 37.5 t/s) beats plain (33); B = 8: plain (80) beats k = 1 (67)
    assert np.bincount(k1, minlength=5)[1] / len(k1) > 0.8
    assert np.bincount(k8, minlength=5)[0] / len(k8) > 0.8


def test_exploration_of_a_loser_is_rare_rarer_the_clearer_it_loses_and_within_its_budget():
    cost = line(0.03, 0.006)

    def run(d_s, gap_s):
        ctl = SpecController()
        tok, sec, ch = simulate(ctl, 3000, cost=cost, accept={"d": 0.3}, draft_s={"d": d_s}, gap_s=gap_s)
        late = [w for w, _ in ch[300:]]
        return late.count("d") / len(late), tok / sec * cost(1)
    (mild, mild_rate), (clear, clear_rate) = run(0.004, 0.0), run(0.05, 0.0)
    assert 0 < mild < 0.1 and clear < mild, (mild, clear)   # a near-tie: tried every ~16 steps
    assert mild_rate > 0.97 and clear_rate > 0.97, (mild_rate, clear_rate)
    # a lazy sync of the missed tokens is part of the price of trying: a drafter that must
    # re-read a long stretch is tried rarely, and the time lost stays small
    synced, synced_rate = run(0.004, 0.002)
    assert synced <= mild and synced_rate > 0.97, (synced, synced_rate)


@pytest.mark.parametrize(("shared", "seed"), [(True, 0), (True, 1), (False, 0)])
def test_the_exploration_budget_is_the_slots_not_each_arms(shared, seed, monkeypatch):
    """Two draft modes of one losing model are two arms to explore; together they cost about
    explore_budget (1 %; 1.0-1.2 % measured over seeds 0-2) of the time, not 1 % each (a C = 1 server
    request lost ~4 % at 2 % each; session 13).
    Broken variant (shared=False): each arm gets the whole budget, and the test sees it fail.
    Seed 1 lost 4.9 % when a try was cut by the survival keyed by the last verification: the cut
    dropped the try's draft and the arm, never run, was drafted again every 16 steps."""
    if not shared:
        monkeypatch.setattr(controller.Plan, "explore_share", lambda self, n_arms: self.ctl.explore_budget)
    cost = line(0.070, 0.035)   # a decode of N rows: 70 ms + 35 ms per row

    def lost(modes):
        ctl = SpecController()
        tok, sec, ch = simulate(ctl, 6000, cost=cost, accept={"d": 0.3, "d argmax": 0.3},
                                draft_s={"d": 0.03}, modes=modes, need=lambda m: 1, seed=seed,
                                argmax_band="exact-match/t<1" if modes[0] else None)
        assert sum(w is None for w, _ in ch[500:]) / len(ch[500:]) > 0.9   # plain is chosen
        return 1.0 - tok / sec * cost(1)
    one, two = lost([False]), lost([True])
    assert 0.0 < one < 0.015, one
    if shared:
        assert two < 0.015 and two < 1.4 * one, (one, two)
    else:
        assert two > 1.6 * one, (one, two)


def test_chain_asks_the_cheap_member_first_and_the_model_only_where_it_pays():
    ctl = SpecController()
    cost = line(0.030, 0.004)
    # ngram proposes 50 % of the time (kept 90 %); the model costs a lot and is kept 30 %
    _, _, ch = simulate(ctl, 800, cost=cost, names=["ngram", "model"], costly=[False, True],
                        accept={"ngram": 0.9, "model": 0.3}, draft_s={"model": 0.02}, propose={"ngram": 0.5})
    late = ch[300:]
    who = [w for w, _ in late]
    assert who.count("ngram") / len(late) > 0.4
    assert who.count("model") / len(late) < 0.08    # explored only
    assert who.count(None) / len(late) > 0.4        # the rest is plain, not the costly model


def test_sweep_tries_every_option_in_turn():
    ctl = SpecController(sweep=[(None, 0), (0, 1), (0, 3)])
    _, _, ch = simulate(ctl, 6, cost=line(0.03, 0.004), accept={"d": 1.0}, draft_s={"d": 0.001})
    assert ch == [(None, 0), ("d", 1), ("d", 3)] * 2


class Recorder(Drafter):
    """Two members; records what the controller tells it."""

    def __init__(self, n_cheap: int) -> None:
        self.n_cheap, self.calls, self.cuts = n_cheap, [], []

    def members(self):
        return (self, self)

    def member_names(self):
        return ["cheap", "model"]

    def draft_member(self, i, history, n_max, p_min):
        self.calls.append((i, n_max))
        n = self.n_cheap if i == 0 else n_max
        return Proposal(tokens=[5] * n, q_ids=None, q_probs=None)

    def truncated(self, k):
        self.cuts.append(k)


def test_run_plan_drops_a_cheap_draft_for_the_model_and_reports_cuts():
    ctl = SpecController(min_turns=1)
    ctl.attach(0, ["cheap", "model"], [False, True])
    d = Recorder(n_cheap=2)
    # cold start: the model must be tried (min_turns), so the cheap draft is dropped (truncated(0))
    prop = run_plan(ctl.plan(0, 4, "greedy", 1, 10), d, [1, 2, 3], 0.0)
    assert d.calls == [(0, 4), (1, 4)] and d.cuts == [0] and len(prop) == 4


def test_cost_model_cells_blend_with_the_line_and_stay_monotone():
    m = CostModel(decay=1.0)
    assert np.isnan(m.verify_cost(np.array([1, 2]), 1)).all()
    for _ in range(10):
        m.record_decode(1, 1, 0.030)
        m.record_decode(4, 1, 0.050)
    c = m.verify_cost(np.arange(1, 9), 1)
    assert c[0] == pytest.approx(0.030, rel=1e-3) and c[3] == pytest.approx(0.050, rel=1e-3)
    assert (np.diff(c) >= 0).all()
    assert c[7] == pytest.approx(0.030 + (0.020 / 3) * 7, rel=1e-3)     # the line beyond the cells
    m.record_draft("d", 3, 1, 0.04)
    m.record_draft("d", 1, 1, 0.02)
    assert m.draft_cost("d", np.array([1, 3])) == pytest.approx([0.02, 0.04], rel=0.05)


# c(N) of 1.5B on 2 AVX2 EPYC cores, ms (scripts/bench_verify_cost.py, 2026-12-04): concave past N 8
MEASURED_C = {1: 51.2, 2: 84.6, 3: 113.2, 4: 134.2, 6: 188.3, 8: 299.1, 12: 371.9, 16: 386.1, 24: 603.5,
              32: 698.7, 48: 1018.1, 64: 1247.5}


def test_cost_model_between_cells_interpolates_and_beyond_them_follows_the_local_slope():
    m = CostModel(decay=0.98)
    for _ in range(10):   # as the controller sees it: mostly plain steps, drafts up to 24 rows
        for _ in range(10):
            m.record_decode(1, 1, MEASURED_C[1] / 1e3)
        for n in (2, 3, 4, 6, 8, 12, 16, 24):
            m.record_decode(n, 1, MEASURED_C[n] / 1e3)
    c = 1e3 * m.verify_cost(np.arange(1, 65), 1)
    for n in (32, 48, 64):   # beyond the cells: within 13 % (the line fitted to all: > 15 % high)
        assert c[n - 1] == pytest.approx(MEASURED_C[n], rel=0.13), (n, c[n - 1])
        line = m.verify_line.coef()
        assert 1e3 * (line[0] + line[1] * n + line[2]) > 1.15 * MEASURED_C[n]
    assert c[9] == pytest.approx((MEASURED_C[8] + MEASURED_C[12]) / 2, rel=0.05)   # between two cells
    # two noisy cells close together at the top cannot make long drafts look free
    m2 = CostModel(decay=1.0)
    for _ in range(5):
        m2.record_decode(1, 1, 0.030)
        m2.record_decode(8, 1, 0.100)
        m2.record_decode(9, 1, 0.098)
    slope = m2.verify_line.coef()[1]
    tail = m2.verify_cost(np.array([9, 30]), 1)
    assert (tail[1] - tail[0]) / 21 >= 0.5 * slope > 0


def test_saved_model_round_trips_as_a_light_prior(tmp_path):
    ctl = SpecController()
    simulate(ctl, 100, cost=line(0.03, 0.004), accept={"d": 0.7}, draft_s={"d": 0.003})
    path = tmp_path / "cost.json"
    ctl.save(path)
    json.loads(path.read_text())
    again = SpecController(cost_model=path)
    again.attach(0, ["d"], [True])
    np.testing.assert_allclose(again.step_cost(3, 1), ctl.step_cost(3, 1), rtol=0.05)
    assert again.survival("d", "greedy", False, 2)[0] == pytest.approx(ctl.survival("d", "greedy", False, 2)[0],
                                                                       abs=0.1)
    with pytest.raises(ValueError, match="tune"):
        SpecController(cost_model={"x": 1})


def test_a_slot_pays_no_cold_turns_for_what_another_slot_measured():
    # Slot 0 learns that the draft model loses to plain; slot 1 (same controller, as in a server)
    # then decodes plainly from its first step, without the cold turns slot 0 paid at full length.
    ctl = SpecController()
    cost = line(0.030, 0.006)
    simulate(ctl, 200, cost=cost, accept={"d": 0.1}, draft_s={"d": 0.018})
    ctl.attach(1, ["d"], [True])
    first = []
    for _ in range(5):
        plan = ctl.plan(1, 5, "greedy", 1, 100)
        ask = plan.next_ask()
        first.append(ask)
        if ask is not None:
            plan.drafted(ask[0], ask[1], 0.018 * (ask[1] + 1))
        k = plan.finish(ask[1] if ask else 0)
        ctl.decoded(k + 1, 1, cost(k + 1))
        ctl.verified(1, 0, k + 1, 0.0)
    assert first == [None] * 5, first


def test_switches_and_bands(monkeypatch):
    monkeypatch.delenv("LLAMA_SPEC_AUTO", raising=False)
    assert make_controller(None) is not None and make_controller(False) is None
    monkeypatch.setenv("LLAMA_SPEC_AUTO", "0")
    assert make_controller(None) is None and make_controller(True) is not None
    with pytest.raises(ValueError, match="auto=False"):
        make_controller(False, {"cost": {}})
    assert band_of(True, 0.8, "token") == "greedy"
    assert band_of(False, 0.8, "token") != band_of(False, 0.2, "token") != band_of(False, 0.2, "exact-match")


def run_requests(ctl, n_requests, *, n_predict, prompt_len, cost, accept, d_tok, sync_tok, tell_need):
    """Requests of n_predict tokens, each on a new prompt of prompt_len tokens, one costly member
    "d" whose draft costs d_tok per drafted token plus sync_tok per token its lazy sync decodes
    (the whole prompt at its first draft of a request). tell_need: the plan is told the sync
    (Drafter.sync_need) and the request's budget; else neither. Returns each request's tokens/s."""
    rng = np.random.default_rng(0)
    ctl.attach(0, ["d"], [True])
    rates = []
    for _ in range(n_requests):
        hist, synced = prompt_len, 0       # synced: history the draft model holds (0: a new prompt)
        tokens, seconds = 0, 0.0
        while tokens < n_predict:
            need = hist - synced if synced else hist
            view = RequestView("greedy", n_predict, prompt_len=prompt_len) if tell_need else RequestView("greedy")
            k_cap = min(4, n_predict - tokens - 1)
            if k_cap <= 0:   # the last token: the core plans no draft
                tokens, seconds, hist = tokens + 1, seconds + cost(1), hist + 1
                continue
            plan = ctl.plan(0, k_cap, view, 1, hist,
                            (lambda m, need=need: need) if tell_need else None)
            held, t_draft = 0, 0.0
            while (ask := plan.next_ask()) is not None:
                t_draft = d_tok * ask[1] + sync_tok * need
                plan.drafted(ask[0], ask[1], t_draft)
                held, synced = ask[1], hist
            k = plan.finish(held)
            t = cost(k + 1)
            ctl.decoded(k + 1, 1, t)
            kept = 0
            while kept < k and rng.random() < accept:
                kept += 1
            ctl.verified(0, kept, k + 1, 0.0)
            tokens, seconds, hist = tokens + kept + 1, seconds + t + t_draft, hist + kept + 1
        rates.append(tokens / seconds)
    return np.asarray(rates)


def test_a_try_of_a_draft_model_never_costs_a_short_request_its_prompt_sync():
    # the README pair on a 2-core CPU: the draft model costs 0.59 of a target step per token and
    # syncing a 700-token prompt costs ~1.2 s, 15 % of a 128-token request; plain wins
    cost = line(0.050, 0.020)
    kw = dict(n_predict=128, prompt_len=700, cost=cost, accept=0.8, d_tok=0.042, sync_tok=0.0017)
    told = run_requests(SpecController(), 40, tell_need=True, **kw) * cost(1)
    assert told[1:].min() >= 0.97, told   # after the cold start, every request within 3 % of plain
    # broken variant: neither the sync nor the request's budget counted -> some request pays a whole
    # prompt sync for one try
    blind = run_requests(SpecController(), 40, tell_need=False, **kw) * cost(1)
    assert blind[1:].min() < 0.95, blind


def test_a_draft_model_that_pays_is_not_chosen_where_its_prompt_sync_outweighs_the_saving(monkeypatch):
    # a model 1.6x as fast as plain, a 2,000-token prompt (3.4 s of sync): 32 tokens asked save
    # ~0.85 s, so plain; 512 tokens save more, so the model, sync and all (1.39-1.45x plain)
    cost = line(0.050, 0.020)
    kw = dict(prompt_len=2000, cost=cost, accept=0.95, d_tok=0.01, sync_tok=0.0017, tell_need=True)
    short = run_requests(SpecController(), 5, n_predict=32, **kw) * cost(1)
    long = run_requests(SpecController(), 3, n_predict=512, **kw) * cost(1)
    assert short[1:].min() >= 0.97 and long[1:].min() >= 1.25, (short, long)
    # broken variant: the sync not weighed against the request's saving (chosen as if in sync)
    monkeypatch.setattr(controller.Plan, "_repays_sync", lambda self, a, best: True)
    blind = run_requests(SpecController(), 5, n_predict=32, **kw) * cost(1)
    assert blind[1:].max() < 0.6, blind   # (0.43-0.47x plain)


@pytest.mark.parametrize(("sampled", "argmax"), [(0.75, 0.5), (0.5, 0.75)])
def test_the_draft_mode_that_keeps_more_is_chosen(sampled, argmax):
    """Item 3: a model member's sampled and argmax drafts are two arms with their own survival;
    the one kept more is used (#27694: argmax wins at low temperatures, sampled at high)."""
    def run(fixed=None):
        ctl = SpecController()
        acc = {"d": sampled, "d argmax": argmax}
        if fixed is not None:   # one mode only: the member without the other
            acc = {"d": acc[fixed]}
        return simulate(ctl, 800, cost=line(0.030, 0.006), accept=acc, draft_s={"d": 0.004},
                        modes=[fixed is None], argmax_band="exact-match/t<1" if fixed is None else None)
    tok, sec, ch = run()
    late = [w for w, _ in ch[300:]]
    better = "d" if sampled > argmax else "d argmax"
    assert late.count(better) / len(late) > 0.8, (better, {w: late.count(w) for w in set(late)})
    best = max(t / s for t, s, _ in (run("d"), run("d argmax")))
    assert tok / sec > 0.95 * best


def test_argmax_drafts_are_asked_for_in_the_argmax_arm_only():
    ctl = SpecController()
    ctl.attach(0, ["ngram", "d"], [False, True], [False, True])
    modes = set()
    for i in range(60):
        plan = ctl.plan(0, 3, RequestView("token/t<1", argmax_band="exact-match/t<1"), 1, 100 + i)
        while (ask := plan.next_ask()) is not None:
            m, cap = ask
            if m == 0:
                assert plan.sample_for(0)      # the n-gram member has one mode
            else:
                modes.add(plan.sample_for(1))
                assert plan.sample_for(1) == (plan.arm_drafting(1) == 1)
            plan.drafted(m, cap if m == 1 else 0, 0.004 * (cap + 1) if m == 1 else 0.0)
        k = plan.finish(plan.n_held)
        ctl.decoded(k + 1, 1, 0.03 + 0.006 * (k + 1))
        ctl.verified(0, k, k + 1, 0.0)
    assert modes == {True, False}       # both modes were tried (cold turns)
    plan = ctl.plan(0, 3, "greedy", 1, 200)   # greedy: no argmax arm, the configured mode
    assert plan.arms() == [1, -1] and plan.sample_for(1)


def _copy_run(shadow: bool, n_tokens: int = 96) -> tuple[float, list[int]]:
    """An edit prompt's copy seen from a plain stretch: the cheap member proposes the rest of a
    copy that plain decoding goes on emitting (every draft right), while its survival where the
    last verification did not keep everything says drafts are lost at once. Returns (seconds, cuts)."""
    cost = line(0.033, 0.030)
    ctl = SpecController()
    for n in (1, 6, 1, 6):
        ctl.decoded(n, 1, cost(n))
    ctl.attach(0, ["c"], [False])
    for _ in range(30):   # earlier requests: after a plain step or a loss, drafts lost at once
        ctl.accept.record_verify(("c", "greedy", False), 2, 0)
        ctl.accept.record_verify(("c", "greedy", True), 8, 8)
    pos, seconds, cuts = 0, 0.0, []
    while pos < n_tokens:
        plan = ctl.plan(0, 64, RequestView("greedy", n_tokens), 1, 100 + pos)
        m, cap = plan.next_ask()
        n = min(cap, n_tokens - pos - 1)
        plan.drafted(m, n, 0.0)
        k = plan.finish(n)
        if k < n:
            plan.dropped = 1000 + pos + k   # token ids of the copy: 1000 + its position (plan_driver.keep)
        ctl.decoded(k + 1, 1, cost(k + 1))
        ctl.verified(0, k, k + 1, 0.0, 1000 + pos + k if shadow else None)
        pos, seconds = pos + k + 1, seconds + cost(k + 1)
        cuts.append(k)
    return seconds, cuts


def test_a_copy_plain_decoding_goes_on_with_is_seen_and_verified_long():
    # The shadow check: a cheap draft cut to nothing is compared with the token the plain step
    # emitted; a match is a verification that kept everything. Without it (the broken variant:
    # emitted unknown) the copy is decoded plainly to its end (session 18, an edit prompt at
    # temp 0: 15 plain steps with a 44-token copy in hand; auto 17.6 t/s against 27.3 verifying it).
    sec, cuts = _copy_run(True)
    sec_off, cuts_off = _copy_run(False)
    assert cuts[0] == 0 and max(cuts[1:4]) >= 8, cuts
    assert sum(k == 0 for k in cuts) <= 2, cuts
    assert sum(k == 0 for k in cuts_off) >= 40, cuts_off
    assert sec < 0.55 * sec_off   # (verifying the copy whole: 0.49)


@pytest.mark.parametrize("band, costly, recorded", [("greedy", True, True), ("token/t<1", False, True),
                                                     ("token/t<1", True, False), ("block/t<1", False, False)])
def test_the_shadow_check_records_survival_only_where_it_is_the_rules(band, costly, recorded):
    # A plain step emits d with p(d): the keep probability of an n-gram's draft d (no q) under the
    # token rule and of any draft under exact-match; not of a model's sampled draft under the token
    # rule (min(1, p/q)) nor under a block rule. The slot's "full" state follows the match anyway.
    for emitted, match in ((7, True), (8, False)):
        ctl = SpecController()
        for n in (1, 6, 1, 6):
            ctl.decoded(n, 1, 0.03 + 0.01 * n)
        ctl.attach(0, ["c"], [costly])
        plan = ctl.plan(0, 4, RequestView(band), 1, 100)
        plan.member, plan.held_arm, plan.n_held, plan.sunk = 0, 0, 3, 0.0   # a 3-token draft in hand ...
        k = plan.finish(0)          # ... cut to nothing
        assert k == 0
        plan.dropped = 7            # (as plan_driver.keep records it)
        before = ctl.accept.count([("c", band, False)])
        ctl.verified(0, 0, 1, 0.0, emitted)
        after = ctl.accept.count([("c", band, False)])
        assert (after - before == 1.0) == recorded
        if recorded:
            assert ctl.survival("c", band, False, 1)[0] > 0.5 if match else ctl.survival("c", band, False, 1)[0] < 0.5
        assert ctl.slots[0].last_full == match


def _after_a_good_request(acc: float, begin: bool, *, prior: float | None = None, first: float = 0.9,
                          cost=None, draft_s: float = 0.004, steps: int = 60, seeds: int = 3) -> float:
    """Tokens/s of 3 requests of `steps` steps at keep probability `acc`, each after a 300-step
    request where the draft model kept `first` (`seeds` seeds); begin: each request starts its own
    survival (from the shared counts capped at `prior` verifications; None: the default)."""
    cost, rates = cost or line(0.030, 0.010), []
    for seed in range(seeds):
        ctl = SpecController() if prior is None else SpecController(request_prior=prior)
        simulate(ctl, 300, cost=cost, accept={"d": first}, draft_s={"d": draft_s}, begin=begin, seed=seed)
        for r in range(3):
            tok, sec, _ = simulate(ctl, steps, cost=cost, accept={"d": acc}, draft_s={"d": draft_s}, begin=begin,
                                   seed=10 + 3 * seed + r)
            rates.append(tok / sec)
    return float(np.mean(rates))


def test_a_request_where_the_draft_model_loses_turns_to_plain_despite_the_requests_before():
    # The bench_auto prose prompt after the code prompt (Intel Xeon, 2 cores): the draft model kept
    # 86 % on code, far less on prose, and the shared survival took 7 losing steps to turn. Each
    # request's survival starts from the shared counts capped at REQUEST_PRIOR verifications; the
    # broken variant (no begin_request: the shared counts alone) runs 0.82x plain (25 t/s) here; with it 0.972x.
    plain = 1 / line(0.030, 0.010)(1)
    assert _after_a_good_request(0.3, True) > 0.95 * plain
    assert _after_a_good_request(0.3, False) < 0.86 * plain
    # where the next requests are like the first, starting afresh costs nothing measurable (0.994x)
    assert _after_a_good_request(0.9, True) > 0.98 * _after_a_good_request(0.9, False)


def _intel(rows: int) -> float:
    """c(n) of the 1.5B on the Intel Xeon VM (2 cores, 2026-12-06): 77 ms, then 146 ms for 2-4 rows."""
    return 0.077 if rows <= 1 else 0.146 + 0.035 * max(rows - 4, 0)


def test_one_losing_verification_turns_a_request_to_plain_where_the_draft_model_barely_pays():
    # The regime of the Intel Xeon (a 0.5B draft at 20 ms/token against those costs): the model
    # pays only where nearly every draft is kept, so a prose request after a code request (0.95
    # kept) must turn to plain after its first losing verification. The request's prior of one
    # verification (REQUEST_PRIOR) runs it at 0.975x plain; the broken variant (4, the earlier
    # default: 3-6 losing steps per request on the VM) 0.955x. A request like the code one loses
    # 1 % of its gain with the prior of one (1.148x against 1.161x plain).
    kw = dict(first=0.95, cost=_intel, draft_s=0.020, steps=96, seeds=8)
    plain = 1 / _intel(1)
    assert _after_a_good_request(0.5, True, **kw) > 0.97 * plain
    assert _after_a_good_request(0.5, True, prior=4.0, **kw) < 0.96 * plain
    assert _after_a_good_request(0.95, True, **kw) > 1.13 * plain
