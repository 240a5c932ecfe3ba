"""Prompt-prefix reuse and the host-RAM prompt cache (issue 24).

Exactness: a reused prefix changes no decision. The rest of the prompt is decoded in other batch
shapes than a cold prefill; with repacking and flash attention off llama.cpp's CPU kernels round
every batch shape alike (with flash attention on, a chunk of fewer than 64 rows takes another
path: first-token logits up to 0.7 apart on SmolLM2 Q4_1, docs/prompt-cache.md). So here, with
both off, the cached run must equal the cold one token for token, greedy and seeded (temp 0.8),
and a seeded run with the cache repeats itself at the defaults too.
"""

from __future__ import annotations

import numpy as np
import pytest

from llama_spec import DraftModelDrafter, MtpDrafter, SamplerParams, SpeculativeGenerator
from llama_spec.drafters.draft_batch import DraftSimpleFactory
from llama_spec.drafters.ngram import build_ngram_drafter
from llama_spec.generation.batch import BatchGenerator, GenerationRequest
from llama_spec.generation.prompt_cache import PromptCache, common_prefix

N_CTX = 1024
THREADS = 2
SYSTEM = "You are a careful code reviewer. Answer briefly and precisely. " * 14
GREEDY = SamplerParams(temp=0.0)
WARM = SamplerParams(temp=0.8)
EXACT = {"flash_attn": "off"}   # with repack off (the smollm fixture): every batch shape rounds alike


# -- the cache itself -------------------------------------------------------------------------
def test_common_prefix():
    a = np.array([1, 2, 3, 4], dtype=np.int32)
    assert common_prefix(a, np.array([1, 2, 9], dtype=np.int32)) == 2
    assert common_prefix(a, a[:0]) == 0
    assert common_prefix(a, np.array([1, 2, 3, 4, 5], dtype=np.int32)) == 4
    assert common_prefix(a, np.array([7], dtype=np.int32)) == 0


def test_cache_bound_is_a_hard_limit_and_lru():
    rng = np.random.default_rng(1)
    c = PromptCache(10_000)
    for i in range(300):
        toks = rng.integers(0, 50, rng.integers(1, 200)).astype(np.int32)
        state = bytes(int(rng.integers(0, 6000)))
        c.put(toks, state, None if i % 2 else b"x" * 100, whole_only=False)
        assert c.size == sum(e.nbytes for e in c.entries()) <= c.limit
    assert c.evictions > 0
    assert not c.put(np.arange(10, dtype=np.int32), bytes(20_000), None, whole_only=False)  # larger than all
    c = PromptCache(3 * (1000 + 40))
    for k in range(3):
        c.put(np.full(10, k, dtype=np.int32), bytes(1000), None, whole_only=False)
    c.best(np.zeros(12, dtype=np.int32), whole_only=False)      # entry 0 used: entry 1 is now the oldest
    c.put(np.full(10, 7, dtype=np.int32), bytes(1000), None, whole_only=False)
    assert sorted(int(e.tokens[0]) for e in c.entries()) == [0, 2, 7]


def test_reuse_is_token_by_token_never_by_hash():
    """Adversarial prompts: 64 equal tokens (a hash-sized prefix), then different ones."""
    c = PromptCache(1 << 20)
    base = np.arange(64, dtype=np.int32)
    a = np.concatenate([base, np.array([5, 6, 7, 8], dtype=np.int32)])
    c.put(a, b"A", None, whole_only=False)
    b = np.concatenate([base, np.array([5, 6, 9, 9, 9], dtype=np.int32)])
    entry, n = c.best(b, whole_only=False)
    assert entry is not None and n == 66
    # whole-only (recurrent): a state is used only when all its tokens are the prompt's prefix
    assert c.best(b, whole_only=True) == (None, 0)
    entry, n = c.best(np.concatenate([a, [1, 2]]).astype(np.int32), whole_only=True)
    assert entry is not None and n == len(a)
    assert c.best(np.array([1, 2, 3], dtype=np.int32), whole_only=False) == (None, 0)


def test_prefix_entries_are_subsumed_except_whole_only():
    c = PromptCache(1 << 20)
    c.put(np.arange(10, dtype=np.int32), b"short", None, whole_only=False)
    c.put(np.arange(20, dtype=np.int32), b"long", None, whole_only=False)
    assert [len(e.tokens) for e in c.entries()] == [20]
    c = PromptCache(1 << 20)
    c.put(np.arange(10, dtype=np.int32), b"short", None, whole_only=True)
    c.put(np.arange(20, dtype=np.int32), b"long", None, whole_only=True)
    assert [len(e.tokens) for e in c.entries()] == [10, 20]


