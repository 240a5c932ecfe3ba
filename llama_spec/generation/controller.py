"""The speculation controller: per sequence, before each draft, plain decoding or which drafter and
how many drafts, by predicted tokens per second (``auto=True``, ``--spec-auto``).

Words (docs/design.md's, and these):

- **member**: one drafter the controller can ask, by index: a chain's members, or the drafter
  itself. A **cheap** member (not ``Drafter.costly``: an n-gram lookup) is always asked first, as
  its draft costs about nothing; a **costly** one (a model) only when asking it is predicted to pay.
- **option**: plain decoding (k = 0, no draft), or member m with k = 1 .. k_cap drafts.
- **band**: the acceptance regime of a request: "greedy", or the rule and a temperature band.
- **draft mode** of a model member (``Drafter.draft_modes``) in a sampled request whose rule uses
  q: **sampled** drafts (drawn from q, verified by the request's rule: keep ~ sum min(p, q)) or
  **argmax** drafts (no q, the exact-match rule: keep ~ p(argmax q)), two arms of the member with
  their own survival (band "exact-match/t.."); llama.cpp #27694: argmax wins at temp 0.1-0.3,
  sampled at 0.8-1.0. Which one pays is measured, like any other choice.
- **arm**: plain, or a costly member in one draft mode (``arm_of``); exploration is per arm.
- per option, with B the running sequences, S_m the survival of m's drafts (draft_length.py,
  keyed by member, band and "the last verification kept every draft"), c, r, D the cost model's
  verification, post and draft costs (cost_model.py):

      E(k) = 1 + S_m(1) + .. + S_m(k)          expected tokens of the verification
      T(k) = c(B (k + 1), B) / B + r(k + 1) + D_m(k)   its seconds, this sequence's share
      rate = E(k) / T(k);  plain: 1 / (c(B, B) / B + r(1))

  In a batch every sequence is charged a 1/B share of a decode of B x (k + 1) rows against a
  share of B plain rows (SmartSpec's goodput; exact when the sequences choose alike).
- After drafting (the draft's cost is then spent), the proposal is cut to its best prefix
  k in 0 .. len (0 = plain after all) by the same rate with D the seconds the draft took.

Survival per request: a request starts from the shared counts capped at ``request_prior``
(``REQUEST_PRIOR``, 1) verification per key (``begin_request``), so its own verifications soon
outweigh what earlier requests saw (the shared counts go on for reports, other slots and the next
requests). Why: a draft model kept 86 % on a code prompt and far less on the prose prompt after
it, and the shared counts (decay 0.98) took 7 of its losing steps to turn: 0.76-0.89x plain on the
first prose run. Why one: where the model barely pays (the 0.5B on 2 Intel cores: only at ~90 %
kept), a prior of 4 still drafted 3-6 losing steps per prose request (0.95x plain); the shared
counts hardly learn from such requests (a request that turns to plain verifies little), so every
request must learn it again, from its own first verification.

Survival across bands (``borrow_bands``): a band new to a member starts from its other bands, so
it has no cold turns there (bands.py says why).

A costly arm is chosen over plain only when predicted ``PLAIN_MARGIN`` (5 %) faster: its
estimate is an average over drafts lost and kept, plain's is certain, and at a toss-up the model's
errors decide (at temp 0.8 on 2 cores, argmax drafts of the 0.5B predicted ~4 % faster than plain
ran 0.88x plain; session 12).

Sync: a model member that must first sync many tokens (a new request's whole prompt) is chosen
over plain only when its predicted saving over plain in the tokens the request has left covers
that sync (``Plan._repays_sync``): a long prompt with a short answer is decoded plainly.

Exploration: each costly member and plain get up to ``min_turns`` turns first (costly members
first, at the full length) until the shared cost model knows them: a draft cost and one verified
turn (``_measured``; the first turn may only warm the draft-cost fit, so with ``min_turns`` 2 that
is one verified turn; in any band), or another slot or a saved model measured them (a server's 8
slots paid the cold turns 8 times over). Then the best option is chosen, and a losing one is tried once (so it
stays measured) when the time since it last ran, times its share of ``explore_budget``, covers
what trying it is predicted to lose: its seconds minus its tokens at the best rate, plus the lazy
sync of the tokens it missed (``Drafter.sync_need``: a draft model in a new request syncs the
whole prompt); and that sync alone must fit in the share of the request's own predicted time
(n_predict plain steps). Each of the n arms not chosen gets explore_budget / n
(``explore_share``), so at most about ``explore_budget`` of the time goes to exploring, in all and
in each request, and the clearer the loser the rarer it is tried; a try verifies the length it was
chosen at (it is for measuring). (The chain gate's rule, every ``16 x (rate ratio)^2`` steps,
cost 18 % here.) Lengths are explored the same way: k_best + 1 instead of k_best. Two tries of
one option are at least ``explore_every`` steps apart.

Ramp: after a verification that kept all of its drafts, the next cut of that arm may go longer
(draft_length.py). Trees: a request with a tree shape has one more arm, to depth d (arms.py).

Overhead: a plan runs between two decodes, with the caches cold (the model's weights streamed
through them): 0.3-0.4 ms more Python than plain per step of the 1.5B on 2 AVX2 EPYC cores (0.7 % of
50 ms; was 0.4-0.75 before the fits updated Python floats; scripts/controller_overhead.py). So the
step cost curve is re-read every ``STEP_COST_REFRESH`` measurements of c or r, up to every
``STEP_COST_REFRESH_MAX`` as the model matures (1/16 of its measurements: an old model moves little
per step), and each arm's best length only when what it is computed from changed (that curve, a
survival, a model's draft cost, the request); a young cost model (< 128 measurements) every time.
Where plain wins (1.5B on 2 cores), the 1 % ``explore_budget`` and this overhead are what the
controller costs.

Exactness: any choice is exact for every rule (a prefix of a draft is a draft from the same q, and
no draft is a verification without drafts); a decision uses only what happened before it, so the
output distribution is unchanged. Timings differ run to run, so with temp > 0 a seeded run
repeats token for token only with the controller off (``auto=False``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import numpy as np

from ..env import env_flag
from .arms import (
    PLAIN,
    TREE,
    Choice,
    SlotState,
    arm_of,
    is_argmax,
    is_tree,
    member_of,
    tree_arm,
    tree_name,
    tree_rows,
)
from .bands import RequestView, band_of, band_survival, draft_modes_band, other_bands, shadow_exact
from .controller_reports import ControllerReports
from .cost_model import CostModelSource, load_cost_model
from .draft_length import DraftLengthController

if TYPE_CHECKING:
    from ..drafters.tree import TreeProposal

__all__ = ["ENV_AUTO", "PLAIN", "TREE", "Choice", "CostModelSource", "Plan", "RequestView", "SpecController", "arm_of",
           "band_of", "draft_modes_band", "make_controller", "member_of"]

ENV_AUTO = "LLAMA_SPEC_AUTO"   # the default of auto=None (on when unset)


def make_controller(auto: bool | None, cost_model: CostModelSource = None) -> SpecController | None:
    """A generator's controller: auto None reads LLAMA_SPEC_AUTO (default on); False: none."""
    on = env_flag(ENV_AUTO, True) if auto is None else bool(auto)
    if not on:
        if cost_model is not None:
            raise ValueError("cost_model: given with auto=False (the cost model is the controller's)")
        return None
    return SpecController(cost_model=cost_model)


