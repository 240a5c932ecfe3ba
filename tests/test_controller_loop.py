"""The speculation controller in the step core, with models (unit tests: tests/test_controller.py).

What must hold whatever it decides: the output distribution is the target's (invariant 1) with
auto on, also when the decision depends on the emitted tokens themselves; greedy output equals
plain decoding; a drafter that sat out many plain steps accepts as before when it resumes; with
auto=False a seeded run repeats token for token and nothing is decided.
"""

from __future__ import annotations

import pytest

from llama_spec import DraftModelDrafter, Model, MtpDrafter, SamplerParams, SpeculativeGenerator
from llama_spec.drafters.ngram import build_ngram_drafter
from llama_spec.generation import core as core_mod
from llama_spec.generation.plan_driver import keep
from llama_spec.testing import distribution as dist
from llama_spec.testing.resume import KINDS, PROMPT, resume_check

THRESHOLD = 1e-4
SAMPLING = SamplerParams(temp=1.0, top_k=40, top_p=1.0, min_p=0.0)
N_DIST = 2000
SYNTH_PROMPT = "Once upon a time"


@pytest.fixture(scope="module")
def synth():
    from llama_spec.testing.synthetic_mtp import synthetic_mtp_path

    m = Model(synthetic_mtp_path(sigma=0.02, seed=0), load_mtp=True, repack=False)
    spec = SpeculativeGenerator(m, MtpDrafter(m, n_ctx=128), n_ctx=128, n_max=3, auto=True)
    plain = SpeculativeGenerator(m, None, n_ctx=128)
    ref = dist.joint_samples(plain, SYNTH_PROMPT, range(N_DIST), sampling=SAMPLING, n_predict=2)
    yield spec, ref
    spec.close()
    plain.close()
    m.close()


def test_auto_keeps_the_output_distribution(synth):
    """(t0, t1) with auto on (t1's step: plain or 1-3 drafts, sampled or argmax, by measured time
    and acceptance) = plain sampling."""
    spec, ref = synth
    s0 = spec.total.auto_steps
    new = dist.joint_samples(spec, SYNTH_PROMPT, range(10_000, 10_000 + N_DIST), sampling=SAMPLING, n_predict=5)
    assert spec.total.auto_steps - s0 >= N_DIST
    by = spec.total.auto_by_drafter
    assert by.get("draft-mtp", 0) > 0 and by.get("draft-mtp argmax", 0) > 0, by   # both draft modes ran
    p, cells = dist.homogeneity_pvalue(ref, new)
    assert cells >= 20
    assert p > THRESHOLD, (p, cells)


def test_a_decision_that_depends_on_the_emitted_token_keeps_the_distribution(synth, monkeypatch):
    """The harshest past-dependent choice: plain when t0 is even, drafts when it is odd."""
    spec, ref = synth
    real = core_mod.run_plan

    def by_parity(plan, drafter, history, p_min, room=0):
        if history[-1] % 2 == 0:
            while plan.next_ask() is not None:
                pass
            return keep(plan, drafter, core_mod.Proposal())
        return real(plan, drafter, history, p_min, room)

    monkeypatch.setattr(core_mod, "run_plan", by_parity)
    d0, p0 = spec.total.drafted, spec.total.auto_plain
    new = dist.joint_samples(spec, SYNTH_PROMPT, range(30_000, 30_000 + N_DIST), sampling=SAMPLING, n_predict=5)
    assert spec.total.drafted > d0 and spec.total.auto_plain > p0    # both branches ran
    p, cells = dist.homogeneity_pvalue(ref, new)
    assert cells >= 20
    assert p > THRESHOLD, (p, cells)


N_PLAIN = 120  # the 500 takes 4x as long here (scripts/resume_check.py); a stale drafter fails at 120 too
N_DRAFT = 16


@pytest.mark.parametrize("kind", KINDS)
def test_a_drafter_resumed_after_many_plain_steps_accepts_as_before(smollm, kind):
    """Draft N_DRAFT steps, then N_PLAIN plain steps (no draft: its KV / index is not fed), then
    draft again: acceptance after the rest matches a drafter that never sat out, on the same text
    (greedy: the same tokens; llama_spec/testing/resume.py)."""
    r = resume_check(smollm, kind, N_PLAIN, N_DRAFT)
    assert r.same_tokens          # greedy: drafts change speed only
    assert len(r.resumed) >= N_DRAFT // 2
    assert r.kept(r.resumed) >= 0.8 * r.kept(r.steady), (r.kept(r.resumed), r.kept(r.steady), r.kept(r.before))
    if kind == "draft-simple":   # the model drafts for itself: every draft is kept when in sync
        assert r.kept(r.before) > 2.7 and r.kept(r.resumed) > 2.7, (r.kept(r.before), r.kept(r.resumed))


