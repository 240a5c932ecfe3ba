"""MTP context, hybrid-recurrent rollback and the reasoning budget, on the synthetic qwen35 model.

The synthetic model has random weights (llama_spec.testing.synthetic_mtp): its text is
gibberish, but its shapes, MTP head and recurrent layers are real, and with sigma = 0 the head
predicts exactly what the trunk predicts one step later.
"""

from __future__ import annotations

import numpy as np
import pytest

from llama_spec import Context, Model, MtpContext, ReasoningBudget, SamplerParams, TargetSampler
from llama_spec.errors import ContextError


def test_mtp_context_shapes_and_head_agrees_with_trunk(mtp_model):
    m = mtp_model
    assert m.n_layer_nextn == 1 and m.is_hybrid
    tgt = Context(m, n_ctx=256, n_batch=64, nextn=True)
    toks = m.tokenize("Hello world, this is a small test of the head")
    logits = tgt.decode(toks, outputs="all").copy()
    h = tgt.nextn_rows(len(toks)).copy()
    assert h.shape == (len(toks), m.n_embd) and np.isfinite(h).all()

    mtp = MtpContext(m, n_ctx=256, n_batch=64)
    pairs = np.zeros_like(h)
    pairs[1:] = h[:-1]  # (x_j, h_{j-1}); the first token has no previous row
    head = mtp.decode(toks, outputs="all", embd=pairs).copy()
    assert head.shape == (len(toks), m.n_vocab)
    head_h = mtp.nextn_rows()
    assert head_h.shape == (len(toks), m.n_embd)
    # sigma = 0: the head's prediction at position j is the trunk's prediction at position j
    agree = (head.argmax(1) == logits.argmax(1)).mean()
    assert agree > 0.95, agree
    tgt.close()
    mtp.close()


def test_mtp_context_requires_head():
    from llama_spec.testing.models import model_path

    m = Model(model_path("smollm2-135m", progress=False))
    with pytest.raises(ValueError, match="load_mtp"):
        MtpContext(m)
    m.close()


def _one_by_one(ctx, toks, pos0):
    return np.stack([ctx.decode([t], [pos0 + i]).copy()[0] for i, t in enumerate(toks)])


def test_hybrid_rollback_restores_recurrent_state(mtp_model):
    m = mtp_model
    prefix = m.tokenize("Once upon a time there was")
    tail = [101, 2024, 33, 9000, 512]
    ctx = Context(m, n_ctx=256, n_batch=64, n_rs_seq=8)
    ctx.prefill(prefix)
    first = _one_by_one(ctx, tail, len(prefix))
    j = 3
    ctx.rollback(0, len(prefix) + len(tail) - j)  # drop the last j positions, recurrent state too
    assert ctx.pos_max() == len(prefix) + len(tail) - j - 1
    again = _one_by_one(ctx, tail[-j:], len(prefix) + len(tail) - j)
    np.testing.assert_array_equal(first[-j:], again)
    # and a different continuation after the rollback differs (the test can fail)
    ctx.rollback(0, len(prefix) + len(tail) - j)
    other = _one_by_one(ctx, [7, 8, 9], len(prefix) + len(tail) - j)
    assert not np.array_equal(other, again)
    ctx.close()


def test_hybrid_rollback_without_snapshots_is_refused(mtp_model):
    ctx = Context(mtp_model, n_ctx=128, n_batch=32, n_rs_seq=0)
    ctx.prefill(mtp_model.tokenize("Hello there my friend"))
    with pytest.raises(ContextError, match="n_rs_seq"):
        ctx.rollback(0, 2)
    ctx.close()


def test_hybrid_context_too_small_for_its_snapshots_is_refused(mtp_model):
    # llama.cpp keeps the last n_rs_seq + 1 tokens in one ubatch and would abort the process on
    # the first decode; the binding refuses at construction with the numbers instead.
    with pytest.raises(ValueError, match=r"n_rs_seq=8 needs n_ubatch > 9, but n_ubatch is 8"):
        Context(mtp_model, n_ctx=256, n_batch=8, n_rs_seq=8)
    ctx = Context(mtp_model, n_ctx=256, n_batch=10, n_rs_seq=8)  # 10 > 9: fine
    ctx.prefill(mtp_model.tokenize("Hello there my friend, how are you doing today?"))
    ctx.close()


@pytest.fixture(scope="module")
def think_model():
    from llama_spec.testing.synthetic_mtp import synthetic_mtp_path

    m = Model(synthetic_mtp_path(sigma=0.0, seed=0, thinking=True), load_mtp=True)
    yield m
    m.close()


def test_reasoning_budget_forces_end_after_budget(think_model):
    m = think_model
    start = m.tokenize("<think>", add_special=False, parse_special=True)
    end = m.tokenize("</think>", add_special=False, parse_special=True)
    forced = m.tokenize("\n</think>\n", add_special=False, parse_special=True)
    assert len(start) == 1 and len(end) == 1
    rb = ReasoningBudget(m, start=[start], end=[end], forced=forced, budget=3)
    sampler = TargetSampler(m, SamplerParams(temp=0.8, seed=5), reasoning_budget=rb)
    rng = np.random.default_rng(0)
    row = lambda: rng.normal(0, 3, m.n_vocab).astype(np.float32)  # noqa: E731
    sampler.accept(start[0])  # the <think> tag opens the block
    assert sampler.budget.state == "counting"
    for _ in range(3):
        ids, probs = sampler.candidates(row())
        assert len(ids) > 1  # free choice while counting
        t = int(ids[np.argmax(probs)])
        assert t not in end
        sampler.accept(t)
    # budget spent: p is one-hot on each forced token in turn
    for f in forced:
        ids, probs = sampler.candidates(row())
        nz = ids[probs > 0]
        assert list(nz) == [f] and probs[probs > 0][0] == pytest.approx(1.0)
        assert sampler.sample(row()) == f
        sampler.accept(f)
    assert sampler.budget.state == "done"
    ids, probs = sampler.candidates(row())
    assert (probs > 0).sum() > 1  # passthrough again
