"""Tree proposals: several candidate continuations verified in one target batch (docs/design.md words).

A :class:`TreeProposal` has **nodes** (token, parent) in breadth-first order, siblings consecutive
in draw order, and per *row* (row 0 = the root, the last emitted token; row i + 1 = node i) the q
over its support from which that row's children were drawn (None for rows without children, or
for deterministic trees). Children of a row are drawn from q *without replacement*: one child is
the mirrored sampler's own draw (so a width-1 tree drafts exactly what the chain drafts), m >= 2
children are a Gumbel-top-k draw (tree_shape.draw_children) from the drafter's own tree RNG.
Greedy targets and the exact-match switch get deterministic trees: the drafter's top-m tokens,
no q (the tree rule then walks the tree with the target's own samples).

:class:`TreeBuilder` builds one depth at a time from logits rows; the model drafters decode each
depth's nodes in one batch (draft-simple: one sequence per path of the full shape).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

import numpy as np

from ..kernels.token import new_rng_state
from ..kernels.tree_shape import TreeLayout, build_tree, draw_children
from .base import TOPK_WIDTH
from .mirror import MirrorSampler

_TREE_SEED_SALT = 0x7EE5_D0C5  # the tree RNG (sibling draws) is seeded apart from the mirror's


@dataclass
class TreeProposal:
    """Nodes of a tree draft; see the module docstring. It declares Proposal's interface (tokens,
    q_ids/q_probs per node, has_q, q_grammar_masked, topk_*, depth); the tree rule's outcome is a
    TreeOutcome of the verification, not a field of the proposal."""

    tokens: list[int] = field(default_factory=list)            # node tokens, breadth first
    parent: list[int] = field(default_factory=list)            # -1 = child of the root
    row_q_ids: list[np.ndarray | None] = field(default_factory=lambda: [None])    # per row (n + 1)
    row_q_probs: list[np.ndarray | None] = field(default_factory=lambda: [None])  # per row (n + 1)
    children: list[list[int]] = field(default_factory=lambda: [[]])  # per row: node indices, draw order
    sampled: bool = True        # children drawn from q (False: deterministic top-m, no q)
    q_grammar_masked: bool = False
    # top-k candidates along the first-child chain (what a chain draft would have had), per depth
    topk_ids: list[np.ndarray] | None = None
    topk_probs: list[np.ndarray] | None = None
    _layout: TreeLayout | None = field(default=None, repr=False)

    is_tree = True

    def __len__(self) -> int:
        return len(self.tokens)

    @property
    def q_ids(self) -> list[np.ndarray] | None:
        """Per node: q at its parent (shared by siblings); None for deterministic trees."""
        if not self.sampled:
            return None
        return [self.row_q_ids[p + 1] for p in self.parent]  # type: ignore[misc]

    @property
    def q_probs(self) -> list[np.ndarray] | None:
        if not self.sampled:
            return None
        return [self.row_q_probs[p + 1] for p in self.parent]  # type: ignore[misc]

    @property
    def has_q(self) -> bool:
        return self.sampled and all(self.row_q_ids[p + 1] is not None for p in self.parent)

    @property
    def layout(self) -> TreeLayout:
        if self._layout is None:
            self._layout = TreeLayout.from_parents(np.asarray(self.parent, dtype=np.int64))
        return self._layout

    @property
    def depth(self) -> int:
        return self.layout.max_depth

    def add_node(self, token: int, parent: int) -> int:
        """Append a node under `parent` (-1 = the root); returns its index."""
        i = len(self.tokens)
        self.tokens.append(int(token))
        self.parent.append(int(parent))
        self.children[parent + 1].append(i)
        self.children.append([])
        self.row_q_ids.append(None)
        self.row_q_probs.append(None)
        self._layout = None
        return i


@runtime_checkable
class TreeDrafting(Protocol):
    """Capability: the drafter drafts tree proposals (draft-simple does)."""

    def enable_tree(self, shape: tuple[int, ...]) -> None:
        """Before any decode of a request with this shape: ValueError when it cannot branch."""
        ...

    def draft_tree(self, history: list[int], shape: tuple[int, ...], p_min: float) -> TreeProposal:
        """A tree proposal of `shape` continuing `history`."""
        ...


class TreeBuilder:
    """Builds one tree proposal, depth by depth, from the drafter's logits rows (one per row)."""

    def __init__(self, mirror: MirrorSampler, shape: Sequence[int], rng: np.ndarray, *, sample: bool,
                 collect_topk: bool, p_min: float) -> None:
        self.mirror, self.shape, self.rng = mirror, tuple(shape), rng
        params = mirror.params
        self.sample = bool(sample) and params is not None and not params.greedy
        self.collect_topk, self.p_min = collect_topk, p_min
        self.full = build_tree(self.shape)   # the full shape: node -> sequences of its paths
        self.prop = TreeProposal(sampled=self.sample)
        if collect_topk:
            self.prop.topk_ids, self.prop.topk_probs = [], []
        self.full_of: list[int] = []          # realized node -> node of the full shape
        self._full_kids = [[j for j in range(self.full.n_nodes) if self.full.parent[j] == r - 1]
                           for r in range(self.full.n_nodes + 1)]

    def expand(self, row: int, logits: np.ndarray, width: int) -> list[int]:
        """Children of `row` (0 = root, i + 1 = node i) from its logits row; returns new node indices."""
        prop = self.prop
        first_chain = row == 0 or (row - 1 in self._chain_nodes())
        topk = TOPK_WIDTH if self.collect_topk and first_chain else 0
        if self.sample or self.p_min > 0 or topk:
            draw = self.mirror.sample(logits, topk=topk)
            assert draw is not None  # None only under a grammar, which tree drafting does not pass
            tok, q_ids, q_probs, top_ids, top_p = draw
            if q_probs.max() < self.p_min:
                return []
            if topk and prop.topk_ids is not None and prop.topk_probs is not None and top_ids is not None \
                    and top_p is not None:
                prop.topk_ids.append(top_ids)
                prop.topk_probs.append(top_p)
        if self.sample:
            kids = [tok] if width == 1 else draw_children(q_ids, q_probs, width, self.rng).tolist()
            prop.row_q_ids[row], prop.row_q_probs[row] = q_ids, q_probs
        else:  # deterministic: the drafter's top-m tokens by logit
            m = min(width, logits.shape[0])
            top = np.argpartition(-logits, m - 1)[:m] if m < logits.shape[0] else np.arange(m)
            kids = top[np.argsort(-logits[top], kind="stable")].tolist()
        full_parent = -1 if row == 0 else self.full_of[row - 1]
        out = []
        for j, t in enumerate(kids):
            out.append(prop.add_node(int(t), row - 1))
            self.full_of.append(self._full_kids[full_parent + 1][j])
        return out

    def _chain_nodes(self) -> set[int]:
        """Nodes on the first-child chain from the root."""
        out, r = set(), 0
        while self.prop.children[r]:
            c = self.prop.children[r][0]
            out.add(c)
            r = c + 1
        return out

    def seq_sets(self, nodes: Sequence[int], offset: int = 0) -> list[list[int]]:
        """Per node, the sequences (paths of the full shape, + offset) its KV cell belongs to."""
        return [[s + offset for s in self.full.seq_ids[self.full_of[i]]] for i in nodes]


def new_tree_rng(seed: int) -> np.ndarray:
    """The drafter's tree RNG (sibling draws), apart from the mirror's and the accept RNG."""
    return new_rng_state((int(seed) ^ _TREE_SEED_SALT) & 0xFFFFFFFF)
