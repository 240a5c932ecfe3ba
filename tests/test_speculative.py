"""The speculative loop against the invariants of docs/design.md, on real models and the synthetic MTP model."""

from __future__ import annotations

import numpy as np
import pytest

from llama_spec import DraftModelDrafter, Model, MtpDrafter, SamplerParams, SpeculativeGenerator
from llama_spec.generation.solo import ENV_DRAFT_SAMPLE
from llama_spec.observe.observers import PQLog, RequestWatch
from llama_spec.observe.stats import SpecStats

RULES = ("token", "block", "exact-match")

PROMPTS = [
    "Write a Python function that returns the n-th Fibonacci number.\n",
    "The three most important ideas in computer science are",
]
GREEDY = SamplerParams(temp=0.0)


@pytest.fixture(scope="module")
def pair(qwen15, qwen05):
    """Qwen2.5-Coder 1.5B target with its 0.5B draft model, and a plain generator beside it."""
    spec = SpeculativeGenerator(qwen15, DraftModelDrafter(qwen05, n_ctx=1024), n_ctx=1024, n_max=3)
    plain = SpeculativeGenerator(qwen15, None, n_ctx=1024)
    yield spec, plain
    spec.close()
    plain.close()


@pytest.fixture(scope="module")
def mtp_pair(mtp_model):
    spec = SpeculativeGenerator(mtp_model, MtpDrafter(mtp_model, n_ctx=2048), n_ctx=2048, n_max=3)
    plain = SpeculativeGenerator(mtp_model, None, n_ctx=2048)
    yield spec, plain
    spec.close()
    plain.close()


# -- invariant 2: greedy bit-identity ---------------------------------------------------------------
@pytest.mark.parametrize("prompt", PROMPTS)
def test_greedy_draft_simple_equals_plain(pair, prompt):
    spec, plain = pair
    ref = plain.generate(prompt, sampling=GREEDY, n_predict=128, ignore_eos=True)
    for rule in (True, False):
        r = spec.generate(prompt, sampling=GREEDY, n_predict=128, spec_draft_sample=rule, ignore_eos=True)
        assert r.tokens == ref.tokens, f"spec_draft_sample={rule}"
        assert r.stats.drafted > 0 and r.stats.accepted > 0
    r = spec.generate(prompt, sampling=GREEDY, n_predict=128, verify="block", ignore_eos=True)
    assert r.tokens == ref.tokens and r.stats.block_verifications == r.stats.verifications > 0


EOS_PROMPT = "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n"  # smollm2 ends it after 12 tokens


def test_ignore_eos_never_samples_an_eog_token(smollm):
    """ignore_eos is llama.cpp's --ignore-eos: every EOG token is banned (logit bias -inf), not
    merely not stopped at; the text up to where EOS was chosen is unchanged, and speculative
    greedy decoding still equals plain."""
    plain = SpeculativeGenerator(smollm, None, n_ctx=512)
    spec = SpeculativeGenerator(smollm, DraftModelDrafter(smollm, n_ctx=512), n_ctx=512, n_max=3)
    try:
        free = plain.generate(EOS_PROMPT, sampling=GREEDY, n_predict=128)
        assert free.stop_reason == "eos" and smollm.is_eog(free.tokens[-1]), free.text
        n = len(free.tokens)
        held = plain.generate(EOS_PROMPT, sampling=GREEDY, n_predict=n + 16, ignore_eos=True)
        assert held.tokens[: n - 1] == free.tokens[: n - 1]
        assert len(held.tokens) == n + 16 and not any(smollm.is_eog(t) for t in held.tokens)
        sp = spec.generate(EOS_PROMPT, sampling=GREEDY, n_predict=n + 16, ignore_eos=True)
        assert sp.tokens == held.tokens and sp.stats.accepted > 0
        seeded = spec.generate(EOS_PROMPT, sampling=SamplerParams(temp=1.0, seed=3), n_predict=64, ignore_eos=True)
        assert not any(smollm.is_eog(t) for t in seeded.tokens)
    finally:
        spec.close()
        plain.close()