# -- through the generators ---------------------------------------------------------------------
DRAFTERS = {
    "plain": lambda m: None,
    "draft-simple": lambda m: DraftModelDrafter(m, n_ctx=N_CTX, n_threads=THREADS, flash_attn="off"),
    "ngram-simple": lambda m: build_ngram_drafter("ngram-simple"),
}


def _conversation(gen, model, sampling, cache_prompt=True):
    """Three requests: a prompt, its continuation with the answer, one that diverges mid-prefix."""
    p1 = SYSTEM + "Q: what does `len([])` return?\nA:"
    r1 = gen.generate(p1, sampling=sampling, n_predict=12, seed=3, cache_prompt=cache_prompt)
    p2 = p1 + r1.text + "\nQ: and `len('ab')`?\nA:"
    r2 = gen.generate(p2, sampling=sampling, n_predict=12, seed=4, cache_prompt=cache_prompt)
    p3 = SYSTEM + "Q: name a sorting algorithm.\nA:"
    r3 = gen.generate(p3, sampling=sampling, n_predict=12, seed=5, cache_prompt=cache_prompt)
    return [r1, r2, r3]


@pytest.mark.parametrize("temp", [0.0, 0.8])
@pytest.mark.parametrize("name", sorted(DRAFTERS))
def test_prefix_reuse_equals_a_cold_run(smollm, name, temp):
    make = DRAFTERS[name]
    runs = {}
    for mode, cache in (("cached", True), ("cold", False)):
        g = SpeculativeGenerator(smollm, make(smollm), n_ctx=N_CTX, n_threads=THREADS, auto=False,
                                 context_options=EXACT)
        try:
            runs[mode] = _conversation(g, smollm, SamplerParams(temp=temp), cache)
        finally:
            g.close()
    cached, cold = runs["cached"], runs["cold"]
    assert [r.tokens for r in cached] == [r.tokens for r in cold]
    assert [r.stats.accepted for r in cached] == [r.stats.accepted for r in cold]
    assert [r.cached_tokens for r in cold] == [0, 0, 0]
    r1, r2, r3 = cached
    assert r1.cached_tokens == 0
    # turn 2 keeps every cell of turn 1 (prompt + answer but its last token, never decoded) that
    # its prompt repeats; turn 3 exactly the common part of its prompt with turn 2's
    own = r1.prompt_tokens + r1.tokens[:-1]
    assert r2.cached_tokens == common_prefix(np.array(own), np.array(r2.prompt_tokens)) > len(r1.prompt_tokens) - 2
    own2 = np.array(r2.prompt_tokens + r2.tokens[:-1])
    assert r3.cached_tokens == common_prefix(own2, np.array(r3.prompt_tokens)) > 100
    assert r3.cached_tokens < len(r3.prompt_tokens) - 5


def test_seeded_run_with_the_cache_repeats(smollm):
    outs = []
    for _ in range(2):
        g = SpeculativeGenerator(smollm, DraftModelDrafter(smollm, n_ctx=N_CTX, n_threads=THREADS), n_ctx=N_CTX,
                                 n_threads=THREADS, auto=False)
        try:
            outs.append([(r.tokens, r.cached_tokens) for r in _conversation(g, smollm, WARM)])
        finally:
            g.close()
    assert outs[0] == outs[1]
    assert outs[0][1][1] > 0


def test_hybrid_target_mtp_reuses_whole_states_only(mtp_model):
    """A recurrent state cannot be cut: the own cells count when the new prompt extends them, a
    RAM checkpoint when the prompt extends its tokens; a prompt diverging inside them reuses 0."""
    rng = np.random.default_rng(0)
    p1 = rng.integers(0, mtp_model.n_vocab, 120).tolist()
    for sampling in (GREEDY, WARM):
        g = SpeculativeGenerator(mtp_model, MtpDrafter(mtp_model, n_ctx=512), n_ctx=512, n_threads=THREADS,
                                 auto=False, cache_ram=32)
        try:
            r1 = g.generate(p1, sampling=sampling, n_predict=16, seed=3)
            p2 = p1 + r1.tokens + rng.integers(0, mtp_model.n_vocab, 10).tolist()
            p3 = p1[:100] + rng.integers(0, mtp_model.n_vocab, 30).tolist()
            p4 = p2 + [5, 6, 7]
            got = [g.generate(p, sampling=sampling, n_predict=16, seed=s) for p, s in ((p2, 4), (p3, 5), (p4, 6))]
        finally:
            g.close()
        g = SpeculativeGenerator(mtp_model, MtpDrafter(mtp_model, n_ctx=512), n_ctx=512, n_threads=THREADS,
                                 auto=False)
        try:
            cold = [g.generate(p, sampling=sampling, n_predict=16, seed=s, cache_prompt=False)
                    for p, s in ((p2, 4), (p3, 5), (p4, 6))]
        finally:
            g.close()
        assert [r.tokens for r in got] == [r.tokens for r in cold]
        assert [r.stats.accepted for r in got] == [r.stats.accepted for r in cold]
        assert [r.cached_tokens for r in got] == [len(p1) + len(r1.tokens) - 1, 0, len(p2)]


