"""One engine (issue 23): a sequence inside a BatchGenerator of 4 is its solo run, for every capability.

Batch = solo (invariant 11, repack off): greedy trees, per-request seeded trees, the block rule, the
adaptive draft length and chains (their gate on at temp 0, off at temp 0.8 where the gate's timing
would change the drafts) each give, per sequence of a batch of 4, exactly the tokens of its solo run.

Seeded (2, 1) trees of a generator built with tree=(2, 1) are the exception, by numerics and not by
the engine: a tree batch needs a unified KV cache, where the other slots' cells and the holes their
rejected branches leave interleave with a sequence's cells, and llama.cpp's CPU attention rounds
by cell placement (docs/trees.md: up to ~0.7 in the logits of this model, flash attention on or
off). Session 9 measured, for sequence 1 of PROMPTS at seed 501 (diverged at token 7 in session
8; at token 6 here with flash attention off, none with it on): alone in slot 1 (seq ids 2, 3) of
the same 4-slot, 8-sequence unified context its p equals its solo run's at every position, bit
for bit; with slot 0 busy p first differs at its second tree verification (total variation up
to 0.03, flash attention off); its root logits are within 0.83 of a fresh contiguous context's at
every verification, as the solo run's are (<= 0.83), with the same argmax. So
test_seeded_tree_in_a_batch_of_four checks what holds: each sequence alone in its slot == solo,
bit for bit; in the full batch, tokens equal solo's up to the first p that differs, and every p is
the target's up to that rounding. The distribution inside a batch: tests/test_engine_distribution.py.
"""

from __future__ import annotations

import numpy as np
import pytest

from llama_spec import DraftModelDrafter, MtpDrafter, SamplerParams, SpeculativeGenerator
from llama_spec.drafters.chain import ChainDrafter
from llama_spec.drafters.draft_batch import DraftSimpleFactory
from llama_spec.drafters.ngram import build_ngram_drafter
from llama_spec.generation.batch import BatchGenerator, GenerationRequest
from llama_spec.generation.request import GenerationResult
from llama_spec.llama.context import Context
from llama_spec.observe.observers import Observer, PQLog

N_CTX = 256
N_PREDICT = 16
THREADS = 1
PROMPTS = ["The capital of France is", "def fib(n):\n    ", "1, 2, 3, 4,", "Q: What is the boiling point of water?\nA:"]
GREEDY = SamplerParams(temp=0.0)
WARM = SamplerParams(temp=0.8)
THRESHOLD = 5e-5


def _draft(model):
    return lambda: DraftModelDrafter(model, n_ctx=N_CTX, n_threads=THREADS)


def _chain(model, gate):
    return lambda: ChainDrafter([build_ngram_drafter("ngram-simple"),
                                 DraftModelDrafter(model, n_ctx=N_CTX, n_threads=THREADS)], gate=gate)


CASES = {  # name: (factory(model), sampling, GenerationRequest extras, generator extras)
    "tree-greedy": (_draft, GREEDY, {}, {"tree": (2, 1)}),
    "tree-per-request": (_draft, WARM, {"tree": (2,)}, {"tree": (2, 1)}),
    "block-warm": (_draft, WARM, {"verify": "block"}, {}),
    "adaptive-greedy": (_draft, GREEDY, {}, {"adaptive_draft": True}),
    "chain-greedy": (lambda m: _chain(m, True), GREEDY, {}, {}),
    "chain-warm": (lambda m: _chain(m, False), WARM, {}, {}),
}


def _requests(sampling, extra):
    return [GenerationRequest(p, sampling=sampling, n_predict=N_PREDICT, seed=500 + i, **extra)
            for i, p in enumerate(PROMPTS)]


@pytest.mark.parametrize("case", [CASES[k] if not isinstance(CASES[k], tuple) else CASES[k] for k in sorted(CASES)],
                         ids=sorted(CASES))
