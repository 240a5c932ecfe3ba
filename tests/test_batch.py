"""Batched generation (llama_spec.generation.batch): batch = solo (invariant 11), exactness, slots, failures.

Batch = solo: with repacking off, every sequence of a batched run emits exactly the tokens it
emits run alone through SpeculativeGenerator: at temperature 0, and at temperature 0.8 with a
fixed seed per request for every rule (the accept RNG, the target's dist and the drafter's RNG
are all per request). More prompts than slots exercises continuous batching.

Exactness inside a batch: instead of a second chi-square run, the p and q every rule decided a
sequence's tokens from (observers.PQLog) are shown bit-identical to its solo run's, for a
sequence inside a batch of 4. Together with tests/test_distribution.py (the solo run's first
two tokens are distributed as p) this implies the batched sequence's distribution.
"""

from __future__ import annotations

import numpy as np
import pytest

from llama_spec import DraftModelDrafter, SamplerParams, SpeculativeGenerator
from llama_spec.drafters.draft_batch import DraftSimpleFactory
from llama_spec.errors import SequenceError
from llama_spec.generation.batch import BatchGenerator, GenerationRequest
from llama_spec.observe.observers import PQLog

N_CTX = 256
N_PREDICT = 16
THREADS = 1  # 2 spin-waiting threads are ~10x slower than 1 on the shared, overloaded 2 cores
PROMPTS = [
    "The capital of France is",
    "def fib(n):\n    ",
    "Once upon a time, in a land far away, there lived a young girl who loved to read books about",
    "1, 2, 3,",
    "Q: What is the boiling point of water?\nA:",
    "Write a haiku about the sea:\n",
]
GREEDY = SamplerParams(temp=0.0)
WARM = SamplerParams(temp=0.8)


def _factory(model, mode):
    """plain: no drafter; draft-simple: a drafter (and draft context) per slot; shared: the slots'
    drafters share one draft context and draft together (DraftSimpleFactory, what serve uses)."""
    if mode == "plain":
        return None
    if mode in ("shared", "shared-observe"):
        return DraftSimpleFactory(model, n_ctx=N_CTX, n_threads=THREADS, observe_batches=mode == "shared-observe")
    return lambda: DraftModelDrafter(model, n_ctx=N_CTX, n_threads=THREADS)


def _solo(model, mode, req: GenerationRequest, observers=()):
    f = _factory(model, mode)
    gen = SpeculativeGenerator(model, f() if f else None, n_ctx=N_CTX, n_threads=THREADS)
    try:
        return gen.generate(req.prompt, sampling=req.sampling, n_predict=req.n_predict, seed=req.seed,
                            verify=req.verify or "token", observers=observers)
    finally:
        gen.close()


def _requests(sampling, verify=None, n=6):
    return [GenerationRequest(PROMPTS[i], sampling=sampling, n_predict=N_PREDICT, seed=1000 + i, verify=verify)
            for i in range(n)]


@pytest.fixture(scope="module")
def solo_cache():
    return {}


def _solo_tokens(cache, model, mode, reqs):
    out = []
    for r in reqs:
        key = ("plain" if mode == "plain" else "draft", r.prompt, r.sampling.temp, r.seed, r.verify)
        if key not in cache:
            cache[key] = _solo(model, mode, r).tokens
        out.append(cache[key])
    return out


@pytest.mark.parametrize("mode", ["plain", "draft-simple", "shared", "shared-observe"])
@pytest.mark.parametrize("n_parallel", [1, 2, 4])
def test_greedy_batch_equals_solo(smollm, solo_cache, mode, n_parallel):
    reqs = _requests(GREEDY, n=6 if n_parallel > 1 else 3)
    want = _solo_tokens(solo_cache, smollm, mode, reqs)
    gen = BatchGenerator(smollm, _factory(smollm, mode), n_parallel=n_parallel, n_ctx=N_CTX, n_threads=THREADS)
    try:
        got = gen.generate_batch(reqs)
        assert gen.free_slots() == n_parallel and not gen.has_work()
    finally:
        gen.close()
    assert [r.tokens for r in got] == want  # in order, none lost, duplicated or crossed
    assert all(len(t) == N_PREDICT for t in want)
    if mode != "plain":
        assert sum(r.stats.drafted for r in got) > 0


