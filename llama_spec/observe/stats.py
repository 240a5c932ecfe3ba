"""Observers that count: SpecStats (every request's counters) and TopKStats (draft diagnostics).

SpecStats
    Counters of one generation (GenerationResult.stats; cumulated with ``+=``). Two lengths, as
    docs/design.md defines them: ``mean_accepted_length`` = kept drafts per verification, and
    ``tokens_per_verification`` = emitted tokens per verification (kept + recovered/bonus; vLLM's
    "acceptance length").

TopKStats: would drafting wider pay?

Per draft position i (up to 16) over the drafter's top-8 candidates there:

* rank histogram of the token the target emitted at i (ranks 1..8, and "not in top-8"),
* reach count (verifications whose draft reached position i) and acceptance rate at i,
* mean probability the drafter gave its rank-2 candidate,
* the gain of widening: among rejections at i, the fraction whose emitted token was the
  drafter's rank 2 (what a width-2 tree would have recovered) and rank 2-3 (width 3).

Off by default and inert when off: it is an observer (``TopKStats().attach(gen)``), and only
when one is attached do the drafters collect candidates. On by ``topk_stats=True``,
``--spec-topk-stats`` or ``LLAMA_MTP_TOPK_STATS=1``; a report every N verifications (N from
``--spec-topk-stats-every`` / ``LLAMA_MTP_TOPK_STATS_EVERY``, default 128) and at the end.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from ..drafters.base import TOPK_WIDTH
from ..env import env_flag
from .observers import Observer

if TYPE_CHECKING:
    from ..rules.base import Verification

N_MAX_LIMIT = 64  # the most draft positions a verification can have (SpeculativeGenerator's n_max)

MAX_POSITIONS = 16
ENV_ON = "LLAMA_MTP_TOPK_STATS"
ENV_EVERY = "LLAMA_MTP_TOPK_STATS_EVERY"
DEFAULT_EVERY = 128


def topk_settings(flag: bool | None = None, every: int | None = None) -> tuple[bool, int]:
    """Resolve (enabled, every) from explicit values, then the environment, then defaults."""
    if flag is None:
        flag = env_flag(ENV_ON, False)
    if every is None:
        raw = os.environ.get(ENV_EVERY)
        if raw is None or raw.strip() == "":
            every = DEFAULT_EVERY
        else:
            try:
                every = int(raw)
            except ValueError:
                raise ValueError(f"environment variable {ENV_EVERY}={raw!r}: expected a positive integer") from None
            if every <= 0:
                raise ValueError(f"environment variable {ENV_EVERY}={raw!r}: expected a positive integer")
    elif every <= 0:
        raise ValueError(f"--spec-topk-stats-every must be a positive integer, got {every}")
    return bool(flag), int(every)



@dataclass
class SpecStats(Observer):
    """Counters of one generation (or cumulated with ``+=``); an observer of its request."""

    verifications: int = 0      # target verification batches that carried >= 1 draft token
    drafted: int = 0            # draft tokens proposed
    accepted: int = 0           # draft tokens kept
    recovered: int = 0          # tokens emitted at the first rejection
    bonus: int = 0              # tokens drawn from p after all k drafts were kept
    extra_accepted: int = 0     # kept although the target's own sample there was another token
    exact_match_verifications: int = 0  # verifications run with the exact-match rule
    block_verifications: int = 0        # verifications run with the block rule
    fallback_positions: int = 0  # positions where p was not normalized (exact match used)
    emitted: int = 0
    reached: list[int] = field(default_factory=lambda: [0] * N_MAX_LIMIT)        # per position
    accepted_at: list[int] = field(default_factory=lambda: [0] * N_MAX_LIMIT)    # per position
    # sum min(p, q) per reached position: filled only while an observer wants p/q (PQLog)
    expected_accept: list[float] = field(default_factory=lambda: [0.0] * N_MAX_LIMIT)
    # p(argmax q) at the same positions: what the exact-match rule with an argmax draft accepts
    expected_accept_exact: list[float] = field(default_factory=lambda: [0.0] * N_MAX_LIMIT)
    t_prompt_s: float = 0.0
    t_decode_s: float = 0.0
    n_prompt: int = 0
    n_cached: int = 0           # prompt tokens whose cells were reused (the prompt cache), not decoded
    # the speculation controller's choices (auto=True; generation/controller.py), per verification
    auto_steps: int = 0         # verifications it decided
    auto_plain: int = 0         # of those, without drafts (plain decoding)
    auto_explored: int = 0      # of those, an option tried to keep it measured
    auto_by_drafter: dict[str, int] = field(default_factory=dict)      # member -> verifications
    auto_lengths: list[int] = field(default_factory=lambda: [0] * (N_MAX_LIMIT + 1))  # k -> verifications

    _SUMS = ("verifications", "drafted", "accepted", "recovered", "bonus", "extra_accepted",
             "exact_match_verifications", "block_verifications", "fallback_positions", "emitted",
             "t_prompt_s", "t_decode_s", "n_prompt", "n_cached", "auto_steps", "auto_plain", "auto_explored")
    _LISTS = ("reached", "accepted_at", "expected_accept", "expected_accept_exact")

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def mean_accepted_length(self) -> float:
        """Draft tokens kept per verification (verifications with >= 1 draft)."""
        return self.accepted / self.verifications if self.verifications else 0.0

    @property
    def tokens_per_verification(self) -> float:
        """Tokens emitted per verification: kept + recovered/bonus (vLLM's "acceptance length")."""
        return (self.accepted + self.recovered + self.bonus) / self.verifications if self.verifications else 0.0

    @property
    def decode_tps(self) -> float:
        return self.emitted / self.t_decode_s if self.t_decode_s > 0 else 0.0

    def count_auto(self, member: str | None, k: int, explored: bool) -> None:
        """One verification the controller decided: member (None: plain) with k drafts."""
        self.auto_steps += 1
        self.auto_explored += bool(explored)
        if member is None or k <= 0:
            self.auto_plain += 1
        else:
            self.auto_by_drafter[member] = self.auto_by_drafter.get(member, 0) + 1
        self.auto_lengths[min(max(k, 0), N_MAX_LIMIT)] += 1

    def auto_summary(self) -> str:
        """'plain 12, draft-simple 30; k 0:12 1:4 3:26; explored 3' (empty when nothing was decided)."""
        if not self.auto_steps:
            return ""
        who = ", ".join([f"plain {self.auto_plain}", *(f"{k} {v}" for k, v in self.auto_by_drafter.items())])
        ks = " ".join(f"{k}:{n}" for k, n in enumerate(self.auto_lengths) if n)
        return f"{who}; k {ks}; explored {self.auto_explored}"

    def on_verify(self, v: Verification) -> None:
        """Count one verification (O(1) Python unless p/q were logged for it)."""
        self.emitted += len(v.emitted)
        k = len(v.proposal)
        if k == 0:
            return
        n_acc, n_out = v.n_accepted, len(v.emitted)
        self.verifications += 1
        self.drafted += k
        if v.rule == "exact-match":
            self.exact_match_verifications += 1
        elif v.rule == "block":
            self.block_verifications += 1
        self.accepted += n_acc
        self.extra_accepted += v.n_extra
        self.fallback_positions += v.n_fallback
        # a tree proposal: positions are depths, and a bonus follows an accepted leaf (not k kept nodes)
        at_leaf = None if v.tree is None else v.tree_outcome.ended_at_leaf
        depth = v.proposal.depth
        n_reached = min(n_out, depth)
        for i in range(n_reached):
            self.reached[i] += 1
        for i in range(n_acc):
            self.accepted_at[i] += 1
        if n_out > n_acc:
            if (n_acc < k) if at_leaf is None else not at_leaf:
                self.recovered += 1
            else:
                self.bonus += 1
        if v.pq is not None and v.rule != "exact-match":
            self._expected(v, n_reached)

    def _expected(self, v: Verification, n_reached: int) -> None:
        for idx, ids, probs, q_ids, q_probs in v.pq or ():
            i = idx - v.emitted_index
            if i >= n_reached or q_ids is None or q_probs is None:
                continue
            _, ia, ib = np.intersect1d(ids, q_ids, assume_unique=True, return_indices=True)
            self.expected_accept[i] += float(np.minimum(probs[ia], q_probs[ib]).sum())
            self.expected_accept_exact[i] += float(probs[ids == q_ids[np.argmax(q_probs)]].sum())

    def __iadd__(self, o: SpecStats) -> SpecStats:
        for f in self._SUMS:
            setattr(self, f, getattr(self, f) + getattr(o, f))
        for f in self._LISTS:
            a, b = getattr(self, f), getattr(o, f)
            setattr(self, f, [x + y for x, y in zip(a, b, strict=True)])
        self.auto_lengths = [x + y for x, y in zip(self.auto_lengths, o.auto_lengths, strict=True)]
        for k, n in o.auto_by_drafter.items():
            self.auto_by_drafter[k] = self.auto_by_drafter.get(k, 0) + n
        return self

    def as_dict(self) -> dict[str, Any]:
        n = max((i + 1 for i, r in enumerate(self.reached) if r), default=0)
        d: dict[str, Any] = {f: getattr(self, f) for f in self._SUMS}
        d.update({f: getattr(self, f)[:n] for f in self._LISTS})
        d.update(auto_by_drafter=dict(self.auto_by_drafter),
                 auto_lengths={k: c for k, c in enumerate(self.auto_lengths) if c})
        d.update(acceptance_rate=self.acceptance_rate, mean_accepted_length=self.mean_accepted_length,
                 tokens_per_verification=self.tokens_per_verification, decode_tps=self.decode_tps)
        return d

    def summary(self) -> str:
        return (f"drafted {self.drafted}, accepted {self.accepted} ({100 * self.acceptance_rate:.1f} %), "
                f"mean accepted length {self.mean_accepted_length:.2f} (kept drafts per verification), "
                f"tokens per verification {self.tokens_per_verification:.2f} (emitted, incl. recovered/bonus), "
                f"extra accepted {self.extra_accepted}, {self.emitted} tokens at {self.decode_tps:.1f} t/s")

class TopKStats(Observer):
    """Accumulates per-position rank statistics of the emitted tokens among the draft's top-8."""

    wants_topk = True

    def __init__(self, every: int = DEFAULT_EVERY, log: Callable[[str], None] | None = None,
                 n_positions: int = MAX_POSITIONS, width: int = TOPK_WIDTH) -> None:
        if every <= 0:
            raise ValueError(f"every must be a positive integer, got {every}")
        self.every = every
        self.log = log
        self.width = width
        self.n_positions = n_positions
        # hist[i, r]: r = 0..width-1 for ranks 1..width, r = width for "not in top-width"
        self.hist = np.zeros((n_positions, width + 1), dtype=np.int64)
        self.rej_hist = np.zeros((n_positions, width + 1), dtype=np.int64)  # rejected positions only
        self.reach = np.zeros(n_positions, dtype=np.int64)
        self.accepted = np.zeros(n_positions, dtype=np.int64)
        self.rank2_prob_sum = np.zeros(n_positions, dtype=np.float64)
        self.rank2_prob_n = np.zeros(n_positions, dtype=np.int64)
        self.verifications = 0
        self.tree_verifications = 0     # verifications of tree proposals
        self.tree_accepted = 0          # accepted tokens of those (the tree rule's path)
        self.tree_chain_accepted = 0    # accepted leading first children (the chain's counterfactual)
        self.tree_width1 = 0            # the trees' width at depth 1

    def attach(self, generator: Any) -> TopKStats:
        """Watch every request of `generator` (a SpeculativeGenerator) from now on."""
        generator.add_observer(self)
        return self

    def on_verify(self, v: Verification) -> None:
        if not len(v.proposal):
            return
        if v.tree is None:
            self.record(v.proposal, v.emitted, v.n_accepted)
            return
        n_chain = v.tree_outcome.n_chain
        # A tree: the histogram stays a chain's (its first-child path, which is what the chain would
        # have drafted), and the tree's own accepted length is counted next to that chain's.
        self.tree_verifications += 1
        self.tree_accepted += v.n_accepted
        self.tree_chain_accepted += int(n_chain)
        self.tree_width1 = max(self.tree_width1, len(v.tree.children[0]))
        n_pos = min(int(n_chain) + 1, v.tree.depth)
        self.record(v.proposal, v.emitted[:n_pos], min(int(n_chain), n_pos), n_positions=n_pos)

    def measured_tree_gain(self) -> dict | None:
        """With tree drafts: accepted tokens per verification of the tree and of its first-child
        chain (what a chain draft would have kept), and the gain; None without trees."""
        if not self.tree_verifications:
            return None
        n = self.tree_verifications
        tree, chain = self.tree_accepted / n, self.tree_chain_accepted / n
        # predicted from the chain's own ranks: a rejection at depth 1 whose emitted token was the
        # draft's rank 2 (rank 2-3) is what a width-2 (width-3) first level recovers, one token each
        g = self.widening_gain()
        w = min(self.tree_width1, 3)
        pred = None
        if g and w >= 2 and chain > 0:
            extra = g[0]["rejections"] * g[0][f"width{w}"] / max(self.verifications, 1)
            pred = extra / chain
        return {"verifications": n, "tree_accepted_per_verification": tree,
                "chain_accepted_per_verification": chain,
                "measured_gain": tree / chain - 1.0 if chain > 0 else None,
                "predicted_gain_depth1": pred, "width_depth1": self.tree_width1}

    def record(self, proposal, emitted: Sequence[int], n_accepted: int, n_positions: int | None = None) -> None:
        """One verification: `emitted` are the tokens the loop emitted for it, in order.

        Position i was reached iff a token was emitted at i (i < number of drafts); the
        token emitted there is the kept draft or the recovered one. A trailing bonus token
        belongs to no draft position.
        """
        ids_list = proposal.topk_ids
        if ids_list is None:
            return
        self.verifications += 1
        n_drafted = len(proposal.tokens) if n_positions is None else n_positions
        n_reached = min(n_drafted, len(emitted), self.n_positions, len(ids_list))
        for i in range(n_reached):
            top = ids_list[i]
            hits = np.flatnonzero(top[: self.width] == emitted[i])
            r = int(hits[0]) if hits.size else self.width
            self.hist[i, r] += 1
            self.reach[i] += 1
            if i < n_accepted:
                self.accepted[i] += 1
            else:
                self.rej_hist[i, r] += 1
            probs = proposal.topk_probs[i]
            if probs is not None and len(probs) > 1:
                self.rank2_prob_sum[i] += float(probs[1])
                self.rank2_prob_n[i] += 1
        if self.log is not None and self.verifications % self.every == 0:
            self.log(self.table())

    # -- derived numbers ------------------------------------------------------------------------
    def _used(self) -> int:
        nz = np.flatnonzero(self.reach)
        return int(nz[-1]) + 1 if nz.size else 0

    def widening_gain(self) -> list[dict]:
        out = []
        for i in range(self._used()):
            rej = int(self.reach[i] - self.accepted[i])
            r2 = int(self.rej_hist[i, 1])
            r23 = r2 + int(self.rej_hist[i, 2])
            out.append({"position": i + 1, "rejections": rej,
                        "width2": r2 / rej if rej else 0.0, "width3": r23 / rej if rej else 0.0})
        return out

    def as_dict(self) -> dict:
        n = self._used()
        return {
            "verifications": self.verifications,
            "width": self.width,
            "positions": [
                {
                    "position": i + 1,
                    "reach": int(self.reach[i]),
                    "accepted": int(self.accepted[i]),
                    "acceptance_rate": float(self.accepted[i] / self.reach[i]) if self.reach[i] else 0.0,
                    "rank_hist": [int(x) for x in self.hist[i]],
                    "mean_rank2_prob": float(self.rank2_prob_sum[i] / self.rank2_prob_n[i]) if self.rank2_prob_n[i] else 0.0,
                }
                for i in range(n)
            ],
            "widening_gain": self.widening_gain(),
            "tree": self.measured_tree_gain(),
        }

    def table(self) -> str:
        d = self.as_dict()
        head = "pos  reach  acc%   " + " ".join(f"r{r + 1:<4d}" for r in range(self.width)) + " >8    p(r2)  w2%   w3%"
        lines = [f"draft top-{self.width} statistics after {d['verifications']} verifications", head]
        for p, g in zip(d["positions"], d["widening_gain"], strict=True):
            hist = " ".join(f"{x:<5d}" for x in p["rank_hist"])
            lines.append(f"{p['position']:<4d} {p['reach']:<6d} {100 * p['acceptance_rate']:5.1f}  {hist} "
                         f"{p['mean_rank2_prob']:.3f}  {100 * g['width2']:5.1f} {100 * g['width3']:5.1f}")
        t = d["tree"]
        if t is not None:
            pct = lambda x: "n/a" if x is None else f"{100 * x:+.1f} %"  # noqa: E731
            lines.append(f"tree: {t['tree_accepted_per_verification']:.2f} accepted per verification vs "
                         f"{t['chain_accepted_per_verification']:.2f} on its first-child chain: measured "
                         f"{pct(t['measured_gain'])}, predicted (width {t['width_depth1']} at depth 1) "
                         f"{pct(t['predicted_gain_depth1'])}")
        return "\n".join(lines)

    def to_json(self, path) -> None:
        with open(path, "w") as fh:
            json.dump(self.as_dict(), fh, indent=2)

    def plot(self, path) -> None:
        """Per-position stacked rank histogram + acceptance and reach curves, as a PNG."""
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        n = max(self._used(), 1)
        x = np.arange(1, n + 1)
        fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.5))
        bottom = np.zeros(n)
        frac = self.hist[:n] / np.maximum(self.reach[:n, None], 1)
        cmap = plt.get_cmap("viridis", self.width + 1)
        for r in range(self.width + 1):
            label = f"rank {r + 1}" if r < self.width else f"not in top-{self.width}"
            ax1.bar(x, frac[:, r], bottom=bottom, color=cmap(r), label=label)
            bottom += frac[:, r]
        ax1.set_xlabel("draft position")
        ax1.set_ylabel("fraction of reached positions")
        ax1.set_title("rank of the emitted token among the draft's candidates")
        ax1.legend(fontsize=7, ncol=2)
        acc = self.accepted[:n] / np.maximum(self.reach[:n], 1)
        ax2.plot(x, acc, "o-", label="acceptance rate")
        ax2.set_ylim(0, 1.05)
        ax2.set_xlabel("draft position")
        ax2.set_ylabel("acceptance rate")
        ax3 = ax2.twinx()
        ax3.plot(x, self.reach[:n], "s--", color="tab:red", label="reach")
        ax3.set_ylabel("reach (verifications)")
        ax2.set_title(f"acceptance and reach ({self.verifications} verifications)")
        h1, l1 = ax2.get_legend_handles_labels()
        h2, l2 = ax3.get_legend_handles_labels()
        ax2.legend(h1 + h2, l1 + l2, loc="upper right")
        fig.tight_layout()
        fig.savefig(path, dpi=110)
        plt.close(fig)