def test_batch_of_four_equals_solo(smollm, case):
    make, sampling, extra, gen_kw = case
    reqs = _requests(sampling, extra)
    solo = []
    for r in reqs:
        g = SpeculativeGenerator(smollm, make(smollm)(), n_ctx=N_CTX, n_threads=THREADS, **gen_kw)
        try:
            res = g.generate(r.prompt, sampling=r.sampling, n_predict=r.n_predict, seed=r.seed,
                             verify=r.verify or "token", tree=r.tree)
            solo.append(res)
        finally:
            g.close()
    batch = BatchGenerator(smollm, make(smollm), n_parallel=4, n_ctx=N_CTX, n_threads=THREADS, **gen_kw)
    try:
        got = batch.generate_batch(reqs)
    finally:
        batch.close()
    assert [r.tokens for r in got] == [r.tokens for r in solo]
    assert [r.verify for r in got] == [r.verify for r in solo]
    assert sum(r.stats.drafted for r in got) > 0  # speculation really ran
    if "tree" in gen_kw:
        assert all(r.verify == "tree" for r in got)
    if extra.get("verify") == "block":
        assert sum(r.stats.block_verifications for r in got) > 0


def test_batch_refuses_what_it_cannot_run(smollm, mtp_model):
    with pytest.raises(ValueError, match="sequences in the target context"):
        b = BatchGenerator(smollm, _draft(smollm), n_parallel=2, n_ctx=N_CTX, n_threads=THREADS)
        try:
            b.add(GenerationRequest("hi", tree=(2, 1)))
        finally:
            b.close()
    with pytest.raises(ValueError, match="cannot branch"):  # a shared draft context cannot branch
        BatchGenerator(smollm, DraftSimpleFactory(smollm, n_ctx=N_CTX, n_threads=THREADS), n_parallel=2,
                       n_ctx=N_CTX, n_threads=THREADS, tree=(2, 1))
    with pytest.raises(ValueError, match="recurrent"):  # a tree on a hybrid target
        BatchGenerator(mtp_model, lambda: MtpDrafter(mtp_model, n_ctx=128), n_parallel=2, n_ctx=128,
                       n_threads=THREADS, tree=(2, 1))


# -- seeded trees: batch = solo up to the rounding of a unified cache's cell layout (module docstring) --
TREE = (2, 1)


def _tree_batch(model):
    return BatchGenerator(model, _draft(model), n_parallel=4, n_ctx=N_CTX, n_threads=THREADS, tree=TREE)


def _results(batch):
    out = {}
    while batch.has_work():
        for rid, item in batch.step():
            if isinstance(item, GenerationResult):
                out[rid] = item
    return out


def _first_p_difference(a, b):
    """The emitted index of the first entry of two PQLogs whose position or p (ids, probs) differ;
    None if every entry is the same."""
    for x, y in zip(a, b, strict=False):
        if x[0] != y[0] or not np.array_equal(x[1], y[1]) or not np.array_equal(x[2], y[2]):
            return min(x[0], y[0])
    return None if len(a) == len(b) else max(a, b, key=len)[min(len(a), len(b))][0]


class _RootRows(Observer):
    """Per verification: max |root row - a fresh contiguous context's last row for the same prefix|
    and whether their argmax agree (docs/trees.md: a cell layout's rounding, not another prefix)."""

    def __init__(self, fresh: Context) -> None:
        self.fresh, self.diffs, self.same_argmax = fresh, [], []

    def on_request(self, info) -> None:
        self.hist = list(info.prompt_tokens)

    def on_verify(self, v) -> None:
        if not v.first:
            self.fresh.clear()
            row = self.fresh.prefill(self.hist)  # a view: used before the next decode
            self.diffs.append(float(np.abs(row - v.logits[0]).max()))
            self.same_argmax.append(int(np.argmax(row)) == int(np.argmax(v.logits[0])))
        self.hist += list(v.emitted)


