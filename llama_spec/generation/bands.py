"""A request's acceptance band and what a speculation plan reads of its request (controller.py).

A **band** is the acceptance regime survival is keyed by: "greedy", or the rule and a temperature
band; argmax drafts of a sampled request have their own band (the exact-match rule's).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["RequestView", "band_of", "draft_modes_band", "shadow_exact"]


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
