"""The public drafter interface: the examples of docs/drafters.md run as written, and a drafter
that overrides only draft() runs end to end (invariants 1-4 hold for it)."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

import llama_spec
from llama_spec import Drafter, Proposal, SamplerParams, SpeculativeGenerator, TokenEvent

DOC = Path(__file__).resolve().parent.parent / "docs" / "drafters.md"


def _code_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", DOC.read_text(), flags=re.S)


def test_docs_have_the_examples():
    blocks = _code_blocks()
    assert len(blocks) == 3
    assert "class PromptLookupDrafter(Drafter)" in blocks[0] and "q_ids=None" in blocks[0]
    assert "class UnigramDrafter(Drafter)" in blocks[1] and 'verify="block"' in DOC.read_text()


def test_docs_examples_run(smollm_path, capsys):
    ns: dict = {"MODEL_PATH": str(smollm_path)}
    for code in _code_blocks():  # one namespace: later blocks use earlier names, as a reader would
        exec(compile(code, str(DOC), "exec"), ns)  # noqa: S102 - our own documentation
    out = capsys.readouterr().out
    assert "token drafted" in out and "block drafted" in out


class OnlyDraft(Drafter):
    """Overrides draft() and nothing else: proposes the token that followed the last one last time."""

    def draft(self, history, n_max, p_min):
        for j in range(len(history) - 2, -1, -1):
            if history[j] == history[-1]:
                return Proposal(tokens=list(history[j + 1 : j + 1 + n_max]), q_ids=None, q_probs=None)
        return Proposal(tokens=[history[-1]], q_ids=None, q_probs=None)


PROMPT = "a b c d a b c d a b c d a b"


def test_exports():
    assert llama_spec.Drafter is Drafter and llama_spec.Proposal is Proposal and llama_spec.TokenEvent is TokenEvent
    d = Drafter()
    assert (d.name, d.vocab_size, d.sample_drafts, d.collect_topk, d.params) == ("custom", 0, True, False, None)
    with pytest.raises(NotImplementedError, match="draft"):
        d.draft([1], 3, 0.0)


def test_only_draft_drafter_end_to_end(smollm):
    g = SamplerParams(temp=0.0)
    gen = SpeculativeGenerator(smollm, OnlyDraft(), n_ctx=256, n_max=3)
    plain = SpeculativeGenerator(smollm, None, n_ctx=256)
    ref = plain.generate(PROMPT, sampling=g, n_predict=24, ignore_eos=True)
    for verify in ("token", "block", "exact-match"):
        r = gen.generate(PROMPT, sampling=g, n_predict=24, verify=verify, ignore_eos=True)
        assert r.tokens == ref.tokens, verify
        assert r.stats.drafted > 0 and r.stats.accepted > 0
        # no q: every verification falls back to exact-match, whatever rule was asked for
        assert r.stats.exact_match_verifications == r.stats.verifications
    # seeded sampling: exact-match with seed s == plain with seed s (invariant 4)
    s = SamplerParams(temp=0.9)
    assert (gen.generate(PROMPT, sampling=s, seed=5, n_predict=24, ignore_eos=True).tokens
            == plain.generate(PROMPT, sampling=s, seed=5, n_predict=24, ignore_eos=True).tokens)
    # the stream object: events, then .result
    st = gen.stream(PROMPT, sampling=g, n_predict=8, ignore_eos=True)
    assert st.result is None
    events = list(st)
    assert all(isinstance(e, TokenEvent) for e in events) and [e.token for e in events] == st.result.tokens
    assert "".join(e.text for e in events) == st.result.text
    gen.close()
    plain.close()


def test_only_draft_drafter_through_the_module_generate(smollm):
    g = SamplerParams(temp=0.0)
    r = llama_spec.generate(smollm, PROMPT, drafter=OnlyDraft(), sampling=g, n_predict=16, n_ctx=256)
    ref = llama_spec.generate(smollm, PROMPT, sampling=g, n_predict=16, n_ctx=256)
    assert r.tokens == ref.tokens and r.stats.drafted > 0


def test_bad_verify_and_oversized_proposal(smollm):
    class TooMany(Drafter):
        def draft(self, history, n_max, p_min):
            t = np.array([history[-1]], dtype=np.int32)
            one = np.ones(1, dtype=np.float32)
            return Proposal(tokens=[history[-1]] * (n_max + 5), q_ids=[t] * (n_max + 5), q_probs=[one] * (n_max + 5))

    gen = SpeculativeGenerator(smollm, TooMany(), n_ctx=256, n_max=2)
    with pytest.raises(ValueError, match="verify"):
        gen.generate(PROMPT, verify="tree")
    r = gen.generate(PROMPT, sampling=SamplerParams(temp=0.7), seed=1, n_predict=12, ignore_eos=True)
    assert r.stats.drafted <= 2 * r.stats.verifications  # cut to n_max, q cut with it
    assert r.stats.exact_match_verifications == 0  # q kept its length: the token rule ran
    gen.close()