@pytest.mark.parametrize("with_drafter", [False, True], ids=["plain", "draft-simple"])
def test_repeated_prompt_reuses_its_prefill_bit_for_bit(smollm, with_drafter):
    """A prompt equal to the last freshly prefilled one decodes nothing at position 0 and gives the
    tokens of a fresh generator; another prompt in between makes the next one fresh again."""
    def make():
        d = DraftModelDrafter(smollm, n_ctx=512) if with_drafter else None
        return SpeculativeGenerator(smollm, d, n_ctx=512, n_max=3)

    gen, fresh = make(), make()
    calls: list[tuple[int, int]] = []
    decode = gen.ctx.decode

    def counting(tokens, pos, *a, **kw):
        calls.append((len(tokens), int(pos[0])))
        return decode(tokens, pos, *a, **kw)

    gen.ctx.decode = counting  # type: ignore[method-assign]
    prompt, other = PROMPTS[1], PROMPTS[0]
    s = SamplerParams(temp=1.0, seed=5)
    try:
        ref = fresh.generate(prompt, sampling=s, n_predict=24).tokens
        first = gen.generate(prompt, sampling=s, n_predict=24).tokens
        n0 = len(calls)
        again = gen.generate(prompt, sampling=s, n_predict=24).tokens
        assert first == again == ref
        assert all(pos > 0 for _, pos in calls[n0:])  # the prompt was not decoded again
        gen.generate(other, sampling=s, n_predict=4)
        n1 = len(calls)
        assert gen.generate(prompt, sampling=s, n_predict=24).tokens == ref
        assert calls[n1][1] == 0  # fresh prefill after another prompt
    finally:
        gen.close()
        fresh.close()


@pytest.mark.parametrize("prompt", ["Hello world, this is", "Once upon a time"])
def test_greedy_draft_mtp_equals_plain(mtp_pair, prompt):
    spec, plain = mtp_pair
    ref = plain.generate(prompt, sampling=GREEDY, n_predict=128, ignore_eos=True)
    for rule in (True, False):
        r = spec.generate(prompt, sampling=GREEDY, n_predict=128, spec_draft_sample=rule, ignore_eos=True)
        assert r.tokens == ref.tokens, f"spec_draft_sample={rule}"
        # sigma = 0: the head predicts exactly what the trunk will (FACTS.md), so greedy drafts
        # are all accepted.
        assert r.stats.acceptance_rate > 0.95


@pytest.mark.parametrize("verify", RULES)
def test_greedy_every_rule_is_exact_match_and_consumes_no_accept_randomness(mtp_pair, verify):
    from llama_spec.generation.request import _ACCEPT_SEED_SALT
    from llama_spec.kernels import token as acc

    spec, _ = mtp_pair
    exact = spec.generate("Hello world", sampling=GREEDY, seed=11, n_predict=32, verify="exact-match",
                          ignore_eos=True)
    watch = RequestWatch()
    r = spec.generate("Hello world", sampling=GREEDY, seed=11, n_predict=32, spec_draft_sample=True, verify=verify,
                      ignore_eos=True, observers=[watch])
    assert r.tokens == exact.tokens and r.verify == verify
    assert r.stats.verifications > 0 and r.stats.extra_accepted == 0
    untouched = acc.new_rng_state((11 ^ _ACCEPT_SEED_SALT) & 0xFFFFFFFF)
    np.testing.assert_array_equal(watch.rng_at_start, untouched)
    np.testing.assert_array_equal(watch.info.rng, untouched)  # the live accept RNG, after the request
    # the test can fail: a sampled request does advance it
    watch2 = RequestWatch()
    spec.generate("Hello world", sampling=SamplerParams(temp=0.8), seed=11, n_predict=32, verify=verify,
                  ignore_eos=True, observers=[watch2])
    assert (verify == "exact-match") == np.array_equal(watch2.info.rng, untouched)


# -- invariant 4: exact-match mode reproduces plain seeded generation ------------------------------
def test_exact_match_mode_reproduces_plain_seeded(pair):
    spec, plain = pair
    s = SamplerParams(temp=0.8)
    for seed in (1, 2):
        ref = plain.generate(PROMPTS[0], sampling=s, seed=seed, n_predict=64, ignore_eos=True)
        r = spec.generate(PROMPTS[0], sampling=s, seed=seed, n_predict=64, spec_draft_sample=False, ignore_eos=True)
        assert r.tokens == ref.tokens


