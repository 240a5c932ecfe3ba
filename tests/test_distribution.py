"""Invariant 1 end to end on a real pair: Qwen2.5-Coder 1.5B <- 0.5B at temperature 1.0.

The joint distribution of the first two tokens the verifier decides, over N seeds, rejection
rule vs plain sampling, must be indistinguishable by a chi-square test of homogeneity; the same
test must flag a deliberately broken rule (recover from p instead of the residual).

Threshold: p-value > 5e-5. Under a correct implementation the p-value is uniform, so the test
fails with probability 5e-5 (< 1 in 10,000). Power: the broken rule shifts mass by
(1 - acceptance) * (p - residual), large at the first draft position here; at N = 300 per arm the
fixed seeds below give p-values many orders below the threshold (measured: see
scripts/dist_check.py, which runs the same check at N = 2,000).

N is small in the suite (2 cores, minutes); scripts/dist_check.py runs the full N.
"""

from __future__ import annotations

import os

import pytest

from llama_spec import DraftModelDrafter, SamplerParams, SpeculativeGenerator
from llama_spec.testing import distribution as dist

N = int(os.environ.get("LLAMA_SPEC_DIST_N", "300"))
PROMPT = "Tell me a short story about a cat who"
SAMPLING = SamplerParams(temp=1.0, top_k=40, top_p=1.0, min_p=0.0)
THRESHOLD = 5e-5


@pytest.fixture(scope="module")
def gens(qwen15, qwen05):
    spec = SpeculativeGenerator(qwen15, DraftModelDrafter(qwen05, n_ctx=256), n_ctx=256, n_max=3)
    plain = SpeculativeGenerator(qwen15, None, n_ctx=256)
    yield spec, plain
    spec.close()
    plain.close()


def test_rejection_rule_matches_plain_sampling_and_broken_rule_is_caught(gens, monkeypatch):
    spec, plain = gens
    ref = dist.joint_samples(plain, PROMPT, range(N), sampling=SAMPLING, n_predict=3)  # tokens 2-3 suffice
    new = dist.joint_samples(spec, PROMPT, range(10_000, 10_000 + N), sampling=SAMPLING, spec_draft_sample=True)
    p_ok, cells = dist.homogeneity_pvalue(ref, new)
    assert cells >= 5
    assert spec.total.drafted > 0
    assert p_ok > THRESHOLD, (p_ok, cells)

    import llama_spec.speculative as sp

    monkeypatch.setattr(sp._accept, "accept_step_kernel", dist.broken_accept_step)
    bad = dist.joint_samples(spec, PROMPT, range(20_000, 20_000 + N), sampling=SAMPLING, spec_draft_sample=True)
    p_bad, _ = dist.homogeneity_pvalue(ref, bad)
    assert p_bad < THRESHOLD, p_bad