def test_seeded_tree_in_a_batch_of_four(smollm):
    reqs = _requests(WARM, {})
    solo_tokens, solo_logs = [], []
    for r in reqs:
        g = SpeculativeGenerator(smollm, _draft(smollm)(), n_ctx=N_CTX, n_threads=THREADS, tree=TREE)
        log = PQLog()
        try:
            solo_tokens.append(g.generate(r.prompt, sampling=r.sampling, n_predict=r.n_predict, seed=r.seed,
                                          observers=[log]).tokens)
        finally:
            g.close()
        solo_logs.append(log.entries)
    # Alone in slot i (seq ids 2i, 2i + 1) of the 4-slot, 8-sequence unified context: its solo run,
    # p bit for bit at every position (seq ids, commit_tree, the RNGs and the drafter are the solo ones).
    for i in (1, 3):
        b = _tree_batch(smollm)
        log = PQLog()
        try:
            held = [b.add(GenerationRequest("x", n_predict=1)) for _ in range(i)]
            rid = b.add(reqs[i], observers=[log])
            assert b.slot_of(rid) == i
            for h in held:  # freed before any step: the sequence runs alone
                b.cancel(h)
            res = _results(b)[rid]
        finally:
            b.close()
        assert res.tokens == solo_tokens[i] and res.verify == "tree" and res.stats.drafted > 0
        assert _first_p_difference(log.entries, solo_logs[i]) is None, i
    # All four: identical up to the first p the layout rounded differently; every root row is the
    # target's up to that rounding (same argmax as a fresh context, |diff| < 3 as in test_tree_loop).
    fresh = Context(smollm, n_ctx=N_CTX, n_threads=THREADS)
    logs, rows = [PQLog() for _ in reqs], [_RootRows(fresh) for _ in reqs]
    b = _tree_batch(smollm)
    try:
        ids = [b.add(r, observers=[log, row]) for r, log, row in zip(reqs, logs, rows, strict=True)]
        got = _results(b)
    finally:
        b.close()
        fresh.close()
    for i, rid in enumerate(ids):
        toks, first = got[rid].tokens, _first_p_difference(logs[i].entries, solo_logs[i])
        same = len(toks) if first is None else first  # the tokens before that position
        assert toks[:same] == solo_tokens[i][:same], (i, first)
        assert first is not None or toks == solo_tokens[i]
        assert rows[i].diffs and all(rows[i].same_argmax) and max(rows[i].diffs) < 3.0, (i, rows[i].diffs)
    assert sum(got[rid].stats.drafted for rid in ids) > 0 and all(got[rid].verify == "tree" for rid in ids)


def test_other_rules_run_as_chains_on_a_tree_generator(smollm):
    """The generator's default tree is for token-rule requests (the tree rule generalizes the token
    rule): a block or exact-match request runs as a chain under its rule and says so; asking for a
    tree with such a rule is refused, solo and in a batch."""
    g = SpeculativeGenerator(smollm, _draft(smollm)(), n_ctx=N_CTX, n_threads=THREADS, tree=(2, 1))
    try:
        for verify in ("block", "exact-match"):
            r = g.generate(PROMPTS[0], sampling=WARM, seed=3, n_predict=12, ignore_eos=True, verify=verify)
            assert r.verify == verify and r.stats.drafted > 0 and len(r.tokens) == 12, verify
            assert (r.stats.block_verifications > 0) == (verify == "block")
            assert r.stats.exact_match_verifications == (r.stats.verifications if verify == "exact-match" else 0)
        assert g.generate(PROMPTS[0], sampling=WARM, seed=3, n_predict=12, ignore_eos=True).verify == "tree"
        with pytest.raises(ValueError, match="tree: .*'block' rule"):
            g.stream(PROMPTS[0], verify="block", tree=(2,))
    finally:
        g.close()
    b = BatchGenerator(smollm, _draft(smollm), n_parallel=2, n_ctx=N_CTX, n_threads=THREADS, tree=(2, 1))
    try:
        with pytest.raises(ValueError, match="tree: .*'exact-match' rule"):
            b.add(GenerationRequest("hi", tree=(2, 1), verify="exact-match"))
        assert b.free_slots() == 2
    finally:
        b.close()