@pytest.mark.parametrize("mode", ["shared", "shared-observe"])
def test_shared_draft_context_drafts_every_slot_in_one_decode_per_depth(smollm, mode):
    # 4 slots, n_max 3: a step's draft work is (1 observe decode with observe_batches) + 1 sync decode
    # + <= 2 depth decodes for all slots together (per-slot drafting: 4x that); prefills go slot by slot.
    n_max = 3
    gen = BatchGenerator(smollm, _factory(smollm, mode), n_parallel=4, n_ctx=N_CTX, n_threads=THREADS,
                         n_max=n_max)
    try:
        shared = gen.drafters[0].shared
        assert shared is not None and all(d.shared is shared for d in gen.drafters)
        for r in _requests(GREEDY, n=4):
            gen.add(r)
        steps, results = 0, []
        while gen.has_work():
            results += [it for _, it in gen.step() if not hasattr(it, "token")]
            steps += 1
    finally:
        gen.close()
    assert len(results) == 4 and all(r.stats.drafted > 0 for r in results)
    assert steps >= N_PREDICT // (n_max + 1)
    per_step = n_max + (mode == "shared-observe")
    assert 0 < shared.n_decodes <= steps * per_step + n_max
    assert shared.ctx.closed


@pytest.mark.parametrize("mode", ["draft-simple", "shared"])
@pytest.mark.parametrize("verify", ["exact-match", "token", "block"])
def test_sampled_batch_equals_solo_every_rule(smollm, solo_cache, verify, mode):
    reqs = _requests(WARM, verify=verify)
    want = _solo_tokens(solo_cache, smollm, "draft-simple", reqs)
    gen = BatchGenerator(smollm, _factory(smollm, mode), n_parallel=4, n_ctx=N_CTX, n_threads=THREADS)
    try:
        got = gen.generate_batch(reqs)
    finally:
        gen.close()
    assert [r.tokens for r in got] == want
    assert all(r.verify == verify for r in got)
    assert sum(r.stats.accepted for r in got) > 0
    # distinct seeds give distinct continuations of the same prompt (the seeds really are per request)
    assert len({tuple(t) for t in want}) == len(want)


@pytest.mark.parametrize("mode", ["draft-simple", "shared"])
def test_pq_logs_of_a_sequence_in_a_batch_of_4_equal_solo(smollm, mode):
    reqs = _requests(WARM, verify="token", n=4)
    solo_log = PQLog()
    solo = _solo(smollm, "draft-simple", reqs[2], observers=[solo_log])
    logs = [PQLog() for _ in reqs]
    gen = BatchGenerator(smollm, _factory(smollm, mode), n_parallel=4, n_ctx=N_CTX, n_threads=THREADS)
    try:
        ids = [gen.add(r, observers=[log]) for r, log in zip(reqs, logs, strict=True)]
        results = {}
        while gen.has_work():
            for rid, item in gen.step():
                if not hasattr(item, "token"):
                    results[rid] = item
    finally:
        gen.close()
    assert results[ids[2]].tokens == solo.tokens
    a, b = logs[2].entries, solo_log.entries
    assert len(a) == len(b) >= N_PREDICT
    assert sum(e[3] is not None for e in a) > 0  # positions decided with q (the token rule ran)
    for x, y in zip(a, b, strict=True):
        assert x[0] == y[0]
        np.testing.assert_array_equal(x[1], y[1])
        np.testing.assert_array_equal(x[2], y[2])  # p, bit for bit
        assert (x[3] is None) == (y[3] is None)
        if x[3] is not None:
            np.testing.assert_array_equal(x[3], y[3])
            np.testing.assert_array_equal(x[4], y[4])  # q, bit for bit


def test_stream_batch_events_match_results(smollm):
    reqs = _requests(GREEDY, n=5)
    gen = BatchGenerator(smollm, _factory(smollm, "draft-simple"), n_parallel=2, n_ctx=N_CTX, n_threads=THREADS)
    try:
        per: dict[int, list[int]] = {}
        for i, ev in gen.stream_batch(reqs):
            per.setdefault(i, []).append(ev.token)
        got = gen.generate_batch(reqs)
    finally:
        gen.close()
    assert sorted(per) == list(range(5))
    assert [per[i] for i in range(5)] == [r.tokens for r in got]


