"""Rejection under a grammar (issue 16, item 3): q masked with a clone of the target's grammar state.

With a grammar, p is grammar-masked (the target sampler applies the grammar before its chain).
The draft-model drafter (and the n-gram drafters' sampled q) mask q with a clone of the target's
grammar state, taken at the start of each draft and advanced by each drafted token, so every
draft is grammar-valid and the token/block rules stay exact (docs/design.md invariant 3); a drafter
that does not mask still gets the exact-match fallback.

Distribution tests (the first two tokens, as tests/test_distribution.py) under a 12-colour enum
grammar from ``json_schema_to_grammar``; t0 is then always ``"`` and t1 the first token of a
colour, which the verifier decides with one draft. The emitted histogram is compared with the
exact law of (t0, t1) rebuilt from the logged p (``FirstTwoLaws``): a chi-square goodness-of-fit
test, threshold p > 5e-5 (a correct rule fails 1 in 20,000). Power against the broken rule
(recover from p instead of the residual), computed from the logged p and q before the broken arm
runs (noncentral chi-square, lambda = N sum (b - p)^2 / p): the broken arm is asserted caught at
level 1e-2, and the test first asserts that power > 1 - 1e-4 there (measured at N = 300:
draft-model lambda ~ 63, n-gram lambda ~ 72, power > 0.99999). Two drafters:

* draft-simple (SmolLM2 drafting for itself) with a sharpened mirror (temperature x 0.25), so
  q differs from p (acceptance ~ 0.46) and the broken rule shows: with q = p it is invisible.
* ngram-simple with sampled q (n = 1): the empirical law of what followed ``"`` in the prompt,
  masked by the grammar (the closing quotes' ``\\n`` followers are forbidden after ``"``).

Generators run with n_threads=1: on a busy 2-core machine llama.cpp's two-thread barrier costs
more than it gains on a 135M model (measured ~13x slower per request at load 15).
"""

from __future__ import annotations

import glob
import json
from pathlib import Path

import numpy as np
import pytest
from scipy import stats

from llama_spec import DraftModelDrafter, SamplerParams, SpeculativeGenerator
from llama_spec.drafters.ngram import NgramSimpleDrafter
from llama_spec.llama.grammar import GrammarState, json_schema_to_grammar
from llama_spec.llama.sampling import TargetSampler
from llama_spec.testing import distribution as dist

THRESHOLD = 5e-5     # exactness: a correct rule fails with this probability
ALPHA_BROKEN = 1e-2  # the broken rule must give p below this (power > 1 - 1e-4 asserted first)
N_DIST = 300
COLOURS = ["red", "green", "blue", "yellow", "purple", "orange", "black", "white", "pink", "brown", "gray", "cyan"]
DIST_PROMPT = ('Colours:\n"red"\n"green"\n"red"\n"black"\n"red"\n"red"\n"green"\n"red"\n'
               "The colour of the clear sky at noon is\n")
DIST_SAMPLING = SamplerParams(temp=1.0, top_k=40, top_p=1.0, min_p=0.0)
JSON_PROMPTS = [
    "Describe a person as a JSON object with name, age and city.\n",
    "A JSON list of three fruits:\n",
    'Write the JSON for a book: {"title": ...}\n',
]


def _json_gbnf() -> str:
    paths = sorted(glob.glob(str(Path.home() / ".cache/llama-spec/src/*/llama.cpp/grammars/json.gbnf")))
    if paths:
        return Path(paths[0]).read_text()
    return json_schema_to_grammar({"type": "object"})  # no unpacked source: llama.cpp's any-object grammar


class UnmaskedDrafter(DraftModelDrafter):
    """Today's draft-simple under a grammar: q ignores it (the exact-match fallback applies)."""

    def bind_grammar(self, source) -> None:
        self.grammar_source = None


class SharpDrafter(DraftModelDrafter):
    """draft-simple whose mirror runs at 0.25 x the target's temperature: q != p, still masked."""

    def configure(self, params, seed, **kw) -> None:
        super().configure(params, seed, **kw)
        self.mirror.configure(params.replace(temp=params.temp * 0.25))


@pytest.fixture(scope="module")
def json_grammar() -> str:
    return _json_gbnf()


# -- 3. json_schema_to_grammar ---------------------------------------------------------------------
SCHEMAS = [
    {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
     "required": ["name", "age"]},
    {"type": "array", "items": {"type": "number"}, "minItems": 1, "maxItems": 4},
    {"enum": COLOURS},
    {"type": "object", "properties": {"id": {"type": "string", "format": "uuid"},
                                      "tags": {"type": "array", "items": {"type": "string"}},
                                      "ok": {"type": "boolean"}}, "required": ["id"]},
    {"$defs": {"pt": {"type": "object", "properties": {"x": {"type": "number"}, "y": {"type": "number"}}}},
     "type": "array", "items": {"$ref": "#/$defs/pt"}},
]


