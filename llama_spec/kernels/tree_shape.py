"""Tree shapes for tree proposals: parsing, layout (parents, positions, sequences), child draws.

A shape is a width per depth: ``(3, 1, 1)`` (``--spec-draft-tree 3,1,1``) means three candidates
at depth 1, then one child under each node of depth 1 and one under each of depth 2: three paths
of three tokens, 9 nodes. Node count = W1 + W1*W2 + W1*W2*W3 + ...; at most MAX_TREE_NODES.

Layout (TreeLayout, nodes in breadth-first order, siblings consecutive in draw order, so every
parent has a smaller index than its children, the order accept_tree expects):
    parent[n]   int32: -1 for a child of the root (the last emitted token), else a node index.
    depth[n]    int32: 1 for the root's children.
    paths       one tuple of node indices per root-to-leaf path; path s is sequence s.
    seq_ids     per node, the sorted sequences (paths) through it: its KV cell belongs to all of
                them (the root token belongs to every sequence), so attention over one sequence
                sees exactly the node's ancestors.
    positions(pos0) = pos0 + depth: pos0 is the root token's position (the verification batch is
                [root, node 0 .. node n - 1] at [pos0, positions]).
    ancestor_mask() bool[n, n]: [i, j] iff j is i or an ancestor of i.

Child draws without replacement (Gumbel-top-k as an exponential race): for every entry j of q's
support with q_j > 0, in support order, one uniform u_j of accept.py's xoshiro256** stream (a
drafter's own state, never the accept RNG); key_j = -log(1 - u_j) / q_j; the m smallest keys in
increasing order are the children, which is exactly m sequential draws without replacement (the
order is the draw order). Randomness consumed: one uniform per positive entry of q, whatever m.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numba
import numpy as np

from llama_spec.kernels.token import _check_rng, _inner, _next_uniform

__all__ = [
    "MAX_TREE_NODES",
    "TreeLayout",
    "build_tree",
    "draw_children",
    "gumbel_top_k_kernel",
    "parse_tree_shape",
    "tree_node_count",
    "validate_parents",
]

MAX_TREE_NODES = 64


def tree_node_count(shape: Sequence[int]) -> int:
    """Nodes of a width-per-depth shape: W1 + W1*W2 + ... (no checks)."""
    total, level = 0, 1
    for w in shape:
        level *= int(w)
        total += level
    return total


def parse_tree_shape(value: str | Sequence[int], name: str = "--spec-draft-tree") -> tuple[int, ...]:
    """'3,1,1' or (3, 1, 1) -> (3, 1, 1). ValueError naming `name` for an empty shape, a width that
    is not a positive integer, or more than MAX_TREE_NODES nodes."""
    if isinstance(value, str):
        parts = [s.strip() for s in value.split(",")]
        if not value.strip() or any(not s for s in parts):
            raise ValueError(f"{name}: expected widths like '3,1,1', got {value!r}")
        try:
            widths = [int(s) for s in parts]
        except ValueError:
            raise ValueError(f"{name}: widths must be integers, got {value!r}") from None
    else:
        items = list(value)
        if not all(isinstance(w, (int, np.integer)) and not isinstance(w, (bool, np.bool_))
                   for w in items):
            raise ValueError(f"{name}: widths must be integers, got {value!r}")
        widths = [int(w) for w in items]
    if not widths:
        raise ValueError(f"{name}: the shape has no depth")
    if any(w < 1 for w in widths):
        raise ValueError(f"{name}: every width must be >= 1, got {tuple(widths)}")
    n = tree_node_count(widths)
    if n > MAX_TREE_NODES:
        raise ValueError(f"{name}: {tuple(widths)} has {n} nodes, more than the cap of {MAX_TREE_NODES}")
    return tuple(widths)


def validate_parents(parent, name: str = "node_parent") -> np.ndarray:
    """int64 copy of a parent array after checking it: 1-D integers, parent[i] in [-1, i - 1]
    (topological order, so no cycles), at most MAX_TREE_NODES nodes."""
    a = np.asarray(parent)
    if a.ndim != 1 or (a.size and a.dtype.kind not in "iu"):
        raise ValueError(f"{name} must be a 1-D integer array, got dtype {a.dtype} shape {a.shape}")
    if a.shape[0] > MAX_TREE_NODES:
        raise ValueError(f"{name} has {a.shape[0]} nodes, more than the cap of {MAX_TREE_NODES}")
    a = a.astype(np.int64)
    bad = np.flatnonzero((a < -1) | (a >= np.arange(a.shape[0])))
    if bad.size:
        i = int(bad[0])
        raise ValueError(f"{name}[{i}] = {int(a[i])}: a parent must be -1 (the root) or an earlier "
                         f"node (0 .. {i - 1})")
    return a


@dataclass(frozen=True)
class TreeLayout:
    """A tree's structure; see the module docstring. Build with build_tree or from_parents."""

    parent: np.ndarray  # int32[n]
    depth: np.ndarray  # int32[n]
    paths: tuple[tuple[int, ...], ...]
    seq_ids: tuple[tuple[int, ...], ...]  # per node

    @property
    def n_nodes(self) -> int:
        return int(self.parent.shape[0])

    @property
    def n_seqs(self) -> int:
        return len(self.paths)

    @property
    def max_depth(self) -> int:
        return int(self.depth.max()) if self.n_nodes else 0

    @classmethod
    def from_parents(cls, parent) -> TreeLayout:
        """Layout of any tree in topological order (validate_parents' rules)."""
        par = validate_parents(parent, "parent")
        n = par.shape[0]
        depth = np.zeros(n, np.int32)
        has_kids = np.zeros(n, bool)
        for i in range(n):
            depth[i] = 1 if par[i] < 0 else depth[par[i]] + 1
            if par[i] >= 0:
                has_kids[par[i]] = True
        paths = []
        for leaf in np.flatnonzero(~has_kids).tolist():  # leaves in index order
            path = [leaf]
            while par[path[-1]] >= 0:
                path.append(int(par[path[-1]]))
            paths.append(tuple(reversed(path)))
        seqs: list[list[int]] = [[] for _ in range(n)]
        for s, nodes in enumerate(paths):
            for i in nodes:
                seqs[i].append(s)
        return cls(par.astype(np.int32), depth, tuple(paths), tuple(tuple(s) for s in seqs))

    def positions(self, pos0: int) -> np.ndarray:
        """int32[n]: position of each node when the root token sits at pos0."""
        return (int(pos0) + self.depth).astype(np.int32)

    def ancestor_mask(self) -> np.ndarray:
        """bool[n, n]: [i, j] iff j == i or j is an ancestor of i."""
        n = self.n_nodes
        mask = np.zeros((n, n), bool)
        for i in range(n):
            mask[i, i] = True
            if self.parent[i] >= 0:
                mask[i] |= mask[self.parent[i]]
        return mask


