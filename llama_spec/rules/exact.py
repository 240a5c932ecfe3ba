"""The exact-match rule (llama.cpp's): the target samples every position, a draft is kept if equal."""

from __future__ import annotations

from .base import Rule, Verification, exact_match


class ExactMatchRule(Rule):
    name = "exact-match"
    uses_q = False

    def random(self, v: Verification) -> int:
        return exact_match(v)