def test_ram_cache_brings_a_conversation_back(smollm):
    g = SpeculativeGenerator(smollm, DraftModelDrafter(smollm, n_ctx=N_CTX, n_threads=THREADS, flash_attn="off"),
                             n_ctx=N_CTX, n_threads=THREADS, auto=False, cache_ram=64, context_options=EXACT)
    try:
        a = SYSTEM + "Q: what is a tuple?\nA:"
        b = "Completely different: list three fruits.\n"
        ra = g.generate(a, sampling=GREEDY, n_predict=8)
        g.generate(b, sampling=GREEDY, n_predict=8)
        a2 = a + ra.text + "\nQ: and a list?\nA:"
        ra2 = g.generate(a2, sampling=GREEDY, n_predict=8)
        cache = g.core.prompt_cache
        assert cache is not None and cache.hits >= 1 and cache.size <= 64 * 2**20
    finally:
        g.close()
    own = np.array(ra.prompt_tokens + ra.tokens[:-1])
    assert ra2.cached_tokens == common_prefix(own, np.array(ra2.prompt_tokens)) > len(ra.prompt_tokens) - 2
    cold = SpeculativeGenerator(smollm, None, n_ctx=N_CTX, n_threads=THREADS, context_options=EXACT)
    try:
        assert cold.generate(a2, sampling=GREEDY, n_predict=8).tokens == ra2.tokens
    finally:
        cold.close()


@pytest.mark.parametrize("factory", ["shared", "own"])
def test_batch_shares_a_system_prompt_prefilled_once(smollm, factory):
    qs = ["Q: what is 2+2?\nA:", "Q: name a color.\nA:", "Q: capital of France?\nA:", "Q: a prime number?\nA:"]

    def make():
        return (DraftSimpleFactory(smollm, n_ctx=N_CTX, n_threads=THREADS) if factory == "shared"
                else (lambda: DraftModelDrafter(smollm, n_ctx=N_CTX, n_threads=THREADS, flash_attn="off")))

    results = {}
    for cache in (True, False):
        b = BatchGenerator(smollm, make(), n_parallel=4, n_ctx=N_CTX, n_threads=THREADS, auto=False,
                           cache_ram=32 if cache else 0, context_options=EXACT)
        try:
            results[cache] = b.generate_batch([GenerationRequest(SYSTEM + q, sampling=GREEDY, n_predict=10,
                                                                 cache_prompt=cache) for q in qs])
            if cache:  # a second round: each conversation goes on in the slot that holds it
                again = b.generate_batch([GenerationRequest(SYSTEM + q + r.text + "\nQ: why?\nA:",
                                                            sampling=GREEDY, n_predict=6)
                                          for q, r in zip(qs, results[True], strict=True)])
        finally:
            b.close()
    warm, cold = results[True], results[False]
    assert [r.tokens for r in warm] == [r.tokens for r in cold]
    shared = min(common_prefix(np.array(warm[0].prompt_tokens), np.array(r.prompt_tokens)) for r in warm[1:])
    assert shared > 150
    assert [r.cached_tokens for r in warm] == [0] + [shared] * 3   # the system prompt, prefilled once
    for r, r2 in zip(warm, again, strict=True):
        own = np.array(r.prompt_tokens + r.tokens[:-1])
        assert r2.cached_tokens == common_prefix(own, np.array(r2.prompt_tokens)) >= len(r.prompt_tokens) - 1


def test_bad_cache_arguments(smollm):
    with pytest.raises(ValueError, match="cache_ram"):
        SpeculativeGenerator(smollm, None, n_ctx=256, cache_ram=-1)
    g = SpeculativeGenerator(smollm, None, n_ctx=256)
    try:
        with pytest.raises(TypeError, match="cache_prompt"):
            g.generate("hi", n_predict=2, cache_prompt="yes")
    finally:
        g.close()
