"""Driving one plan of the speculation controller: draft as it asks, each member timed, then keep
the prefix it chooses (controller.py says what a plan decides and why)."""

from __future__ import annotations

import time
from typing import cast

from ..drafters.base import Drafter, Proposal
from ..drafters.tree import TreeDrafting
from .controller import Plan
from .tree import propose_tree

__all__ = ["keep", "run_plan", "set_mode"]


def run_plan(plan: Plan, drafter: Drafter, history: list[int], p_min: float, room: int = 0) -> Proposal:
    """Draft as `plan` asks (each member timed), then keep the prefix ``plan.finish`` chooses; the
    tree arm's ask drafts the request's tree (at most `room` KV cells) into ``plan.tree_drafted``,
    verified whole (the proposal returned is then empty)."""
    prop = Proposal()
    while (ask := plan.next_ask()) is not None:
        if len(prop):   # the plan drops the draft in hand for a model member's
            drafter.truncated(0)
            prop = Proposal()
        m, cap = ask
        set_mode(plan, drafter.members()[m], m)
        if plan.tree_ask(m):
            return _draft_tree(plan, cast(TreeDrafting, drafter), m, cap, history, room, p_min)
        drafter.members()[m].prepare()
        t0 = time.perf_counter()
        got = drafter.draft_member(m, history, cap, p_min)
        plan.drafted(m, len(got), time.perf_counter() - t0)
        if len(got):
            prop = got
    return keep(plan, drafter, prop)


def set_mode(plan: Plan, member: Drafter, m: int) -> None:
    """Before member m drafts: its draft mode for this step (a member with ``draft_modes``)."""
    if member.draft_modes:
        member.sample_drafts = plan.sample_for(m)


def keep(plan: Plan, drafter: Drafter, prop: Proposal) -> Proposal:
    """`prop` cut to the drafts ``plan.finish`` verifies (the drafter is told of a cut); the first
    draft cut off is kept in ``plan.dropped`` (the controller checks it against the token emitted)."""
    k = plan.finish(len(prop))
    if k < len(prop):
        plan.dropped = int(prop.tokens[k])
        drafter.truncated(k)
        prop.truncate(k)
    return prop


def _draft_tree(plan: Plan, drafter: TreeDrafting, m: int, depth: int, history: list[int], room: int,
                p_min: float) -> Proposal:
    """Member m's tree (the plan's tree_ask), timed, into ``plan.tree_drafted`` (None: nothing drafted)."""
    t0 = time.perf_counter()
    tree = propose_tree(drafter, history, plan.tree, depth, room, p_min)
    plan.drafted(m, tree.depth, time.perf_counter() - t0)
    plan.tree_drafted = tree if plan.finish(tree.depth) else None
    return Proposal()