# -- invariant 3: fallbacks ---------------------------------------------------------------------------
def test_switch_off_and_env_zero_equal_exact_match(pair, monkeypatch):
    spec, _ = pair
    s = SamplerParams(temp=0.8)
    ref = spec.generate(PROMPTS[1], sampling=s, seed=7, n_predict=48, spec_draft_sample=False, ignore_eos=True)
    assert ref.stats.exact_match_verifications == ref.stats.verifications > 0
    monkeypatch.setenv(ENV_DRAFT_SAMPLE, "0")
    r = spec.generate(PROMPTS[1], sampling=s, seed=7, n_predict=48, ignore_eos=True)
    assert r.tokens == ref.tokens and not r.spec_draft_sample
    monkeypatch.setenv(ENV_DRAFT_SAMPLE, "maybe")
    with pytest.raises(ValueError, match=ENV_DRAFT_SAMPLE):
        spec.generate(PROMPTS[1], sampling=s, seed=7, n_predict=4)


def test_grammar_keeps_the_rejection_rule_with_masked_q_and_falls_back_without(pair):
    """Under a grammar draft-simple masks q with a grammar clone (issue 16): the token rule runs
    (0 exact-match verifications). A proposal whose q is not masked falls back to exact-match."""
    from llama_spec.drafters.base import Proposal
    from llama_spec.rules import ExactMatchRule, TokenRule, choose

    spec, _ = pair
    grammar = 'root ::= ("yes" | "no" | "maybe") " " [a-z ]+ "."'
    s = SamplerParams(temp=0.8, grammar=grammar)
    on = spec.generate("Answer yes or no: is the sky blue?", sampling=s, seed=3, n_predict=24, spec_draft_sample=True)
    off = spec.generate("Answer yes or no: is the sky blue?", sampling=s, seed=3, n_predict=24, spec_draft_sample=False)
    assert on.stats.verifications > 0 and on.stats.exact_match_verifications == 0
    assert off.stats.exact_match_verifications == off.stats.verifications > 0
    for r in (on, off):
        assert r.text.split(" ")[0] in ("yes", "no", "maybe")

    class _Sampler:
        has_grammar = True

    q = [np.array([0.5, 0.5], dtype=np.float32)]
    for masked, want in ((False, ExactMatchRule), (True, TokenRule)):
        prop = Proposal(tokens=[1], q_ids=[np.array([1, 2], dtype=np.int32)], q_probs=q, q_grammar_masked=masked)
        assert isinstance(choose(TokenRule(), ExactMatchRule(), prop, _Sampler(), True), want)  # type: ignore[arg-type]


# -- invariant 8 + bad input ----------------------------------------------------------------------------
def test_bad_input_raises_before_decoding(pair, qwen15, smollm, mtp_model):
    spec, _ = pair
    for n_max in (0, -1, 65):
        with pytest.raises(ValueError, match="n_max"):
            spec.generate("hi", n_max=n_max)
    for p_min in (-0.1, 1.5):
        with pytest.raises(ValueError, match="p_min"):
            spec.generate("hi", p_min=p_min)
    with pytest.raises(ValueError, match="temp"):
        SamplerParams(temp=-0.5)
    with pytest.raises(ValueError, match="vocabulary"):
        SpeculativeGenerator(qwen15, DraftModelDrafter(smollm, n_ctx=256), n_ctx=256)
    with pytest.raises(ValueError, match="MTP"):
        MtpDrafter(qwen15)
    with pytest.raises(ValueError, match=r"1030 tokens.*n_ctx=1024"):
        spec.generate([1] * 1030)


