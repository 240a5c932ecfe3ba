"""Observers: anything that watches verifications (statistics, top-k statistics, p/q logs, user
callbacks). An observer never changes a decision.

The generator calls, per request: ``on_request(info)`` once before the prefill, ``on_verify(v)``
once per verification (the first token after the prompt counts as one, with an empty proposal
and ``v.first``), and ``on_result(result)`` at the end. ``v`` is the loop's reused
:class:`~llama_spec.rules.base.Verification`: positions (``v.pos0`` + i), the proposal, the
emitted tokens, ``n_accepted``, the rule that decided (``v.rule``) and, only when some observer
of the request sets ``wants_pq``, p and q of every decided position (``v.pq``). Everything in it
is valid during the call only: copy what you keep. With no observer wanting p/q nothing is copied.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from ..llama.sampling import TargetSampler
    from ..rules.base import PQEntry, Verification


@dataclass
class RequestInfo:
    """What an observer may know about a request before it runs (live objects: read, never call
    anything that changes them)."""

    prompt_tokens: list[int]
    sampler: TargetSampler          # the target sampler of the request (n_accept_calls, budget)
    rng: np.ndarray                 # uint64 (4,): the accept RNG, advanced in place by the rules
    verify: str                     # the rule asked for, after the switch (exact-match if off)
    n_max: int


class Observer:
    """Base class with no-op hooks; override what you need."""

    wants_pq: bool = False    # ask the rules to copy p (and q) of every decided position into v.pq
    wants_topk: bool = False  # ask the drafter for its top-k candidates (Proposal.topk_*)

    def on_request(self, info: RequestInfo) -> None:
        """Before the prefill of a request."""

    def on_verify(self, v: Verification) -> None:
        """After each verification (its tokens are emitted and rejected drafts rolled back)."""

    def on_result(self, result: Any) -> None:
        """After the request finished: its GenerationResult."""


class VerifyCallback(Observer):
    """A user callback ``fn(v)`` called once per verification."""

    def __init__(self, fn: Callable[[Verification], None], *, wants_pq: bool = False) -> None:
        self.fn = fn
        self.wants_pq = wants_pq

    def on_verify(self, v: Verification) -> None:
        self.fn(v)


@dataclass
class PQLog(Observer):
    """Logs, for the last request, (emitted index, p ids, p probs, q ids, q probs) of every decided
    position (q None where there is no q, e.g. the first token). For the distribution tests."""

    entries: list[PQEntry] = field(default_factory=list)
    wants_pq: bool = True

    def on_request(self, info: RequestInfo) -> None:
        self.entries = []

    def on_verify(self, v: Verification) -> None:
        if v.pq is not None:
            self.entries.extend(v.pq)


@dataclass
class RequestWatch(Observer):
    """Keeps the last request's RequestInfo and result (tests: sampler accept counts, the RNG)."""

    info: RequestInfo | None = None
    rng_at_start: np.ndarray | None = None
    result: Any = None
    verifications: list[tuple[int, np.ndarray, np.ndarray]] = field(default_factory=list)
    keep_logits: bool = False  # also copy (pos0, batch, logits) of every verification

    def on_request(self, info: RequestInfo) -> None:
        self.info, self.rng_at_start, self.result = info, info.rng.copy(), None
        self.verifications = []

    def on_verify(self, v: Verification) -> None:
        if self.keep_logits and not v.first:
            self.verifications.append((v.pos0, v.batch.copy(), v.logits.copy()))

    def on_result(self, result: Any) -> None:
        self.result = result
