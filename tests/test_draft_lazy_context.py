"""draft-simple's own context is made at its first use (drafters/draft_model.py): a controller that
decodes plainly never pays for it (36-173 ms and n_ctx cells of KV for the 0.5B); its arguments are
still refused at construction; the prompt-cache paths work without it; the context is made before
the timed draft (``Drafter.prepare``), so no measured draft cost includes it."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import THREADS

from llama_spec import DraftModelDrafter, SamplerParams, SpeculativeGenerator
from llama_spec.drafters import draft_model
from llama_spec.generation.controller import Plan

PROMPT = "1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 1, 2, 3, 4, 5,"
GREEDY = SamplerParams(temp=0.0)


@pytest.fixture
def made(monkeypatch):
    """Counts the contexts draft-simple makes."""
    real = draft_model.Context

    class Counted:
        n = 0

    def context(*a, **kw):
        Counted.n += 1
        return real(*a, **kw)

    monkeypatch.setattr(draft_model, "Context", context)
    return Counted


def test_no_context_until_used_and_the_same_drafts_after(smollm, made):
    lazy = DraftModelDrafter(smollm, n_ctx=256, n_threads=THREADS, sample=False)
    eager = DraftModelDrafter(smollm, n_ctx=256, n_threads=THREADS, sample=False)
    eager.prepare()
    assert made.n == 1
    hist = smollm.tokenize(PROMPT)
    # the prompt-cache paths and a rollback, before any draft: nothing to save, nothing made
    lazy.load_prefix(None)
    assert lazy.begin_prefix(hist, len(hist) - 1) == len(hist) - 1
    assert lazy.save_prefix() is None and lazy.sync_need(hist) == len(hist)
    assert lazy.forget_after(0) and made.n == 1
    for d in (lazy, eager):
        d.configure(GREEDY, 0, sample=False)
    a, b = lazy.draft(hist, 4, 0.0), eager.draft(hist, 4, 0.0)
    assert made.n == 2 and len(a) == 4
    np.testing.assert_array_equal(a.tokens, b.tokens)
    assert lazy.save_prefix() is not None
    lazy.close()
    eager.close()
    with pytest.raises(ValueError, match="closed"):
        lazy.ctx.pos_max(0)


def test_closed_unused_and_bad_arguments(smollm, made):
    d = DraftModelDrafter(smollm, n_ctx=256, n_threads=THREADS)
    d.close()
    d.close()
    assert made.n == 0
    with pytest.raises(ValueError, match="closed"):   # not made after close either
        _ = d.ctx
    with pytest.raises(ValueError, match="n_ctx"):
        DraftModelDrafter(smollm, n_ctx=0)
    with pytest.raises(ValueError, match="flash_attn"):
        DraftModelDrafter(smollm, n_ctx=256, flash_attn="sometimes")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="n_batch"):
        DraftModelDrafter(smollm, n_ctx=256, n_batch=1.5)  # type: ignore[arg-type]
    assert made.n == 0


def test_plain_decoding_under_auto_makes_no_draft_context(smollm, made, monkeypatch):
    # (every draft priced far above a plain step and known, as from a saved cost model: no cold
    # turns, and no try fits the exploration budget; the controller never asks the draft model)
    from llama_spec.generation.arms import PLAIN
    from llama_spec.generation.controller import SpecController
    from llama_spec.generation.cost_model import CostModel

    measured = Plan._measured
    monkeypatch.setattr(Plan, "_measured", lambda self, arm: arm != PLAIN or measured(self, arm))

    monkeypatch.setattr(SpecController, "step_cost", lambda self, k_cap, n_seqs: 0.01 + 1e-4 * np.arange(k_cap + 1))
    monkeypatch.setattr(CostModel, "draft_cost", lambda self, name, k, gap=1: 10.0 * (np.asarray(k, float) + 1.0))
    monkeypatch.setattr(CostModel, "has_draft_cost", lambda self, name: True)
    monkeypatch.setattr(CostModel, "sync_cost", lambda self, name, gap: 0.0)
    kw = dict(sampling=GREEDY, n_predict=24, ignore_eos=True)
    plain = SpeculativeGenerator(smollm, None, n_ctx=256, n_threads=THREADS)
    want = plain.generate(PROMPT, **kw)
    plain.close()
    gen = SpeculativeGenerator(smollm, DraftModelDrafter(smollm, n_ctx=256, n_threads=THREADS), n_ctx=256,
                               n_threads=THREADS, auto=True)
    r = gen.generate(PROMPT, **kw)
    gen.close()
    assert r.tokens == want.tokens and r.stats.auto_plain == r.stats.auto_steps > 0
    assert made.n == 0


def test_the_context_is_made_before_the_timed_draft(smollm, made, gpu_like_costs, monkeypatch):
    # The controller times each draft call (plan_driver.run_plan): the context must exist when the
    # draft starts, so that its making is not measured as a draft's cost.
    # (Broken variant, run_plan without drafter.members()[m].prepare(): the first draft finds none.)
    seen: list[bool] = []
    real = DraftModelDrafter.draft

    def draft(self, history, n_max, p_min):
        seen.append(self._ctx is not None)
        return real(self, history, n_max, p_min)

    monkeypatch.setattr(DraftModelDrafter, "draft", draft)
    gen = SpeculativeGenerator(smollm, DraftModelDrafter(smollm, n_ctx=256, n_threads=THREADS), n_ctx=256,
                               n_threads=THREADS, auto=True)
    r = gen.generate(PROMPT, sampling=GREEDY, n_predict=24, ignore_eos=True)
    gen.close()
    assert made.n == 1 and r.stats.drafted > 0 and seen and all(seen), (made.n, r.stats.drafted, seen)