def test_mirror_sampler_clamps_top_k_and_keeps_truncation():
    from llama_spec.drafters.mirror import mirror_params

    p = mirror_params(SamplerParams(temp=0.7, top_k=0, top_p=0.9, min_p=0.1, typical_p=0.95, top_n_sigma=2.0,
                                    penalty_repeat=1.3, min_keep=3))
    assert (p.temp, p.top_k, p.top_p, p.min_p, p.typical_p, p.top_n_sigma, p.min_keep) == (0.7, 64, 0.9, 0.1, 0.95, 2.0, 3)
    assert p.penalty_repeat == 1.0 and p.penalty_last_n == 0  # penalties are not mirrored
    assert mirror_params(SamplerParams(top_k=1)).top_k == 2
    assert mirror_params(SamplerParams(top_k=500)).top_k == 64


# -- acceptance: the rejection rule beats exact match and matches sum min(p, q) ------------------------
@pytest.mark.parametrize("temp", [0.6, 0.8, 1.0])
def test_rejection_rule_accepts_more_than_exact_match(pair, temp):
    """Paired comparison at the same positions: the rejection rule accepts a sampled draft with
    probability sum_y min(p, q); the exact-match rule accepts an argmax draft with probability
    p(argmax q). Both are logged at every verified position of the same runs, so the comparison
    carries no sampling noise from the accept decisions (realized accepted lengths, with their
    noise bands, are measured by scripts/bench_spec.py). Averaged over the positions visited,
    the rejection rule must accept more at each temperature."""
    spec, _ = pair
    total = SpecStats()
    for prompt in PROMPTS:
        total += spec.generate(prompt, sampling=SamplerParams(temp=temp), seed=1, n_predict=64, ignore_eos=True,
                               observers=[PQLog()]).stats
    visits = sum(total.reached)
    assert visits > 60
    new = sum(total.expected_accept) / visits
    old = sum(total.expected_accept_exact) / visits
    assert new > old, (temp, new, old)


def test_per_position_acceptance_matches_sum_min_pq(mtp_sigma_pair):
    """Empirical acceptance at each draft position vs sum_y min(p, q) logged at that position.

    The number of acceptances at a position is a sum of independent Bernoulli(a_j) with
    a_j = sum min(p, q) at visit j, so it has mean sum a_j and variance sum a_j (1 - a_j). We
    require |empirical - expected| < 4.5 standard errors per position: a correct loop violates
    it with probability < 1e-5 per position. The suite's N (a few hundred visits) cannot resolve
    the issue's 2 % band statistically; scripts/accept_rate_check.py runs N large enough that
    4.5 standard errors < 2 % and checks both.
    """
    spec = mtp_sigma_pair
    s = SamplerParams(temp=0.8, top_k=40)
    total = SpecStats()
    for seed in range(6):
        total += spec.generate("Once upon a time", sampling=s, seed=seed, n_predict=200, ignore_eos=True,
                               observers=[PQLog()]).stats
    for i in range(3):
        n = total.reached[i]
        assert n > 40
        emp = total.accepted_at[i]
        exp = total.expected_accept[i]
        var = exp * (1 - exp / n)  # sum a_j (1 - a_j) <= n * abar * (1 - abar)
        assert abs(emp - exp) < 4.5 * np.sqrt(var), (i, emp, exp, n)


@pytest.fixture(scope="module")
def mtp_sigma_pair():
    from llama_spec.testing.synthetic_mtp import synthetic_mtp_path

    m = Model(synthetic_mtp_path(sigma=0.02, seed=0), load_mtp=True, repack=False)
    spec = SpeculativeGenerator(m, MtpDrafter(m, n_ctx=4096), n_ctx=4096, n_max=3)
    yield spec
    spec.close()
    m.close()


def test_recurrent_target_refuses_n_max_above_its_snapshots(mtp_sigma_pair):
    spec = mtp_sigma_pair  # built with n_max=3: 3 state snapshots
    assert spec.ctx.n_rs_seq == 3
    with pytest.raises(ValueError, match=r"n_max=4 exceeds the n_max=3"):
        spec.generate("Once upon a time", n_max=4, n_predict=8)
    assert spec.generate("Once upon a time", n_max=3, n_predict=8, seed=1).stats.drafted > 0