def build_tree(shape: str | Sequence[int]) -> TreeLayout:
    """The full tree of a width-per-depth shape, breadth first."""
    widths = parse_tree_shape(shape, "shape")
    parent: list[int] = []
    frontier = [-1]
    for w in widths:
        nxt = []
        for p in frontier:
            for _ in range(w):
                nxt.append(len(parent))
                parent.append(p)
        frontier = nxt
    return TreeLayout.from_parents(np.array(parent, np.int64))


@_inner
def _gumbel_top_k(q_probs, m, rng_state, out_idx):
    n = q_probs.shape[0]
    keys = np.empty(n)
    for j in range(n):
        x = np.float64(q_probs[j])
        keys[j] = -np.log(1.0 - _next_uniform(rng_state)) / x if x > 0.0 else np.inf
    order = np.argsort(keys, kind="mergesort")  # stable: ties (measure zero) by support order
    count = 0
    for j in range(min(m, n)):
        if keys[order[j]] == np.inf:
            break
        out_idx[count] = order[j]
        count += 1
    return count


@numba.njit(cache=True)
def gumbel_top_k_kernel(q_probs, m, rng_state, out_idx):
    """Indices into q's support of min(m, #positive) draws without replacement, in draw order,
    written to out_idx; returns their count. One uniform per positive q entry (module docstring)."""
    return _gumbel_top_k(q_probs, m, rng_state, out_idx)


def draw_children(q_ids, q_probs, m: int, rng_state: np.ndarray) -> np.ndarray:
    """int32 tokens of min(m, #positive) children drawn from q without replacement, in draw order.
    rng_state: the drafter's xoshiro256** state (accept.new_rng_state), advanced in place."""
    _check_rng(rng_state)
    ids = np.asarray(q_ids)
    probs = np.ascontiguousarray(q_probs, dtype=np.float32)
    if ids.ndim != 1 or ids.shape != probs.shape or (ids.size and ids.dtype.kind not in "iu"):
        raise ValueError("q_ids and q_probs must be 1-D arrays of the same length (integer ids)")
    if not np.isfinite(probs).all() or (probs < 0).any():
        raise ValueError("q_probs must be finite and non-negative")
    if isinstance(m, bool) or not isinstance(m, (int, np.integer)) or m < 0:
        raise ValueError(f"m must be a non-negative int, got {m!r}")
    out = np.empty(max(int(m), 1), np.int64)
    count = gumbel_top_k_kernel(probs, int(m), rng_state, out)
    return ids[out[:count]].astype(np.int32)