REQUEST_PRIOR = 1.0   # a request's survival starts from the shared counts capped at this many verifications
PLAIN_MARGIN = 0.05   # a costly arm is chosen over plain only when predicted this much faster
RAMP_KEEP = 0.95   # a ramped cut's predicted rate >= this x the best cut's (draft_length.py: the controller's ramp)
RAMP_KEEP_COPIES = 0.6   # ... where full verifications came CALIB_COPIES x as often as predicted
CALIB_COPIES, CALIB_DECAY = 1.25, 0.95
STEP_COST_REFRESH = 8   # c and r are re-read every 8 of their measurements (4 solo steps; docstring, Overhead)
STEP_COST_REFRESH_MAX = 64   # ... up to every 64 (32 solo steps) in an old model
_NO_ROWS = np.zeros(1, dtype=np.int64)   # a plan without a tree arm: its rows per depth


class Plan:
    """One sequence's decision for one step: ``next_ask()`` / ``drafted()`` until None, then
    ``finish()``. sync_need(m): tokens member m's next draft syncs (None: estimated)."""

    def __init__(self, ctl: SpecController, st: SlotState, k_cap: int, req: RequestView, n_seqs: int, hist_len: int,
                 sync_need: Callable[[int], int | None] | None = None, tree_cap: int = 0) -> None:
        self.ctl, self.st, self.hist_len = ctl, st, hist_len
        self.band, self.argmax_band, self.sample, self.n_predict = req.band, req.argmax_band, req.sample, req.n_predict
        self.prompt_len = req.prompt_len
        self._sync_need = sync_need
        self._needs: dict[int, int] = {}   # member -> tokens its lazy sync decodes (asked once)
        costly = [i for i, c in enumerate(st.costly) if c]
        if self.argmax_band is not None:
            costly += [arm_of(i, True) for i in costly if st.modes[i]]
        # the tree arm: the request's shape cut to tree_cap levels (rows: target rows per depth - 1)
        self.tree_shape = req.tree if req.tree and st.tree_member is not None else None
        self.tree = self.tree_shape[:max(tree_cap, 0)] if self.tree_shape else ()
        self._tree_rows = tree_rows(self.tree) if self.tree else _NO_ROWS
        self._arms = costly + ([tree_arm(st.tree_member)] if self.tree and st.tree_member is not None else []) + [PLAIN]
        self.k_cap, self.n_seqs = k_cap, max(1, n_seqs)
        self.full = st.last_full
        # T without drafting, per n_rows 1 .. : as far as a decision needs (``vs``)
        self.v = ctl.step_cost(min(k_cap, 8), self.n_seqs)
        self.member: int | None = None              # whose proposal is held
        self.held_arm = PLAIN                       # ... and in which draft mode (its arm)
        self.n_held, self.sunk, self.spent = 0, 0.0, 0.0   # drafts held, their seconds, all draft seconds
        self.explored = False
        self.k = 0
        self.predicted_full: float | None = None    # S(k) of the cut verified, as predicted
        self.dropped: int | None = None             # the first draft cut off (plan_driver.keep)
        self.dropped_arm = PLAIN                    # ... the arm of the proposal it was cut from
        self.tree_drafted: TreeProposal | None = None   # the tree arm's draft (plan_driver.run_plan)
        self._asks: list[tuple[int, int]] = []
        self._arm: tuple[int, int, float] = (PLAIN, 0, 0.0)   # pre-draft: arm, cap, its predicted rate
        self.asked_costly = False
        self._trying: int | None = None    # the losing arm explored this step, if any
        forced = ctl.sweep[st.sweep_i % len(ctl.sweep)] if ctl.sweep else None
        self._forced = forced is not None
        if forced is not None:
            st.sweep_i += 1
            if forced[0] is not None and is_tree(forced[0]) and forced[0] in self._arms and forced[1] > 0:
                self._arm = (forced[0], min(forced[1], len(self.tree)), 0.0)   # a tree of that depth
                self._asks = [(member_of(forced[0]), self._arm[1])]
            elif forced[0] is not None and 0 <= forced[0] < len(st.names) and forced[1] > 0:
                self._asks = [(forced[0], min(forced[1], k_cap))]
            return
        self._arm = self._choose_arm()
        self._asks = [(i, k_cap) for i, c in enumerate(st.costly) if not c]
        if self._arm[0] != PLAIN and not self._asks:
            self._asks = [(member_of(self._arm[0]), self._arm[1])]

    # -- before drafting ------------------------------------------------------------------------
    def arms(self) -> list[int]:
        """The costly members' arms (both draft modes where this request may choose) and PLAIN."""
        return self._arms

    def band_for(self, arm: int) -> str:
        return self.argmax_band if is_argmax(arm) and self.argmax_band is not None else self.band

    def arm_name(self, arm: int) -> str:
        """What an arm's survival and draft cost are measured under: its member's name (a tree:
        with the request's whole shape; a depth d prefix keeps S(1 .. d) and the draft line)."""
        name = self.st.names[member_of(arm)]
        return tree_name(name, self.tree_shape) if is_tree(arm) and self.tree_shape else name

    def tree_ask(self, m: int) -> bool:
        """The ask (m, cap) is the tree arm's: draft the request's tree cut to depth cap, verified whole."""
        return is_tree(self._arm[0]) and member_of(self._arm[0]) == m

    def arm_drafting(self, m: int) -> int:
        """The arm member m drafts for now: the chosen arm if it is m's, else m (sampled)."""
        a = self._arm[0]
        return a if a != PLAIN and member_of(a) == m else m

    def sample_for(self, m: int) -> bool:
        """The draft mode member m drafts in now (True: as the request configured it, else argmax)."""
        return self.sample and not is_argmax(self.arm_drafting(m))

    def _choose_arm(self) -> tuple[int, int, float]:
        """(arm, cap, predicted rate): cold turns first, then the best, explored."""
        st, ctl = self.st, self.ctl
        arms = self.arms()
        if len(arms) == 1:
            return PLAIN, 0, 0.0
        # (a tree has no cold turns: its chain's are its prior, ``options``)
        cold = [a for a in arms if not is_tree(a) and st.turns.get(a, 0) < ctl.min_turns and not self._measured(a)]
        if cold or np.isnan(self.v).any():
            a = min(cold or arms, key=lambda x: st.turns.get(x, 0))
            self.explored = True
            return a, (len(self.tree) if is_tree(a) else self.k_cap if a != PLAIN else 0), 0.0
        best = self._best(arms)
        top = max(best, key=lambda a: best[a][1])
        if top != PLAIN and (best[top][1] < (1.0 + PLAIN_MARGIN) * best[PLAIN][1] or not self._repays_sync(top, best)):
            top = PLAIN   # a toss-up (no draft to lose), or a sync the request's saving would not repay
        hi = best[top][1]
        share = self.explore_share(len(arms))
        for a in arms:
            if a == top or a not in best or st.since.get(a, 0) < ctl.explore_every:
                continue
            k, rate, e_a, t_a = best[a]
            since = st.clock - st.ran_at.get(a, 0.0)
            if t_a - e_a / hi > share * since:   # over the budget even without its sync (the usual case)
                continue
            sync = self._resync(member_of(a)) if a != PLAIN else 0.0
            loss = t_a - e_a / hi + sync
            # within the budget since it last ran; and a model's sync of a long prompt within the
            # budget of this request's own time (one try must not cost a short request that much)
            request = self.n_predict * float(self.v[0]) if self.n_predict else float("inf")
            if loss <= share * since and sync <= ctl.explore_budget * request:
                self.explored, self._trying = True, a
                return a, k, rate
        return top, best[top][0], hi

    def _best(self, arms: list[int]) -> dict[int, tuple[int, float, float, float]]:
        """arm -> (k, rate, E(k), T(k)) of its best length; reused while what it is computed from is
        unchanged: the step cost curve read, survival, costly draft costs, the request (module
        docstring, Overhead)."""
        st, ctl = self.st, self.ctl
        # each arm up to one past its longest proposal (draft-simple: its own n_max), within k_cap
        # (the request's last steps lower k_cap every step: only the lengths considered matter)
        ns = tuple(len(self.tree) if is_tree(a) else min(self.k_cap, st.longest.get(member_of(a), self.k_cap - 1) + 1)
                   for a in arms[:-1])
        key = (self.band, self.argmax_band, self.n_seqs, ns, self.tree, ctl.versions, ctl.step_cost_version(self.n_seqs))
        if st.best is not None and st.best[0] == key:
            return st.best[1]
        best: dict[int, tuple[int, float, float, float]] = {PLAIN: (0, 1.0 / self.v[0], 1.0, float(self.v[0]))}
        for a, n in zip(arms[:-1], ns, strict=True):
            o = self.options(a, n, None, pooled=True)
            if o is not None:
                e, t = o
                k = int(np.argmax(e[1:] / t[1:])) + 1
                best[a] = (k, float(e[k] / t[k]), float(e[k]), float(t[k]))
        st.best = (key, best)
        return best

    def _repays_sync(self, a: int, best: dict[int, tuple[int, float, float, float]]) -> bool:
        """Whether arm a's saving over plain in the tokens the request has left covers its sync (Sync)."""
        if self.n_predict is None or self.sync_gap(member_of(a)) <= 2:   # (1-2: drafting every step)
            return True
        left = self.n_predict - (self.hist_len - self.prompt_len if self.prompt_len is not None else 0)
        return left * (1.0 / best[PLAIN][1] - 1.0 / best[a][1]) >= self._resync(member_of(a))

    def explore_share(self, n_arms: int) -> float:   # each arm not chosen: its share of the slot's budget
        return self.ctl.explore_budget / max(n_arms - 1, 1)

    def _measured(self, arm: int) -> bool:
        """The shared cost model already knows this arm (other slots, a saved model): no cold turns."""
        ctl = self.ctl
        if arm == PLAIN:
            return not np.isnan(self.v[0])
        name, band = self.arm_name(arm), self.band_for(arm)
        return (ctl.cost.has_draft_cost(name)
                and (ctl.accept.count([(name, band, False), (name, band, True)]) >= 1.0
                     or ctl.borrow_bands and ctl.accept.count(other_bands(ctl.accept, name, band)) >= 1.0))

    def sync_gap(self, m: int) -> int:
        """Tokens member m's lazy sync decodes before its next draft (>= 1): as the drafter says
        (``Drafter.sync_need``), else those since its last draft (all of them in a new request)."""
        if m not in self._needs:
            need = self._sync_need(m) if self._sync_need is not None else None
            if need is None:
                last = self.st.last_drafted.get(m)
                need = self.hist_len - last if last is not None and last <= self.hist_len else self.hist_len
            self._needs[m] = max(int(need), 1)
        return self._needs[m]

    def _resync(self, m: int) -> float:
        """Predicted seconds of member m's lazy sync of the tokens it missed, beyond one."""
        sync = self.ctl.cost.sync_cost(self.st.names[m], self.sync_gap(m))
        return 0.0 if sync is None else sync

    def options(self, arm: int, n: int, sunk: float | None,
                pooled: bool = False) -> tuple[np.ndarray, np.ndarray] | None:
        """(expected tokens, seconds) of an arm's options k = 0 .. n (index k; the tree arm: depth k,
        verified in 1 + its nodes rows); sunk: the draft
        already paid (None: predict its cost). None when its draft cost was never measured.
        pooled: its survival whatever the last verification kept (an arm's choice: keyed by that
        too, an arm tried rarely after full verifications kept a bad early estimate there, and the
        other mode was chosen every second step). A tree not yet measured is predicted from its
        first-child chain (the member's own draft): that chain's survival, a lower bound, and its
        cost of drafting as many tokens as the tree has nodes (so it has no cold turns of its own)."""
        ctl, name, band = self.ctl, self.arm_name(arm), self.band_for(arm)
        chain = self.st.names[member_of(arm)]
        fresh = is_tree(arm) and ctl.accept.count([(name, band, False), (name, band, True)]) < 1.0
        surv = ctl.survival(chain if fresh else name, band, None if pooled else self.full, n, self.st.local)
        e = np.concatenate([[1.0], 1.0 + np.cumsum(surv)])
        if sunk is None:
            d = ctl.cost.draft_cost(name, np.arange(0, n + 1))
            if d is None and is_tree(arm):
                d = ctl.cost.draft_cost(chain, self._tree_rows[: n + 1])
            if d is None:
                return None
            d[0] = 0.0   # k = 0: nothing drafted
        else:
            d = np.full(n + 1, sunk)
        v = self.vs(int(self._tree_rows[n]))[self._tree_rows[: n + 1]] if is_tree(arm) else self.vs(n)
        return e, np.maximum(v + d, 1e-9)

    def vs(self, n: int) -> np.ndarray:
        """T without drafting for k = 0 .. n (n_rows 1 .. n + 1)."""
        if len(self.v) < n + 1:
            self.v = self.ctl.step_cost(n, self.n_seqs)
        return self.v[: n + 1]

    def rates(self, arm: int, n: int, sunk: float | None) -> np.ndarray | None:
        """Predicted tokens/s of an arm's options k = 0 .. n (see ``options``)."""
        o = self.options(arm, n, sunk)
        return None if o is None else np.asarray(o[0] / o[1], dtype=np.float64)

    def next_ask(self) -> tuple[int, int] | None:
        """The next (member, cap) to draft with (in the mode ``sample_for(member)``), or None: no
        (more) drafting this step. Its sync gap is read now, before the draft syncs it."""
        if not self._asks:
            return None
        ask = self._asks.pop(0)
        self.sync_gap(ask[0])
        return ask

    def drafted(self, m: int, n: int, seconds: float) -> None:
        """Member m's draft gave n tokens in `seconds`; decides what is asked next."""
        st = self.st
        gap = self.sync_gap(m)   # (read by next_ask, before the draft synced it)
        st.last_drafted[m] = self.hist_len
        mine = self.arm_drafting(m)   # (a tree: n is its depth)
        self.ctl.cost.record_draft(self.arm_name(mine), n, max(gap, 1), seconds)
        if not is_tree(mine):
            st.longest[m] = max(st.longest.get(m, 0), n)
        self.spent += seconds
        if st.costly[m]:
            st.turns[mine] = st.turns.get(mine, 0) + 1
            self.ctl.versions = (self.ctl.versions[0], self.ctl.versions[1] + 1)   # its draft cost changed
            self.asked_costly = True
        if self._forced:
            self.member, self.held_arm, self.n_held, self.sunk = (m, mine, n, seconds) if n else (None, PLAIN, 0, 0.0)
            return
        arm = self._arm[0]
        if n > 0:
            self._asks = []
            self.member, self.held_arm, self.n_held, self.sunk = m, mine, n, seconds
            if arm != PLAIN and member_of(arm) != m and not st.costly[m]:   # a cheap draft in hand: still ask the model?
                r = self.rates(m, n, seconds)
                if r is None or self._arm[2] > float(r.max()) or (self.explored and self._arm[2] == 0.0):
                    self._asks = [(member_of(arm), self._arm[1])]   # the caller drops the cheap draft (cut(0))
                    self.member, self.held_arm, self.n_held = None, PLAIN, 0
        elif not self._asks and arm != PLAIN and m != member_of(arm) and not st.costly[m]:
            self._asks = [(member_of(arm), self._arm[1])]   # no cheap draft: the arm chosen before drafting

    # -- after drafting ---------------------------------------------------------------------------
    def finish(self, n: int) -> int:
        """The drafts to verify of the proposal held (n tokens): 0 .. n."""
        self.dropped_arm = self.held_arm if self.member is not None else PLAIN
        if self.member is None or n <= 0:
            self.member, self.k = None, 0
        elif self._forced or is_tree(self.held_arm):
            self.k = n   # (a tree is verified whole: its depth was chosen before drafting)
        elif np.isnan(self.v).any():
            self.k, self.explored = n, True     # nothing timed yet: the full draft
        elif not self.ctl.cost.ready():
            # one size timed: the other of (plain = n_seqs rows, the full draft), so two sizes are
            self.k, self.explored = (n if self.ctl.cost.timed(self.n_seqs, self.n_seqs) else 0), True
        else:
            e = self.options(self.held_arm, n, self.sunk)
            assert e is not None   # sunk is known: the draft was timed
            # a try is for measuring (cut by the keyed survival it was dropped and redrafted: session 13)
            self.k = min(n, self._arm[1]) if self.held_arm == self._trying else self._cut(self.held_arm, n, e)
            if self.k > 0:   # S(k) predicted at the cut, for the copies calibration
                self.predicted_full = float(e[0][self.k] - e[0][self.k - 1])
        if self.k == 0:
            self.member, self.held_arm = None, PLAIN   # cut to nothing: a plain step
        if self.member is None and not self.asked_costly:
            st = self.st
            st.turns[PLAIN] = st.turns.get(PLAIN, 0) + 1
        self._ran(self.held_arm)
        return self.k

    def _cut(self, arm: int, n: int, o: tuple[np.ndarray, np.ndarray]) -> int:
        """The drafts to verify (0 .. n) given the held arm's options o = (expected tokens, seconds)."""
        e, t = o
        r = e / t
        kb = int(np.argmax(r))
        st = self.st
        up = min(2 * st.last_cut[1], n) if self.ctl.ramp and st.last_cut is not None and st.last_cut[0] == arm else 0
        if up > kb:
            keep = RAMP_KEEP_COPIES if self.ctl.copies(st.names[member_of(arm)], self.band_for(arm)) else RAMP_KEEP
            ok = np.flatnonzero(r[kb + 1: up + 1] >= keep * r[kb])
            if len(ok):
                self.explored = True   # the ramp (module docstring)
                return kb + 1 + int(ok[-1])
        if kb < n:
            ctl, m = self.ctl, member_of(arm)
            st.len_since[m] = st.len_since.get(m, 0) + 1
            loss = float(t[kb + 1] - e[kb + 1] / r[kb])
            if (st.len_since[m] >= ctl.explore_every
                    and (st.clock - st.len_at.get(m, 0.0)) * ctl.explore_budget >= loss):
                st.len_since[m], st.len_at[m] = 0, st.clock
                self.explored = True
                return kb + 1
        return kb

    def _ran(self, arm: int) -> None:
        st = self.st
        if not np.isnan(self.v).any():
            st.clock += float(self.vs(self.k)[-1]) + self.spent
        st.ran_at[arm] = st.clock
        for a in self.arms():
            st.since[a] = 0 if a == arm else st.since.get(a, 0) + 1

    @property
    def held_band(self) -> str:
        """The band of the proposal held (its survival key)."""
        return self.band_for(self.held_arm)

    @property
    def member_name(self) -> str | None:
        if self.member is None:
            return None
        return self.arm_name(self.held_arm) + (" argmax" if is_argmax(self.held_arm) else "")