# -- invariant 7: rejected drafts leave no trace (hybrid recurrent model) ---------------------------
def test_rollback_next_verification_sees_only_accepted_prefix(mtp_sigma_pair):
    """After a rejection, the next verification's logits equal those of a fresh context fed
    exactly the accepted prefix (prompt + emitted tokens) and the same batch.

    The fresh context receives the prefix as one prefill, the generator received it in pieces,
    so the recurrent layer's chunked and step-by-step arithmetic may differ in the last bits.
    The synthetic model is nearly a bigram model (its trunk matrices are ~1e-3), so one stale
    token moves the logits by only ~3e-3: we require the rolled-back state to match the fresh
    context at least 10x more closely than a context that kept one wrong token does.
    """
    from llama_spec import Context

    spec = mtp_sigma_pair
    m = spec.model
    watch = RequestWatch(keep_logits=True)
    r = spec.generate("Once upon a time", sampling=SamplerParams(temp=0.8), seed=4, n_predict=60, ignore_eos=True,
                      observers=[watch])
    seen = watch.verifications
    history = r.prompt_tokens + r.tokens
    checked = 0
    for (pos0_a, batch_a, _), (pos0_b, batch_b, logits_b) in zip(seen, seen[1:], strict=False):
        if pos0_b - pos0_a >= len(batch_a):
            continue  # all drafts were kept: no rollback happened before this verification
        prefix = history[:pos0_b]
        assert list(batch_b[:1]) == history[pos0_b:pos0_b + 1]
        fresh = Context(m, n_ctx=512, n_batch=512)
        fresh.prefill(prefix)
        ref = fresh.decode(batch_b, outputs="all").copy()
        good_diff = float(np.abs(ref - logits_b).max())
        # the test can fail: a context that also saw a rejected token differs by far more
        bad = Context(m, n_ctx=512, n_batch=512)
        bad.prefill(prefix + [int(batch_a[-1]) ^ 1])
        wrong = bad.decode(batch_b, np.arange(len(prefix) + 1, len(prefix) + 1 + len(batch_b)), outputs="all").copy()
        wrong_diff = float(np.abs(wrong - logits_b).max())
        assert good_diff * 10 < wrong_diff, (good_diff, wrong_diff)
        fresh.close()
        bad.close()
        checked += 1
        if checked == 3:
            break
    assert checked >= 1


# -- invariant 5: reasoning budget, accept() exactly once per emitted token --------------------------
@pytest.mark.parametrize("rule", RULES)
def test_reasoning_budget_with_every_rule(rule):
    from llama_spec import ReasoningBudget
    from llama_spec.testing.synthetic_mtp import synthetic_mtp_path

    m = Model(synthetic_mtp_path(sigma=0.0, seed=0, thinking=True), load_mtp=True, repack=False)
    spec = SpeculativeGenerator(m, MtpDrafter(m, n_ctx=512), n_ctx=512, n_max=3)
    tok = lambda s: m.tokenize(s, add_special=False, parse_special=True)  # noqa: E731
    start, end, forced = tok("<think>"), tok("</think>"), tok("\n</think>\n\n")
    prompt = tok("<|im_start|>user\nWhy is the sky blue?<|im_end|>\n<|im_start|>assistant\n<think>\n")
    rb = ReasoningBudget(m, start=[start], end=[end], forced=forced, budget=8, initial_state="counting")
    watch = RequestWatch()
    r = spec.generate(prompt, sampling=SamplerParams(temp=0.8), seed=2, n_predict=40, reasoning_budget=rb,
                      spec_draft_sample=rule != "exact-match", verify=rule if rule != "exact-match" else "token",
                      ignore_eos=True, observers=[watch])
    toks = r.tokens
    # 8 free tokens (a few more only if the 8th ended inside a UTF-8 character), then the forced end
    i = next(j for j in range(len(toks)) if toks[j:j + len(forced)] == forced)
    assert 8 <= i <= 11, (i, toks[:16])
    assert end[0] not in toks[:i]
    assert len(toks) > i + len(forced)  # and the answer continues after the block
    assert watch.info.sampler.n_accept_calls == len(toks)  # exactly once per emitted token
    assert watch.info.sampler.budget.state == "done"
    assert r.stats.verifications > 0
    spec.close()
    m.close()
