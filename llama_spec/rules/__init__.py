"""Verification rules: exact-match, token and block, behind one interface (see rules.base)."""

from __future__ import annotations

from .base import RULE_NAMES, Rule, Verification, VerifyName, choose, exact_match, p_falls_back
from .block import BlockRule
from .exact import ExactMatchRule
from .token import TokenRule

__all__ = ["RULE_NAMES", "BlockRule", "ExactMatchRule", "Rule", "TokenRule", "Verification", "VerifyName",
           "choose", "exact_match", "make_rules", "p_falls_back"]


def make_rules() -> dict[str, Rule]:
    """One instance of each built-in rule, by name (a generator owns its set: rules keep scratch)."""
    return {"token": TokenRule(), "block": BlockRule(), "exact-match": ExactMatchRule()}