class SpecController(ControllerReports):
    """The cost model, the drafts' survival and every slot's exploration (module docstring).

    cost_model: a saved model (``to_dict()`` of a CostModel, or a path to its JSON) to start from.
    sweep: (member or None, k) options tried in turn instead of deciding (``llama-spec tune``).
    ramp: after a full verification, the next cut of the same arm may be up to twice as long where
        predicted within RAMP_KEEP of the best cut's rate (the ramp, draft_length.py).
    request_prior: a request's survival starts from the shared counts capped at this many
        verifications per key (the module's Survival per request).
    borrow_bands: a band new to a member starts from its other bands (Survival across bands).
    """

    def __init__(self, *, explore_budget: float = 0.01, explore_every: int = 16, min_turns: int = 2,
                 decay: float = 0.98, cost_model: CostModelSource = None,
                 sweep: Sequence[tuple[int | None, int]] = (), ramp: bool = True,
                 request_prior: float = REQUEST_PRIOR, borrow_bands: bool = True) -> None:
        if not 0.0 < explore_budget < 1.0 or explore_every < 1 or min_turns < 1 or request_prior <= 0.0:
            raise ValueError("controller: requires 0 < explore_budget < 1, explore_every >= 1, min_turns >= 1, "
                             "request_prior > 0")
        self.request_prior, self.borrow_bands = float(request_prior), bool(borrow_bands)
        self.explore_budget, self.explore_every, self.min_turns = explore_budget, explore_every, min_turns
        self.cost, self.accept = load_cost_model(cost_model, decay)
        self.sweep = list(sweep)
        self.ramp = ramp   # the cut's ramp after a full verification (module docstring)
        self.calib: dict[tuple[str, str], np.ndarray] = {}   # (member, band) -> decayed (S(k) predicted, full, n)
        self.slots: dict[int, SlotState] = {}
        self._step_costs: dict[int, tuple[int, np.ndarray]] = {}   # n_seqs -> (cost.version, step_cost)
        self.versions = (0, 0)   # (survival, costly draft cost) measurements: Plan._best's cache key
        self.choices: dict[str, int] = {}        # "plain" / member name -> steps
        self.lengths = np.zeros(65, dtype=np.int64)
        self.explored = 0

    def attach(self, slot: int, names: Sequence[str], costly: Sequence[bool],
               modes: Sequence[bool] | None = None, tree_member: int | None = None) -> None:
        """Slot `slot`'s drafter has these members (in its chain order); modes[m]: m is costly and
        has the argmax draft mode (``Drafter.draft_modes``); tree_member: the member drafting trees."""
        c = [bool(x) for x in costly]
        md = [bool(x) and y for x, y in zip(modes, c, strict=True)] if modes is not None else [False] * len(c)
        self.slots[slot] = SlotState(list(names), c, md, tree_member)

    def survival(self, name: str, band: str, full: bool | None, n: int,
                 counts: DraftLengthController | None = None) -> np.ndarray:
        """S(1) .. S(n) of a member's drafts in a band after a full verification or not (None: both),
        from `counts` (a request's, ``begin_request``; None: the shared ones)."""
        acc = self.accept if counts is None else counts
        return band_survival(acc, name, band, full, n, self.request_prior if self.borrow_bands else 0.0)

    def begin_request(self, slot: int) -> None:
        """Slot `slot` starts a request: its survival starts from the shared counts capped at
        ``request_prior`` verifications per key, and its own verifications soon outweigh them."""
        st = self.slots[slot]
        st.local, st.best = self.accept.capped(self.request_prior), None

    def copies(self, name: str, band: str) -> bool:
        """A member's drafts in a band are kept whole more often than the survival model predicts
        (CALIB_COPIES x over >= 3 decayed verifications): copies, kept or lost together."""
        c = self.calib.get((name, band))
        return c is not None and c[2] >= 3.0 and (c[1] + 1.0) >= CALIB_COPIES * (c[0] + 1.0)

    def step_cost(self, k_cap: int, n_seqs: int) -> np.ndarray:
        """Seconds of a step of one sequence without its draft, for n_rows = 1 .. k_cap + 1 (read
        only). Kept per n_seqs for STEP_COST_REFRESH .. STEP_COST_REFRESH_MAX measurements of c or r
        (module docstring, Overhead)."""
        hit = self._step_costs.get(n_seqs)
        ver = self.cost.version
        # (a young model moves fast: every time)
        keep = 1 if ver < 16 * STEP_COST_REFRESH else min(STEP_COST_REFRESH_MAX, max(STEP_COST_REFRESH, ver // 16))
        if hit is not None and len(hit[1]) > k_cap and ver - hit[0] < keep:
            return hit[1][: k_cap + 1]
        # as long as any plan asked (the length matters little to the cost of this)
        n = np.arange(1, max(k_cap, len(hit[1]) - 1 if hit is not None else 8) + 2)
        v = self.cost.verify_cost(n * n_seqs, n_seqs) / n_seqs + self.cost.post_cost(n)
        if not np.isnan(v).any():   # (a prefix of a longer curve is the shorter one, NaN aside)
            v.flags.writeable = False
            self._step_costs[n_seqs] = (self.cost.version, v)
        return v[: k_cap + 1]

    def step_cost_version(self, n_seqs: int) -> int | None:
        """The cost model's version when the step cost curve of n_seqs was last read (None: never)."""
        hit = self._step_costs.get(n_seqs)
        return None if hit is None else hit[0]

    # -- the core's calls -----------------------------------------------------------------------
    def plan(self, slot: int, k_cap: int, req: RequestView | str, n_seqs: int, hist_len: int,
             sync_need: Callable[[int], int | None] | None = None, tree_cap: int = 0) -> Plan:
        """Slot `slot`'s decision for its next step of request `req` (a band alone: a request of
        that band with the defaults); sync_need(m): tokens member m's next draft syncs (None:
        estimated); tree_cap: the deepest tree of the request's shape that fits (its tree arm)."""
        st = self.slots[slot]
        view = RequestView(req) if isinstance(req, str) else req
        st.plan = Plan(self, st, k_cap, view, n_seqs, hist_len, sync_need, tree_cap)
        return st.plan

    def current(self, slot: int) -> Plan | None:
        return self.slots[slot].plan if slot in self.slots else None

    def verified(self, slot: int, n_kept: int, n_rows: int, post_seconds: float,
                 emitted: int | None = None) -> Choice | None:
        """After the sequence's verification: its survival, post cost and turns. Returns its choice.
        emitted: the token emitted after the n_kept drafts (the shadow check; None: unknown)."""
        st = self.slots.get(slot)
        self.cost.record_post(n_rows, post_seconds)
        plan = st.plan if st is not None else None
        if st is None or plan is None:
            return None
        st.plan = None
        a = plan.dropped_arm   # the shadow check: the first draft cut off against the token emitted
        shadow = a != PLAIN and plan.dropped is not None and emitted is not None and n_kept == plan.k
        match = shadow and emitted == plan.dropped
        seen: tuple[tuple[str, str, bool], int, int] | None = None   # (key, drafts, kept)
        if shadow and shadow_exact(plan.band_for(a), st.costly[member_of(a)]):
            seen = (st.names[member_of(a)], plan.band_for(a), plan.full), plan.k + 1, plan.k + int(match)
        elif plan.member is not None and plan.k > 0:
            seen = (plan.arm_name(plan.held_arm), plan.held_band, plan.full), plan.k, n_kept
        if seen is not None:
            self.accept.record_verify(*seen)
            if st.local is not None:   # (the request's own counts too: begin_request)
                st.local.record_verify(*seen)
            self.versions = (self.versions[0] + 1, self.versions[1])   # a survival changed
        if plan.member is not None and plan.k > 0 and plan.predicted_full is not None:
            key = (st.names[plan.member], plan.held_band)
            c = self.calib.get(key, np.zeros(3)) * CALIB_DECAY
            self.calib[key] = c + (plan.predicted_full, float(n_kept == plan.k), 1.0)
        # "full": the member's draft agreed with every token this step emitted (its verified drafts
        # and, where it drafted further, the next token: a copy plain decoding went on with)
        st.last_full = match or (plan.k > 0 and n_kept == plan.k and plan.dropped is None)
        st.last_cut = (plan.held_arm if plan.k else a, max(plan.k, 1)) if st.last_full else None
        name = plan.member_name or "plain"
        self.choices[name] = self.choices.get(name, 0) + 1
        self.lengths[min(plan.k, 64)] += 1
        self.explored += plan.explored
        return Choice(plan.member, plan.k, plan.explored, plan.member_name)

    def decoded(self, n_rows: int, n_seqs: int, seconds: float) -> None:
        self.cost.record_decode(n_rows, n_seqs, seconds)

