"""Tree shapes: parsing, layout (parents, depths, paths, sequences, positions, ancestor mask),
and the Gumbel-top-k child draw (its law is sequential drawing without replacement)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from scipy import stats

from llama_spec.kernels import token as A
from llama_spec.kernels.tree_shape import (
    MAX_TREE_NODES,
    TreeLayout,
    build_tree,
    draw_children,
    parse_tree_shape,
    tree_node_count,
    validate_parents,
)


def test_parse_strings_and_tuples():
    assert parse_tree_shape("3,1,1") == (3, 1, 1)
    assert parse_tree_shape(" 2, 2 ") == (2, 2)
    assert parse_tree_shape((4,)) == (4,)
    assert parse_tree_shape([np.int64(2), 1]) == (2, 1)
    assert tree_node_count((3, 1, 1)) == 9 and tree_node_count((2, 2, 1)) == 10
    assert parse_tree_shape((64,)) == (64,) and parse_tree_shape("4,3,3") == (4, 3, 3)  # 4+12+36


@pytest.mark.parametrize("bad", ["", "3,,1", "3,0,1", "0", "-1", "2.5", "a,b", "8,8", "4,4,4",
                                 (), (3, 0), (2.0,), (True,), ("3",), (65,)])
def test_parse_rejects_bad_shapes_naming_the_argument(bad):
    with pytest.raises(ValueError, match="--spec-draft-tree"):
        parse_tree_shape(bad)
    with pytest.raises(ValueError, match="tree="):
        parse_tree_shape(bad, name="tree=")


def test_layout_of_3_1_1():
    lay = build_tree("3,1,1")
    assert lay.parent.tolist() == [-1, -1, -1, 0, 1, 2, 3, 4, 5]
    assert lay.depth.tolist() == [1, 1, 1, 2, 2, 2, 3, 3, 3]
    assert lay.paths == ((0, 3, 6), (1, 4, 7), (2, 5, 8))
    assert lay.seq_ids == ((0,), (1,), (2,), (0,), (1,), (2,), (0,), (1,), (2,))
    assert lay.positions(10).tolist() == [11, 11, 11, 12, 12, 12, 13, 13, 13]
    assert lay.n_seqs == 3 and lay.max_depth == 3 and lay.n_nodes == 9


def test_layout_of_2_2_shares_cells_between_sequences():
    lay = build_tree((2, 2))
    assert lay.parent.tolist() == [-1, -1, 0, 0, 1, 1]
    assert lay.paths == ((0, 2), (0, 3), (1, 4), (1, 5))
    assert lay.seq_ids[0] == (0, 1) and lay.seq_ids[1] == (2, 3) and lay.seq_ids[5] == (3,)
    mask = lay.ancestor_mask()
    # every node sees exactly itself and its ancestors; via sequences: the nodes sharing a seq
    for i in range(lay.n_nodes):
        anc = {j for j in range(lay.n_nodes) if mask[i, j]}
        want = {i}
        j = int(lay.parent[i])
        while j >= 0:
            want.add(j)
            j = int(lay.parent[j])
        assert anc == want
        # a node j is visible to i iff j's seq set contains all of i's seqs (j on every path of i)
        via_seq = {j for j in range(lay.n_nodes) if set(lay.seq_ids[i]) <= set(lay.seq_ids[j])}
        assert via_seq == want


def test_from_parents_general_tree_and_malformed_parents():
    lay = TreeLayout.from_parents([-1, 0, 0, -1, 2])
    assert lay.paths == ((0, 1), (3,), (0, 2, 4))  # one per leaf, leaves in index order
    assert lay.depth.tolist() == [1, 2, 2, 1, 3]
    for bad, where in (([0], "[0]"), ([-1, 1], "[1]"), ([-1, -2], "[1]"), ([-1, 0, 5], "[2]")):
        with pytest.raises(ValueError, match=r"parent\[" + where[1:-1]):
            TreeLayout.from_parents(bad)
    with pytest.raises(ValueError, match="cap of 64"):
        validate_parents(np.full(MAX_TREE_NODES + 1, -1))
    with pytest.raises(ValueError, match="integer"):
        validate_parents(np.array([-1.0]))
    assert TreeLayout.from_parents([]).n_seqs == 0


def test_gumbel_top_k_is_sequential_sampling_without_replacement():
    """Law of the ordered pair of draws == q(a) q(b) / (1 - q(a)); chi-square at 1e-4 (one test)
    on 60,000 draws; also: one uniform per positive q entry, zeros never drawn, m > #positive."""
    ids = np.array([10, 11, 12, 13, 14], np.int32)
    q = np.array([0.5, 0.25, 0.15, 0.1, 0.0], np.float32)
    state = A.new_rng_state(3)
    n = 60_000
    pairs = [tuple(draw_children(ids, q, 2, state).tolist()) for _ in range(n)]
    cells = list(itertools.permutations(range(4), 2))
    qq = q.astype(np.float64) / q.astype(np.float64).sum()
    law = np.array([qq[a] * qq[b] / (1 - qq[a]) for a, b in cells])
    expected = law / law.sum() * n  # sums to 1 up to rounding
    counts = {c: 0 for c in cells}
    for a, b in pairs:
        counts[(a - 10, b - 10)] += 1
    assert sum(counts.values()) == n  # token 14 (q = 0) never drawn
    assert stats.chisquare([counts[c] for c in cells], expected).pvalue > 1e-4
    # RNG contract: 4 uniforms (positive entries), whatever m
    s1, s2 = A.new_rng_state(9), A.new_rng_state(9)
    draw_children(ids, q, 1, s1)
    draw_children(ids, q, 4, s2)
    assert np.array_equal(s1, s2)
    s3 = A.new_rng_state(9)
    for _ in range(4):
        A.bonus_token_kernel(ids, np.full(5, 0.2, np.float32), s3)  # one uniform each
    assert np.array_equal(s1, s3)
    assert sorted(draw_children(ids, q, 9, state).tolist()) == [10, 11, 12, 13]
    assert draw_children(ids, q, 0, state).size == 0
    with pytest.raises(ValueError):
        draw_children(ids, q, -1, state)
    with pytest.raises(ValueError):
        draw_children(ids, -q, 2, state)
