"""A drafter resumed after plain steps accepts as before it sat out (issue 25, what it must show 5).

Used by tests/test_controller_loop.py (120 plain steps) and scripts/resume_check.py (the issue's
500). Both runs are greedy on one repetitive code prompt with the controller's ``sweep`` forcing
the choice: the *rested* run drafts ``n_draft`` steps, decodes ``n_plain`` plain steps (the
drafter's KV / index is not fed), then drafts ``2 n_draft`` steps (an n-gram drafter finds no
match on about half of them); the *steady* run drafts throughout. Greedy: both emit the same
tokens, so the kept drafts of the resumed stretch compare with the steady run's on the same text.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..drafters.base import Drafter
from ..drafters.draft_model import DraftModelDrafter
from ..drafters.ngram import build_ngram_drafter
from ..generation.solo import SpeculativeGenerator
from ..llama.model import Model
from ..llama.sampling import SamplerParams
from ..observe.observers import Observer

PROMPT = "def add(a, b):\n    return a + b\n\n\ndef add(a, b):\n    return a + b\n\n\ndef"
KINDS = ("draft-simple", "ngram-map-k", "ngram-mod")


class Verifications(Observer):
    """(position of the verification, drafts, kept) of every verification that carried drafts."""

    def __init__(self) -> None:
        self.positions: list[tuple[int, int, int]] = []

    def on_verify(self, v) -> None:  # type: ignore[no-untyped-def]
        if len(v.proposal):
            self.positions.append((v.emitted_index, len(v.proposal), v.n_accepted))


@dataclass
class ResumeResult:
    same_tokens: bool                       # the two runs emitted the same tokens
    before: list[tuple[int, int, int]]      # the rested run's verifications before the rest
    resumed: list[tuple[int, int, int]]     # ... and after it
    steady: list[tuple[int, int, int]]      # the steady run's, over the resumed stretch

    @staticmethod
    def kept(rows: list[tuple[int, int, int]]) -> float:
        """Kept drafts per verification (ngram-map-k adapts its lengths: not per draft)."""
        return sum(a for _, _, a in rows) / max(1, len(rows))


def make_drafter(model: Model, kind: str) -> Drafter:
    if kind == "draft-simple":
        return DraftModelDrafter(model, n_ctx=1024)
    if kind == "ngram-map-k":
        return build_ngram_drafter(kind, size_n=2, size_m=8)
    return build_ngram_drafter(kind, n_match=4, n_min=2, n_max=8)


def resume_check(model: Model, kind: str, n_plain: int, n_draft: int = 16) -> ResumeResult:
    """The rested and the steady run of `kind` drafting for `model` (module docstring)."""
    def run(sweep: list[tuple[int | None, int]], n_predict: int) -> tuple[list[int], list[tuple[int, int, int]]]:
        gen = SpeculativeGenerator(model, make_drafter(model, kind), n_ctx=1024, n_max=3, auto=True)
        assert gen.controller is not None
        gen.controller.sweep = sweep
        rec = Verifications()
        try:
            r = gen.generate(PROMPT, sampling=SamplerParams(temp=0.0), n_predict=n_predict, ignore_eos=True,
                             observers=[rec])
        finally:
            gen.close()
        return r.tokens, rec.positions

    draft: list[tuple[int | None, int]] = [(0, 3)] * n_draft
    rested_tokens, rested = run(draft + [(None, 0)] * n_plain + draft * 2 + [(None, 0)] * 1000,
                                8 * n_draft + n_plain)
    steady_tokens, steady = run(draft, len(rested_tokens))
    first = min(pos for pos, _, _ in rested)
    resumed = [x for x in rested if x[0] > first + n_plain]
    span = (resumed[0][0], resumed[-1][0]) if resumed else (0, -1)
    return ResumeResult(rested_tokens == steady_tokens, rested[:n_draft], resumed,
                        [x for x in steady if span[0] - 4 <= x[0] <= span[1]])
