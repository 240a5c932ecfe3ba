"""The chain's gate: ask a costly member (one that runs a model) only while asking it pays.

Words, used below exactly:

- a member's **turn**: a verification step in which every earlier member proposed nothing, so
  the chain reaches this member.
- the two **arms** of a turn: *ask* (the member drafts; if it proposes nothing the chain goes on)
  and *skip* (the chain goes on as if it had proposed nothing).
- a step's **time**: from the chain's ``draft()`` call to its ``accepted()`` call (drafting, the
  target's decode, the verification); its **tokens**: the kept drafts + 1.
- an arm's **rate**: tokens per second over the turns it was chosen, with older turns decayed
  (``decay`` per turn of that arm) so that a change in the text (it starts repeating) is followed.

Policy: each arm gets ``min_turns`` turns first, alternating, ask first; then the arm with the
higher rate is chosen, except one turn in every ``explore_every`` x (faster rate / slower rate)^2
(at most ``max_stretch`` x ``explore_every``), which goes to the other arm so its rate stays
measured: the clearer the loser, the rarer it is tried (every 16th turn cost the gated
``ngram-mod,draft-simple`` 0.84x of ngram-mod alone; draft-simple's turns ran at a third of the
skipped ones, session 7). Why: on a 2-core CPU draft-simple runs at 0.75x plain decoding, so in
``ngram-mod,draft-simple`` every verification ngram-mod cannot draft went to a member that costs
more than it gains (the chain ran at 0.83x plain, ngram-mod alone at 1.27x; session 6).

Skipping a member changes only speed: the step is then verified with a later member's drafts or
none, which every rule handles exactly. But which arm wins depends on wall-clock time, so with
``temp > 0`` a seeded run is reproducible token for token only with the gate off.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass


@dataclass
class ArmRate:
    """Decayed sums of one arm's tokens and seconds."""

    turns: int = 0
    tokens: float = 0.0
    seconds: float = 0.0

    def add(self, tokens: int, seconds: float, decay: float) -> None:
        self.turns += 1
        self.tokens = self.tokens * decay + tokens
        self.seconds = self.seconds * decay + max(seconds, 0.0)

    @property
    def rate(self) -> float:
        """Tokens per second (0 before any turn)."""
        return self.tokens / self.seconds if self.seconds > 0 else 0.0


class MemberGate:
    """One costly member's ask/skip decision per turn (see the module docstring)."""

    def __init__(self, min_turns: int = 4, explore_every: int = 16, decay: float = 0.97,
                 max_stretch: float = 64.0) -> None:
        if min_turns < 1 or explore_every < 2 or not 0.0 < decay <= 1.0 or max_stretch < 1.0:
            raise ValueError("gate: requires min_turns >= 1, explore_every >= 2, 0 < decay <= 1, max_stretch >= 1")
        self.min_turns, self.explore_every, self.decay = min_turns, explore_every, decay
        self.max_stretch = max_stretch
        self.ask_arm, self.skip_arm = ArmRate(), ArmRate()
        self.since_explore = 0  # turns decided since the losing arm was last tried

    def explore_interval(self) -> int:
        """Turns between two tries of the losing arm: explore_every x (rate ratio)^2, capped."""
        hi, lo = max(self.ask_arm.rate, self.skip_arm.rate), min(self.ask_arm.rate, self.skip_arm.rate)
        stretch = self.max_stretch if lo <= 0 else min(self.max_stretch, (hi / lo) ** 2)
        return max(self.explore_every, round(self.explore_every * stretch))

    def should_ask(self) -> bool:
        """This turn's arm: True = ask the member."""
        if self.ask_arm.turns < self.min_turns or self.skip_arm.turns < self.min_turns:
            return self.ask_arm.turns <= self.skip_arm.turns
        better = self.ask_arm.rate >= self.skip_arm.rate
        self.since_explore += 1
        if self.since_explore >= self.explore_interval():
            self.since_explore = 0
            return not better
        return better

    def record(self, asked: bool, tokens: int, seconds: float) -> None:
        """The step's result for the arm chosen on this turn."""
        (self.ask_arm if asked else self.skip_arm).add(tokens, seconds, self.decay)

    def summary(self) -> dict[str, float]:
        return {"ask_turns": self.ask_arm.turns, "skip_turns": self.skip_arm.turns,
                "ask_tok_per_s": round(self.ask_arm.rate, 3), "skip_tok_per_s": round(self.skip_arm.rate, 3)}


class StepClock:
    """Times one chain step from draft() to accepted(); remembers each gated member's arm in it."""

    def __init__(self, clock: Callable[[], float] = time.perf_counter) -> None:
        self.clock = clock
        self.t0: float | None = None
        self.arms: list[tuple[int, bool]] = []   # (member index, asked) for the gated turns of this step

    def start(self) -> None:
        self.t0, self.arms = self.clock(), []

    def stop(self) -> float | None:
        """Seconds since start (None when no step was started: the first verification)."""
        t0, self.t0 = self.t0, None
        return None if t0 is None else self.clock() - t0
