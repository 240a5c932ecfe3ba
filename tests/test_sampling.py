"""The sampler fast paths give exactly what the full llama.cpp chain gives.

TargetSampler and the drafters' MirrorSampler skip the full-vocabulary candidate array when the
chain allows it: a bare greedy chain is an argmax, and a chain whose first cut is top-k starts
from the k largest logits (lsp_candidates_init_top_k). Each test runs the fast sampler beside a
reference with the fast path switched off, on the same rows and seeds, and asserts identical p
(ids and float32 probabilities) and identical dist draws.
"""

from __future__ import annotations

import numpy as np
import pytest

from llama_spec import SamplerParams
from llama_spec._ffi import ffi, lib
from llama_spec.drafters.mirror import MirrorSampler, mirror_params
from llama_spec.llama.sampling import TargetSampler, ignore_eos_params

PARAMS = [
    SamplerParams(seed=7),  # llama.cpp defaults: top-k 40, top-p 0.95, min-p 0.05, temp 0.8
    SamplerParams(temp=1.0, top_k=5, top_p=0.9, min_p=0.1, seed=8),
    SamplerParams(temp=0.7, top_k=100, top_p=1.0, min_p=0.0, typical_p=0.9, seed=9),
    SamplerParams(temp=1.3, top_k=64, xtc_probability=0.5, xtc_threshold=0.05, seed=10),
    SamplerParams(temp=0.9, top_k=200, dynatemp_range=0.5, min_keep=3, seed=11),
]