@pytest.mark.parametrize("schema", SCHEMAS, ids=["object", "array", "enum", "formats", "ref"])
def test_json_schema_to_grammar_accepted_by_llama(smollm, schema):
    for s in (schema, json.dumps(schema)):
        g = json_schema_to_grammar(s)
        assert "root ::=" in g
        TargetSampler(smollm, SamplerParams(grammar=g))  # llama.cpp parses it (ValueError otherwise)


@pytest.mark.parametrize("bad", ['{"type": "object"', '{"type": "foo"}', '{"$ref": "#/nope"}', "", "nul\x00"])
def test_invalid_schema_raises_value_error(bad):
    with pytest.raises(ValueError, match="schema"):
        json_schema_to_grammar(bad)


def test_schema_type_error_and_known_output():
    with pytest.raises(TypeError):
        json_schema_to_grammar(3)  # type: ignore[arg-type]
    g = json_schema_to_grammar({"enum": ["a", "b"]})
    assert 'root ::= ("\\"a\\"" | "\\"b\\"")' in g


def test_grammar_state_clone_allowed_accept(smollm):
    ts = TargetSampler(smollm, SamplerParams(grammar=json_schema_to_grammar({"enum": ["red", "blue"]})))
    q = smollm.tokenize('"', add_special=False)[0]
    red, blue, x = (smollm.tokenize(w, add_special=False)[0] for w in ("red", "blue", "x"))
    g = ts.grammar_clone()
    assert isinstance(g, GrammarState)
    assert g.allowed(np.array([q, red], dtype=np.int32)).tolist() == [True, False]
    g.accept(q)
    assert g.allowed(np.array([red, blue, x], dtype=np.int32)).tolist() == [True, True, False]
    with pytest.raises(ValueError, match="not allowed"):
        g.accept(x)  # llama.cpp would abort on it: checked in Python first
    # the target's own state is untouched by the clone
    assert ts.grammar_clone().allowed(np.array([q, red], dtype=np.int32)).tolist() == [True, False]
    assert TargetSampler(smollm, SamplerParams()).grammar_clone() is None


# -- 1. JSON under a grammar: the token rule runs, output parses, acceptance beats the fallback ----
def _json_runs(gen, grammar, verify="token", seeds=(1, 2)):
    out, acc, drafted = [], 0, 0
    for i, prompt in enumerate(JSON_PROMPTS):
        for seed in seeds:
            r = gen.generate(prompt, sampling=SamplerParams(temp=0.8, grammar=grammar), seed=seed + 10 * i,
                             n_predict=96, verify=verify)
            out.append(r)
            acc += r.stats.accepted
            drafted += r.stats.drafted
    return out, acc / max(drafted, 1)


def test_json_grammar_token_rule_valid_and_beats_exact_match(smollm, json_grammar):
    masked = SpeculativeGenerator(smollm, DraftModelDrafter(smollm, n_ctx=512, n_threads=1), n_ctx=512, n_max=3,
                                  n_threads=1)
    unmasked = SpeculativeGenerator(smollm, UnmaskedDrafter(smollm, n_ctx=512, n_threads=1), n_ctx=512, n_max=3,
                                    n_threads=1)
    try:
        runs, acc = _json_runs(masked, json_grammar)
        assert sum(r.stats.exact_match_verifications for r in runs) == 0  # the token rule decided
        assert sum(r.stats.verifications for r in runs) > 10
        ended = [r for r in runs if r.stop_reason == "eos"]
        assert len(ended) >= 3, [r.text for r in runs]
        for r in ended:
            json.loads(r.text)  # every emitted token was grammar-valid
        base, acc_exact = _json_runs(unmasked, json_grammar)
        assert all(r.stats.exact_match_verifications == r.stats.verifications for r in base)  # the fallback
        assert acc > acc_exact, (acc, acc_exact)
        # the block rule under a grammar: drafts are grammar-valid, so its sampler clone accepts them
        blk, _ = _json_runs(masked, json_grammar, verify="block", seeds=(3,))
        assert sum(r.stats.block_verifications for r in blk) > 0
        for r in blk:
            if r.stop_reason == "eos":
                json.loads(r.text)
    finally:
        masked.close()
        unmasked.close()


