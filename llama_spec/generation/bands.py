"""A request's acceptance band and what a speculation plan reads of its request (controller.py).

A **band** is the acceptance regime survival is keyed by: "greedy", or the rule and a temperature
band; argmax drafts of a sampled request have their own band (the exact-match rule's).

**Survival across bands** (``band_survival``, the controller's ``borrow_bands``): where a member
holds fewer than w verifications in a band (w: the controller's ``request_prior``, 1), the member's
other bands make up the rest, scaled to it, as a prior; a band's own verifications soon outweigh
it. Such a member has no cold turns in the new band (it is chosen by this prediction, like any
option). Why: the first request at temp 0.8 in a process gave the 0.5B's argmax arm its two cold
turns at full length (a prompt sync and a 5-row verification each) though its greedy drafts had
shown it did not pay, and its sampled arm the flat prior (0.7 per position): 8.8-11.9 t/s
against ~13 plain (Intel Xeon, 2 cores). Other bands are a rough prior (the exact-match rule at
temp 0.8 keeps p(argmax q), about greedy's agreement; sampled drafts keep sum min(p, q), lower),
and a wrong one costs what a cold turn costs, once.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import numpy as np

    from .draft_length import DraftLengthController

__all__ = ["RequestView", "band_of", "band_survival", "draft_modes_band", "other_bands", "shadow_exact"]


def band_of(greedy: bool, temp: float, rule: str) -> str:
    """The acceptance band of a request (greedy: every rule is exact-match, invariant 2)."""
    if greedy:
        return "greedy"
    return f"{rule}/t<0.5" if temp < 0.5 else f"{rule}/t<1" if temp < 1.0 else f"{rule}/t>=1"


def draft_modes_band(greedy: bool, temp: float, rule_uses_q: bool, sample: bool) -> str | None:
    """The band of argmax drafts when a request may choose its drafts' mode (sampled drafts under
    a rule that uses q), else None (greedy: the modes coincide; exact-match: argmax only)."""
    return band_of(False, temp, "exact-match") if not greedy and rule_uses_q and sample else None


def shadow_exact(band: str, costly: bool) -> bool:
    """Whether a plain step's token, compared with a draft d cut off in its place, observes d's
    survival: it emits d with p(d), the rule's keep probability in greedy and exact-match bands and
    for an n-gram's drafts (no q) under the token rule; not a model's sampled drafts under a rule of
    q (min(1, p/q)), nor block rules."""
    return band == "greedy" or band.startswith("exact-match/") or (band.startswith("token/") and not costly)


def other_bands(acc: DraftLengthController, name: str, band: str, full: bool | None = None) -> list[object]:
    """The survival keys of member `name` in bands other than `band` (with this `full`, where given)."""
    return [k for k in acc.keys()
            if isinstance(k, tuple) and k[0] == name and k[1] != band and (full is None or k[2] == full)]


def band_survival(acc: DraftLengthController, name: str, band: str, full: bool | None, n: int,
                  borrow: float) -> np.ndarray:
    """S(1) .. S(n), (n,), of member `name`'s drafts in `band` after a full verification or not
    (None: both). Where the band holds fewer than `borrow` verifications, the member's other bands
    make up the rest as a prior (controller.py, Survival across bands)."""
    both: list[object] = [(name, band, False), (name, band, True)]
    keys: list[object] = both if full is None else [(name, band, full)]
    room = borrow - acc.count(both) if borrow > 0.0 else 0.0
    return acc.survival_of(keys, n, (other_bands(acc, name, band, full), room) if room > 0.0 else None)


@dataclass(frozen=True)
class RequestView:
    """What a plan needs of its request, built once per request: band (``band_of``); n_predict: its
    token budget (bounds one exploration's loss; None: unbounded); prompt_len: its prompt's length in
    the history (with n_predict: the tokens it has left); argmax_band: the band of argmax
    drafts where it may choose the draft mode (``draft_modes_band``; None: as configured);
    sample: its configured draft mode; tree: its tree shape (the controller's tree arm), if any."""

    band: str
    n_predict: int | None = None
    argmax_band: str | None = None
    sample: bool = True
    tree: tuple[int, ...] | None = None
    prompt_len: int | None = None
