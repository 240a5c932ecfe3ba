"""The loop's tree path: check a tree shape, draft a tree, verify it in ONE target batch, keep
the accepted path (docs/design.md invariant 7).

Target memory, one sequence per path s of the tree, numbered from the slot's base seq id b (seq
b = path 0 = the committed tokens): before the batch every path sequence gets the committed prefix
(seq_cp b -> b + s, shared cells in a unified KV cache); the batch [root, node 0 .. node n - 1] at
positions pos0 + depth puts each node's KV cell in every sequence of the paths through it, so
attention over sequence b + s sees exactly a node's ancestors. Afterwards a path through the last
accepted node is kept, the slot's other path sequences are emptied, the kept one is cut after
that node and, if it is not seq b, moved to seq b: seq b holds exactly the accepted prefix and
no other sequence of the slot holds anything. Other slots' sequences are never touched.

Recurrent and hybrid targets are refused (ValueError, before any decode): llama.cpp keeps one
recurrent state per sequence *set*, splits such batches sequentially, and refuses a token that
belongs to several sequences there (llama-batch.cpp split_equal: "sequential split is not
supported when there are coupled sequences"); see docs/trees.md.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, cast

import numpy as np

from ..drafters.tree import TreeDrafting, TreeProposal
from ..kernels.tree_shape import build_tree, parse_tree_shape, tree_node_count

if TYPE_CHECKING:
    from ..drafters.base import Drafter
    from ..llama.context import Context
    from ..llama.model import Model

__all__ = ["TreeProposal", "check_tree", "commit_tree", "propose_tree", "tree_n_seqs", "tree_rows"]


def check_tree(value: str | Sequence[int], target: Model, drafters: Sequence[Drafter | None],
               capable: Sequence[bool]) -> tuple[int, ...]:
    """The parsed shape, after checking the target and every drafter can verify it (ValueError
    naming `tree`). capable[i]: drafters[i] declares TreeDrafting (checked once by the caller)."""
    shape = parse_tree_shape(value, "tree")
    if target.is_recurrent or target.is_hybrid:
        raise ValueError(f"tree: the target {target.path} is {'hybrid ' if target.is_hybrid else ''}recurrent; "
                         "a tree needs one recurrent state per path and llama.cpp refuses a token in several "
                         "sequences of a recurrent cache (docs/trees.md)")
    for d, ok in zip(drafters, capable, strict=True):
        if d is None or not ok:
            name = "no drafter" if d is None else f"drafter {d.name!r}"
            raise ValueError(f"tree: {name} cannot draft trees (draft-simple can)")
        cast(TreeDrafting, d).enable_tree(shape)  # the drafter's own checks (draft-mtp refuses) and its context
    return shape


def tree_n_seqs(shape: Sequence[int]) -> int:
    """Sequences (paths) a full tree of `shape` needs in the target context."""
    return build_tree(shape).n_seqs


def propose_tree(drafter: TreeDrafting, history: list[int], shape: tuple[int, ...], k_cap: int, room: int,
                 p_min: float) -> TreeProposal:
    """The drafter's tree for the next verification: depth cut to k_cap, nodes to `room` KV cells."""
    shape = shape[:max(k_cap, 0)]
    while shape and tree_node_count(shape) > room:
        shape = shape[:-1]
    if not shape:
        return TreeProposal()
    return drafter.draft_tree(history, shape, p_min)


def tree_rows(ctx: Context, prop: TreeProposal, pos0: int, base: int) -> tuple[np.ndarray, list[list[int]]]:
    """Give every path sequence of the slot the committed prefix; return the batch rows' positions
    int32 (n + 1,) and seq sets for [root, nodes] at [pos0, pos0 + depth]."""
    lay = prop.layout
    n_seq = max(lay.n_seqs, 1)
    for s in range(1, n_seq):
        ctx.seq_cp(base, base + s)
    pos = np.concatenate(([pos0], lay.positions(pos0))).astype(np.int32)
    sets = [list(range(base, base + n_seq)), *([base + x for x in s] for s in lay.seq_ids)]
    return pos, sets


def commit_tree(ctx: Context, prop: TreeProposal, path: Sequence[int], pos0: int, base: int, width: int) -> None:
    """Keep [.., root, accepted path] in seq `base` and nothing in the slot's other sequences
    [base + 1, base + width) (after the rule decided `path`, the accepted nodes)."""
    lay = prop.layout
    n_acc = len(path)
    keep = base + (lay.seq_ids[path[-1]][0] if n_acc else 0)
    for s in range(base, base + width):
        if s != keep:
            ctx.seq_rm(s, -1, -1)
    ctx.seq_rm(keep, pos0 + n_acc + 1, -1)
    if keep != base:
        ctx.seq_cp(keep, base)
        ctx.seq_rm(keep, -1, -1)
