"""The loop's tree path: check a tree shape, draft a tree, verify it in ONE target batch, keep
the accepted path (docs/design.md invariant 7).

Target memory, one sequence per path s of the tree (seq 0 = path 0 = the committed tokens):
before the batch every path sequence gets the committed prefix (seq_cp 0 -> s, shared cells in a
unified KV cache); the batch [root, node 0 .. node n - 1] at positions pos0 + depth puts each
node's KV cell in every sequence of the paths through it, so attention over sequence s sees
exactly a node's ancestors. Afterwards a path through the last accepted node is kept
(seq_keep), cut after that node (seq_rm) and, if it is not seq 0, moved to seq 0: seq 0 holds
exactly the accepted prefix and no other sequence holds anything.

Recurrent and hybrid targets are refused (ValueError, before any decode): llama.cpp keeps one
recurrent state per sequence *set*, splits such batches sequentially, and refuses a token that
belongs to several sequences there (llama-batch.cpp split_equal: "sequential split is not
supported when there are coupled sequences"); see docs/trees.md.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from .drafters.tree import TreeProposal
from .tree_shape import build_tree, parse_tree_shape, tree_node_count

if TYPE_CHECKING:
    from .context import Context
    from .drafters.base import Drafter
    from .model import Model

__all__ = ["TreeProposal", "check_tree", "commit_tree", "decode_tree", "propose_tree", "tree_n_seqs"]


def check_tree(value: str | Sequence[int], target: Model, drafter: Drafter | None) -> tuple[int, ...]:
    """The parsed shape, after checking the target and drafter can verify it (ValueError naming `tree`)."""
    shape = parse_tree_shape(value, "tree")
    if target.is_recurrent or target.is_hybrid:
        raise ValueError(f"tree: the target {target.path} is {'hybrid ' if target.is_hybrid else ''}recurrent; "
                         "a tree needs one recurrent state per path and llama.cpp refuses a token in several "
                         "sequences of a recurrent cache (docs/trees.md)")
    enable = getattr(drafter, "enable_tree", None)
    if drafter is None or enable is None or getattr(drafter, "draft_tree", None) is None:
        name = "no drafter" if drafter is None else f"drafter {drafter.name!r}"
        raise ValueError(f"tree: {name} cannot draft trees (draft-simple can)")
    enable(shape)  # the drafter's own checks (draft-mtp refuses) and its context
    return shape


def tree_n_seqs(shape: Sequence[int]) -> int:
    """Sequences (paths) a full tree of `shape` needs in the target context."""
    return build_tree(shape).n_seqs


def propose_tree(drafter: Drafter, history: list[int], shape: tuple[int, ...], k_cap: int, room: int,
                 p_min: float) -> TreeProposal:
    """The drafter's tree for the next verification: depth cut to k_cap, nodes to `room` KV cells."""
    shape = shape[:max(k_cap, 0)]
    while shape and tree_node_count(shape) > room:
        shape = shape[:-1]
    if not shape:
        return TreeProposal()
    return drafter.draft_tree(history, shape, p_min)  # type: ignore[attr-defined]


def decode_tree(ctx: Context, prop: TreeProposal, root: int, pos0: int) -> tuple[np.ndarray, np.ndarray]:
    """One target batch [root, nodes] at [pos0, pos0 + depth]; returns (batch int32, logits (n + 1, n_vocab))."""
    lay = prop.layout
    n_seq = max(lay.n_seqs, 1)
    for s in range(1, n_seq):
        ctx.seq_cp(0, s)
    batch = np.asarray([root, *prop.tokens], dtype=np.int32)
    pos = np.concatenate(([pos0], lay.positions(pos0))).astype(np.int32)
    sets = [list(range(n_seq)), *(list(s) for s in lay.seq_ids)]
    return batch, ctx.decode_seq_sets(batch, pos, sets, "all")


def commit_tree(ctx: Context, prop: TreeProposal, pos0: int) -> None:
    """Keep [.., root, accepted path] in seq 0 and nothing else (after the rule filled prop.path)."""
    lay = prop.layout
    n_acc = len(prop.path)
    keep = lay.seq_ids[prop.path[-1]][0] if n_acc else 0
    ctx.seq_keep(keep)
    ctx.seq_rm(keep, pos0 + n_acc + 1, -1)
    if keep != 0:
        ctx.seq_cp(keep, 0)
        ctx.seq_rm(keep, -1, -1)