# -- 4. greedy under a grammar == plain decoding ---------------------------------------------------
@pytest.mark.parametrize("make", [lambda m: DraftModelDrafter(m, n_ctx=512, n_threads=1),
                                  lambda m: NgramSimpleDrafter(size_n=2, size_m=8)], ids=["draft-simple", "ngram"])
def test_greedy_under_grammar_equals_plain(smollm, json_grammar, make):
    sp = SamplerParams(temp=0.0, grammar=json_grammar)
    plain = SpeculativeGenerator(smollm, None, n_ctx=512, n_threads=1)
    spec = SpeculativeGenerator(smollm, make(smollm), n_ctx=512, n_max=3, n_threads=1)
    try:
        for prompt in JSON_PROMPTS[:2]:
            a = plain.generate(prompt, sampling=sp, n_predict=48)
            b = spec.generate(prompt, sampling=sp, n_predict=48)
            assert b.tokens == a.tokens
        assert spec.total.drafted > 0
    finally:
        plain.close()
        spec.close()


# -- 2. exactness under a grammar, with stated power -----------------------------------------------
def _gof(counts, laws: dist.FirstTwoLaws, n: int) -> float:
    """Chi-square goodness of fit of the (t0, t1) histogram to the exact plain law (cells with an
    expected count >= 5; the rest merged into one cell)."""
    plain, _ = laws.plain_and_broken()
    cells = [c for c in plain if plain[c] * n >= 5]
    obs = [counts.get(c, 0) for c in cells]
    exp = [plain[c] * n for c in cells]
    obs.append(n - sum(obs))
    exp.append(max(n - sum(exp), 0.0))
    if exp[-1] < 1e-9:
        obs, exp = obs[:-1], exp[:-1]
    exp = np.asarray(exp) * (sum(obs) / sum(exp))  # float rounding of the logged probabilities
    return float(stats.chisquare(obs, exp).pvalue)


def _gof_power(laws: dist.FirstTwoLaws, n: int, alpha: float) -> tuple[float, float]:
    plain, broken = laws.plain_and_broken()
    cells = [c for c in plain if plain[c] * n >= 5]
    p = np.array([plain[c] for c in cells] + [max(1.0 - sum(plain[c] for c in cells), 0.0)])
    b = np.array([broken[c] for c in cells] + [max(1.0 - sum(broken[c] for c in cells), 0.0)])
    keep = p > 1e-12
    lam = n * float(np.sum((b[keep] - p[keep]) ** 2 / p[keep]))
    df = int(keep.sum()) - 1
    return float(stats.ncx2.sf(stats.chi2.isf(alpha, df), df, lam)), lam


@pytest.mark.parametrize("make", [lambda m: SharpDrafter(m, n_ctx=256, n_threads=1),
                                  lambda m: NgramSimpleDrafter(size_n=1, size_m=4)], ids=["draft-simple", "ngram"])
def test_exact_under_grammar_and_broken_rule_caught(smollm, make):
    sampling = DIST_SAMPLING.replace(grammar=json_schema_to_grammar({"enum": COLOURS}))
    gen = SpeculativeGenerator(smollm, make(smollm), n_ctx=256, n_max=3, n_threads=1)
    try:
        laws = dist.FirstTwoLaws()
        t0 = gen.total
        d0, e0 = t0.drafted, t0.exact_match_verifications
        got = dist.joint_samples(gen, DIST_PROMPT, range(N_DIST), sampling=sampling, n_predict=3, laws=laws)
        assert gen.total.drafted - d0 == N_DIST            # every t1 was decided by the verifier ...
        assert gen.total.exact_match_verifications == e0   # ... with the token rule (q grammar-masked)
        for t0_t1 in got:  # every (t0, t1) starts a quoted colour
            text = smollm.detokenize(list(t0_t1))
            assert any(f'"{c}"'.startswith(text) for c in COLOURS), text
        assert 0.2 < laws.acceptance() < 0.9, laws.acceptance()
        p_ok = _gof(got, laws, N_DIST)
        assert p_ok > THRESHOLD, (p_ok, got.most_common(8))

        power, lam = _gof_power(laws, N_DIST, ALPHA_BROKEN)
        assert power > 1 - 1e-4, (power, lam)
        bad = dist.joint_samples(gen, DIST_PROMPT, range(20_000, 20_000 + N_DIST), sampling=sampling, n_predict=3,
                                 verify=dist.BrokenTokenRule())
        p_bad = _gof(bad, laws, N_DIST)
        assert p_bad < ALPHA_BROKEN, (p_bad, lam)
    finally:
        gen.close()