def _rows(model, n: int = 40, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [(rng.standard_normal(model.n_vocab) * rng.uniform(1, 6)).astype(np.float32) for _ in range(n)]


@pytest.mark.parametrize("params", PARAMS, ids=lambda p: f"k{p.top_k}-T{p.temp}")
def test_top_k_prefilter_equals_full_chain(smollm, params):
    fast = TargetSampler(smollm, params)
    ref = TargetSampler(smollm, params)
    ref._prefilter_k = 0
    assert fast._prefilter_k == params.top_k
    for row in _rows(smollm):
        ids_f, p_f = (a.copy() for a in fast.candidates(row))
        ids_r, p_r = ref.candidates(row)
        np.testing.assert_array_equal(ids_f, ids_r)
        np.testing.assert_array_equal(p_f, p_r)
        _, _, s_f = fast.candidates_and_sample(row)
        _, _, s_r = ref.candidates_and_sample(row)
        assert s_f == s_r
        t_f, t_r = fast.sample(row), ref.sample(row)
        assert t_f == t_r
        fast.accept(t_f)
        ref.accept(t_r)


@pytest.mark.parametrize(
    "params",
    [
        SamplerParams(penalty_repeat=1.3),
        SamplerParams(logit_bias=((5, 100.0),)),
        SamplerParams(dry_multiplier=0.8),
        SamplerParams(top_n_sigma=1.5),
        SamplerParams(top_k=0),
        SamplerParams(grammar='root ::= "yes" | "no"'),
    ],
    ids=["penalties", "logit-bias", "dry", "top-n-sigma", "no-top-k", "grammar"],
)
def test_prefilter_is_off_when_something_runs_before_top_k(smollm, params):
    s = TargetSampler(smollm, params)
    assert s._prefilter_k == 0
    if params.logit_bias:
        # the case that would break: a low-logit token pushed to the top by its bias
        row = _rows(smollm, 1)[0]
        row[5] = row.min()
        ids, probs = s.candidates(row)
        assert int(ids[np.argmax(probs)]) == 5


def test_greedy_argmax_path_equals_greedy_chain(smollm):
    fast = TargetSampler(smollm, SamplerParams(temp=0.0))
    ref = TargetSampler(smollm, SamplerParams(temp=0.0))
    ref._argmax_only = False
    assert fast._argmax_only
    rows = _rows(smollm, 20)
    tie = rows[0].copy()
    j = int(np.argmax(tie))
    tie[j + 1 :][:3] = tie[j]  # three later tokens tie with the max: the first index wins
    for row in [*rows, tie]:
        assert fast.sample(row) == ref.sample(row) == int(np.argmax(row))
        ids, probs = fast.candidates(row)
        assert ids.tolist() == [int(np.argmax(row))] and probs.tolist() == [1.0]
    assert not TargetSampler(smollm, SamplerParams(temp=0.0, penalty_repeat=1.2))._argmax_only


@pytest.mark.parametrize("params", [SamplerParams(temp=0.0), PARAMS[0], PARAMS[1], SamplerParams(temp=0.8, top_k=0, seed=12)],
                         ids=["greedy", "defaults", "k5", "k-off"])
def test_ignore_eos_bans_every_eog_token_and_fast_paths_equal_the_chain(smollm, params):
    """ignore_eos = llama.cpp's --ignore-eos: -inf bias on every EOG token. The fast paths apply
    the bans to a copy of the row; a reference with an extra 0.0 bias (which forces the full
    chain, logit-bias member first) must give the same p and draws."""
    eog = smollm.eog_tokens
    assert eog and all(smollm.is_eog(t) for t in eog) and smollm.token_eos in eog
    banned = ignore_eos_params(params, smollm)
    assert {t for t, b in banned.logit_bias} == set(eog) and ignore_eos_params(banned, smollm) == banned
    fast = TargetSampler(smollm, banned)
    ref = TargetSampler(smollm, banned.replace(logit_bias=banned.logit_bias + ((11, 0.0),)))
    assert (fast._argmax_only or fast._prefilter_k or params.top_k == 0) and not ref._argmax_only
    assert ref._prefilter_k == 0
    rows = _rows(smollm, 30, seed=3)
    for row in rows:  # an EOG token on top of every row: it must never come out
        row[eog[0]] = row.max() + 10.0
    for row in rows:
        keep = row.copy()
        ids_f, p_f = (a.copy() for a in fast.candidates(row))
        ids_r, p_r = ref.candidates(row)
        np.testing.assert_array_equal(row, keep)  # the caller's row is not edited
        np.testing.assert_array_equal(ids_f, ids_r)
        np.testing.assert_array_equal(p_f, p_r)
        assert not set(ids_f[p_f > 0].tolist()) & set(eog)
        t_f, t_r = fast.sample(row), ref.sample(row)
        assert t_f == t_r and t_f not in eog
        fast.accept(t_f)
        ref.accept(t_r)
    plain = TargetSampler(smollm, params)  # without the bans the EOG token wins the greedy row
    if params.greedy:
        assert plain.sample(rows[0]) == eog[0]


def test_candidates_init_top_k_breaks_ties_by_lower_id(smollm):
    n = smollm.n_vocab
    row = np.full(n, -5.0, dtype=np.float32)
    row[[100, 7, 3000, 50, 9]] = [2.0, 3.0, 3.0, 1.0, 1.0]  # ties at 3.0 and at the cut (1.0)
    buf = ffi.new("llama_token_data[]", n)
    cur = ffi.new("llama_token_data_array *")
    k = lib.lsp_candidates_init_top_k(ffi.cast("float *", row.ctypes.data), n, 4, buf, cur)
    assert k == 4 and cur.size == 4 and cur.sorted
    assert [buf[i].id for i in range(4)] == [7, 3000, 100, 9]
    assert [buf[i].logit for i in range(4)] == [3.0, 3.0, 2.0, 1.0]
    ids = np.zeros(8, dtype=np.int32)
    vals = np.zeros(8, dtype=np.float32)
    assert lib.lsp_top_n(ffi.cast("float *", row.ctypes.data), n, 8,
                         ffi.cast("int32_t *", ids.ctypes.data), ffi.cast("float *", vals.ctypes.data)) == 8
    assert ids[:5].tolist() == [7, 3000, 100, 9, 50]
    assert ids[5:].tolist() == [0, 1, 2]  # then the -5.0 plateau, lowest ids first


@pytest.mark.parametrize("params", PARAMS[:2] + [SamplerParams(temp=0.8, top_k=0, top_p=0.9)],
                         ids=["defaults", "k5", "k-off"])
def test_mirror_sampler_q_equals_full_chain_p(smollm, params):
    """q is what llama.cpp's chain with the mirrored knobs gives on the full vocabulary."""
    mirror = MirrorSampler(smollm.n_vocab, smollm, seed=3)
    mirror.configure(params)
    ref = TargetSampler(smollm, mirror_params(params))
    ref._prefilter_k = 0
    for row in _rows(smollm, 20, seed=1):
        tok, q_ids, q_probs, _, _ = mirror.sample(row)
        ids, probs = ref.candidates(row)
        keep = probs > 0
        np.testing.assert_array_equal(q_ids, ids[keep])
        np.testing.assert_array_equal(q_probs, probs[keep])
        assert tok in q_ids.tolist()
