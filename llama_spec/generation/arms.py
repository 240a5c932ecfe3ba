"""The speculation controller's arms and per-slot state (controller.py defines the words).

An **arm** is plain decoding, a costly member in one draft mode, or the tree arm. Arms are ints:
member m sampled is m (>= 0), ``PLAIN`` is -1, member m in argmax mode is -(m + 2), and member m
drafting the request's tree shape is ``TREE - m`` (``tree_arm``), with the depth as its length (a
tree is verified whole: its depth is chosen before drafting, never cut after).

Trees: a request with a tree shape (``tree=``, ``--spec-draft-tree``) has one more arm:
the member that drafts trees (draft-simple, alone or in a chain) drafting that shape to depth
d = 1 .. its depth (the tree cut to d levels; cheap members are still asked first),
verified whole in 1 + nodes(d) target rows. Its survival and draft cost are its own (keyed
"draft-simple tree 2,1,1": S_tree(j) is the chance that some path reaches depth j), so

    E(d) = 1 + S_tree(1) + .. + S_tree(d),   T(d) = c(B (1 + nodes(d)), B) / B + r(1 + nodes(d)) + D_tree(d)

and plain, the member's chain (either draft mode) and the tree are chosen among, explored and
measured like any arms. A tree's depth is chosen before drafting and never cut after (a cut
would change which rows the shape's paths own); exactness as for chains: the tree rule is exact
for every shape, and a choice uses only the past.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

import numpy as np

from ..kernels.tree_shape import tree_node_count
from .draft_length import DraftLengthController

__all__ = ["PLAIN", "TREE", "Choice", "SlotState", "arm_of", "is_argmax", "is_tree", "member_of", "tree_arm",
           "tree_name", "tree_rows"]

PLAIN = -1   # the plain arm's index among a slot's arms; member m's argmax mode: arm -(m + 2)
TREE = -1_000_000   # member m's tree arm: TREE - m


def arm_of(m: int, argmax: bool) -> int:
    """The arm of member m in a draft mode (sampled: m itself)."""
    return -(m + 2) if argmax else m


def tree_arm(m: int) -> int:
    """Member m's tree arm (m drafts the request's tree shape)."""
    return TREE - m


def is_tree(arm: int) -> bool:
    return arm <= TREE


def member_of(arm: int) -> int:
    """requires: arm != PLAIN."""
    if arm <= TREE:
        return TREE - arm
    return arm if arm >= 0 else -arm - 2


def is_argmax(arm: int) -> bool:
    """The arm is a member's argmax draft mode."""
    return TREE < arm < PLAIN


def tree_name(member: str, shape: tuple[int, ...]) -> str:
    """The name a member's trees of `shape` are measured and reported under ("draft-simple tree 2,1,1")."""
    return f"{member} tree {','.join(str(w) for w in shape)}"


@dataclass
class Choice:
    """What one step of one sequence did: member (None: plain), drafts verified (a tree: its
    depth), explored."""

    member: int | None
    k: int
    explored: bool = False
    name: str | None = None     # the arm's name (the member's, "argmax" or "tree W1,W2,.." added)


@dataclass
class SlotState:
    """One slot's drafter members and its exploration state."""

    names: list[str]
    costly: list[bool]
    modes: list[bool]                                         # member -> has the argmax draft mode
    tree_member: int | None = None                            # the member that drafts trees, if any
    turns: dict[int, int] = field(default_factory=dict)       # arm -> steps it was asked (plain: ran)
    since: dict[int, int] = field(default_factory=dict)       # arm -> steps since it last ran
    len_since: dict[int, int] = field(default_factory=dict)   # member -> cuts since a longer one was tried
    clock: float = 0.0                                        # predicted seconds of its steps so far
    ran_at: dict[int, float] = field(default_factory=dict)    # arm -> clock when it last ran
    len_at: dict[int, float] = field(default_factory=dict)    # member -> clock at its last longer cut
    last_drafted: dict[int, int] = field(default_factory=dict)  # member -> history length at its last draft
    longest: dict[int, int] = field(default_factory=dict)       # member -> its longest chain proposal so far
    last_full: bool = False
    last_cut: tuple[int, int] | None = None   # (arm, k) of the last verification when it kept all k
    sweep_i: int = 0
    plan: Any = None   # its current controller.Plan (Any: arms.py imports nothing of the controller's)
    local: DraftLengthController | None = None   # the request's survival (SpecController.begin_request)
    best: tuple[Any, dict[int, tuple[int, float, float, float]]] | None = None   # (key, Plan._best)


@lru_cache(maxsize=64)
def tree_rows(shape: tuple[int, ...]) -> np.ndarray:
    """Nodes of `shape` cut to depth 0 .. len(shape) (the target rows of a depth d tree, minus 1),
    read only; computed once per shape (a plan asks every step)."""
    rows = np.array([tree_node_count(shape[:j]) for j in range(len(shape) + 1)])
    rows.flags.writeable = False
    return rows