def test_auto_off_repeats_a_seeded_run_and_decides_nothing(smollm):
    sampling = SamplerParams(temp=0.8)
    outs = []
    for _ in range(2):
        gen = SpeculativeGenerator(smollm, DraftModelDrafter(smollm, n_ctx=512), n_ctx=512, n_max=3, auto=False)
        assert gen.controller is None
        r = gen.generate("The weather today is", sampling=sampling, seed=7, n_predict=24)
        assert r.stats.auto_steps == 0 and r.stats.drafted > 0
        outs.append(r.tokens)
        gen.close()
    assert outs[0] == outs[1]


def test_auto_greedy_equals_plain_and_reports_its_choices(smollm):
    plain = SpeculativeGenerator(smollm, None, n_ctx=512)
    want = plain.generate(PROMPT, sampling=SamplerParams(temp=0.0), n_predict=48, ignore_eos=True).tokens
    plain.close()
    gen = SpeculativeGenerator(smollm, build_ngram_drafter("ngram-simple", size_n=2, size_m=8), n_ctx=512,
                               n_max=8, auto=True)
    r = gen.generate(PROMPT, sampling=SamplerParams(temp=0.0), n_predict=48, ignore_eos=True)
    st = r.stats
    assert r.tokens == want
    assert st.auto_steps > 0 and st.auto_plain + sum(st.auto_by_drafter.values()) == st.auto_steps
    assert sum(st.auto_lengths) == st.auto_steps
    assert "plain" in st.auto_summary() and "auto: chosen" in gen.controller.describe()
    gen.close()


def test_batch_auto_greedy_equals_plain(smollm):
    from llama_spec.drafters.draft_batch import DraftSimpleFactory
    from llama_spec.generation.batch import BatchGenerator

    prompts = ["The capital of France is", PROMPT]
    kw = dict(sampling=SamplerParams(temp=0.0), n_predict=24, ignore_eos=True)
    plain = BatchGenerator(smollm, None, n_parallel=2, n_ctx=256)
    want = [r.tokens for r in plain.generate_batch(prompts, **kw)]
    plain.close()
    gen = BatchGenerator(smollm, DraftSimpleFactory(smollm, n_ctx=256), n_parallel=2, n_ctx=256, auto=True)
    assert gen.controller is not None
    got = gen.generate_batch(prompts, **kw)
    assert [r.tokens for r in got] == want
    assert sum(r.stats.auto_steps for r in got) > 0
    gen.close()


@pytest.mark.parametrize("chain", [False, True], ids=["draft-simple", "ngram-simple,draft-simple"])
def test_auto_with_a_tree_greedy_equals_plain_and_runs_the_tree_arm(smollm, gpu_like_costs, chain):
    """A tree request under the controller: plain, an n-gram draft, the model's chain or its tree
    (2, 1, 1) per step; the greedy text is plain decoding's (up to a near-tie: a tree's rejected
    branches move KV cells, docs/trees.md), and the tree arm ran (priced as on a GPU, where its
    extra rows are nearly free), counted under its own name; in a chain, drafted by its member."""
    from conftest import same_or_near_tie

    from llama_spec.drafters.chain import ChainDrafter

    no_fa = {"flash_attn": "off"}
    prompt = "1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 1, 2, 3,"
    kw = dict(sampling=SamplerParams(temp=0.0), n_predict=96, ignore_eos=True)   # (>= 16 steps: a try)
    plain = SpeculativeGenerator(smollm, None, n_ctx=256, context_options=no_fa)
    want = plain.generate(prompt, **kw)
    plain.close()
    d = DraftModelDrafter(smollm, n_ctx=256)
    drafter = ChainDrafter([build_ngram_drafter("ngram-simple", size_n=2, size_m=8), d]) if chain else d
    gen = SpeculativeGenerator(smollm, drafter, n_ctx=256, tree=(2, 1, 1), auto=True, context_options=no_fa)
    r = gen.generate(prompt, **kw)
    gen.close()
    assert r.verify == "tree" and len(r.tokens) == 96
    assert same_or_near_tie(smollm, want, r.text, 1.0, **no_fa), (r.text, want.text)
    by = r.stats.auto_by_drafter
    assert by.get("draft-simple tree 2,1,1", 0) > 0, by
    assert r.stats.auto_plain + sum(by.values()) == r.stats.auto_steps