def test_cancel_frees_slot_and_cells(smollm, solo_cache):
    reqs = _requests(GREEDY, n=3)
    want = _solo_tokens(solo_cache, smollm, "draft-simple", reqs)
    gen = BatchGenerator(smollm, _factory(smollm, "draft-simple"), n_parallel=2, n_ctx=N_CTX, n_threads=THREADS)
    try:
        a, b = gen.add(reqs[0]), gen.add(reqs[1])
        with pytest.raises(RuntimeError, match="no free slot"):
            gen.add(reqs[2])
        items = gen.step() + gen.step()
        assert {rid for rid, _ in items} == {a, b}
        slot_b = gen.slot_of(b)
        assert gen.ctx.pos_max(slot_b) >= 0
        gen.cancel(b)
        assert gen.free_slots() == 1 and gen.ctx.pos_max(slot_b) == -1  # its KV cells are gone
        gen.cancel(b)  # an id already dropped is ignored
        c = gen.add(reqs[2])
        toks: dict[int, list[int]] = {a: [ev.token for rid, ev in items if rid == a], c: []}
        while gen.has_work():
            for rid, item in gen.step():
                assert rid in (a, c)
                if hasattr(item, "token"):
                    toks[rid].append(item.token)
    finally:
        gen.close()
    assert toks[a] == want[0] and toks[c] == want[2]


class _FailingDrafter(DraftModelDrafter):
    """Raises inside step() for a prompt that starts with `poison` (a failure of one sequence)."""

    poison: list[int] = []

    def draft(self, history, n_max, p_min):
        if history[: len(self.poison)] == self.poison:
            raise RuntimeError("boom")
        return super().draft(history, n_max, p_min)


def test_failing_sequence_does_not_disturb_the_others(smollm, solo_cache):
    reqs = _requests(GREEDY, n=2)
    want = _solo_tokens(solo_cache, smollm, "draft-simple", reqs)
    _FailingDrafter.poison = smollm.tokenize("BOOM BOOM BOOM")
    gen = BatchGenerator(smollm, lambda: _FailingDrafter(smollm, n_ctx=N_CTX, n_threads=THREADS), n_parallel=3,
                         n_ctx=N_CTX, n_threads=THREADS)
    try:
        a = gen.add(reqs[0])
        bad = gen.add(GenerationRequest("BOOM BOOM BOOM", sampling=GREEDY, n_predict=8))
        c = gen.add(reqs[1])
        toks: dict[int, list[int]] = {a: [], c: []}
        errors = []
        while gen.has_work():
            try:
                items = gen.step()
            except SequenceError as e:
                errors.append(e)
                continue
            for rid, item in items:
                assert rid != bad
                if hasattr(item, "token"):
                    toks[rid].append(item.token)
        assert gen.free_slots() == 3
    finally:
        gen.close()
    assert [e.request_id for e in errors] == [bad] and isinstance(errors[0].cause, RuntimeError)
    assert toks[a] == want[0] and toks[c] == want[1]  # the other two lost nothing


def test_add_validates(smollm):
    gen = BatchGenerator(smollm, None, n_parallel=1, n_ctx=N_CTX, n_threads=THREADS)
    try:
        assert gen.n_ctx_per_seq == N_CTX and gen.n_parallel == 1
        with pytest.raises(ValueError, match=r"300 tokens.*256"):
            gen.add(GenerationRequest([1] * 300))
        with pytest.raises(ValueError, match="verify"):
            gen.add(GenerationRequest("hi", verify="tree-ish"))
        with pytest.raises(ValueError, match="n_max"):
            gen.add(GenerationRequest("hi", n_max=65))
        with pytest.raises(ValueError, match="n_predict"):
            gen.add(GenerationRequest("hi", n_predict=0))
        assert gen.free_slots() == 1  # a refused request takes no slot
    finally:
        gen.close()
    with pytest.raises(ValueError, match="n_parallel"):
        BatchGenerator(smollm, None, n_parallel=0)


def test_recurrent_target_batch_equals_solo(mtp_model):
    from llama_spec import MtpDrafter

    def factory():
        return MtpDrafter(mtp_model, n_ctx=128, n_threads=THREADS)

    reqs = [GenerationRequest(p, sampling=WARM, n_predict=12, seed=7 + i) for i, p in enumerate(PROMPTS[:4])]
    want = []
    for r in reqs:
        gen = SpeculativeGenerator(mtp_model, factory(), n_ctx=128, n_max=3, n_threads=THREADS)
        try:
            want.append(gen.generate(r.prompt, sampling=r.sampling, n_predict=r.n_predict, seed=r.seed).tokens)
        finally:
            gen.close()
    batch = BatchGenerator(mtp_model, factory, n_parallel=2, n_ctx=128, n_max=3, n_threads=THREADS)
    try:
        got = batch.generate_batch(reqs)
    finally:
        batch.close()
    assert [r.tokens for r in got] == want
    assert sum(r.stats.accepted for r in got) > 0
