"""Draft top-k statistics: exact accounting on scripted drafts, and on a real pair."""

from __future__ import annotations

import json

import numpy as np
import pytest

from llama_spec import SamplerParams, SpeculativeGenerator
from llama_spec.drafters.base import Drafter, Proposal
from llama_spec.observe.stats import ENV_EVERY, ENV_ON, TopKStats, topk_settings


def _prop(tokens, topk):
    return Proposal(tokens=list(tokens), q_ids=None, q_probs=None,
                    topk_ids=[np.asarray(t, dtype=np.int32) for t in topk],
                    topk_probs=[np.linspace(0.5, 0.01, len(t)).astype(np.float32) for t in topk])


def test_accounting_every_path():
    st = TopKStats(every=1000)
    top = [list(range(10, 18)), list(range(20, 28)), list(range(30, 38))]
    # 1. rejection at position 2; the emitted (recovered) token is the drafter's rank 2 there
    st.record(_prop([10, 20, 30], top), [10, 21], n_accepted=1)
    # 2. all 3 accepted + bonus token (the bonus belongs to no draft position)
    st.record(_prop([10, 20, 30], top), [10, 20, 30, 99], n_accepted=3)
    # 3. EOS emitted as the accepted first draft: the loop stopped, positions 2-3 never reached
    st.record(_prop([10, 20, 30], top), [10], n_accepted=1)
    # 4. budget forcing: p one-hot on a token outside the drafter's top-8 -> "not in top-8"
    st.record(_prop([10, 20, 30], top), [500], n_accepted=0)
    # 5. context full: only one draft fitted; rejected, emitted rank 3
    st.record(_prop([10], top[:1]), [12], n_accepted=0)
    assert st.verifications == 5
    assert st.reach[:3].tolist() == [5, 2, 1]
    assert st.accepted[:3].tolist() == [3, 1, 1]
    h = st.hist
    assert h[0].tolist() == [3, 0, 1, 0, 0, 0, 0, 0, 1]
    assert h[1].tolist() == [1, 1, 0, 0, 0, 0, 0, 0, 0]
    assert h[2].tolist() == [1, 0, 0, 0, 0, 0, 0, 0, 0]
    assert (h.sum(axis=1) == st.reach).all()
    d = st.as_dict()
    assert d["positions"][0]["acceptance_rate"] == pytest.approx(3 / 5)
    assert d["positions"][0]["mean_rank2_prob"] == pytest.approx(float(np.linspace(0.5, 0.01, 8)[1]))
    g = d["widening_gain"]
    # position 1: 2 rejections (paths 4 and 5): ranks 9 and 3 -> width2 0 %, width3 50 %
    assert g[0] == {"position": 1, "rejections": 2, "width2": 0.0, "width3": 0.5}
    # position 2: 1 rejection (path 1), emitted rank 2 -> a width-2 tree recovers all of it
    assert g[1] == {"position": 2, "rejections": 1, "width2": 1.0, "width3": 1.0}
    assert "pos" in st.table()


def test_env_settings(monkeypatch):
    monkeypatch.delenv(ENV_ON, raising=False)
    monkeypatch.delenv(ENV_EVERY, raising=False)
    assert topk_settings() == (False, 128)
    monkeypatch.setenv(ENV_ON, "1")
    monkeypatch.setenv(ENV_EVERY, "16")
    assert topk_settings() == (True, 16)
    for bad in ("0", "-3", "abc", "1.5"):
        monkeypatch.setenv(ENV_EVERY, bad)
        with pytest.raises(ValueError, match=ENV_EVERY):
            topk_settings()
    monkeypatch.setenv(ENV_EVERY, "8")
    monkeypatch.setenv(ENV_ON, "yes please")
    with pytest.raises(ValueError, match=ENV_ON):
        topk_settings()


class ScriptedDrafter(Drafter):
    """Proposes [ref[j], wrong] with top-8 lists that put ref[j + 1] at rank 2 of position 2."""

    name = "scripted"

    def __init__(self, ref_full: list[int], n_prompt: int, n_vocab: int):
        self.ref = ref_full
        self.n_prompt = n_prompt
        self.vocab_size = n_vocab

    def draft(self, history, n_max, p_min):
        j = len(history)  # index of the next token in prompt + reference continuation
        if j + 1 >= len(self.ref):
            return Proposal()
        good, nxt = self.ref[j], self.ref[j + 1]
        wrong = (nxt + 1) % self.vocab_size
        toks = [good, wrong][:n_max]
        one = lambda t: (np.array([t], dtype=np.int32), np.ones(1, dtype=np.float32))  # noqa: E731
        prop = Proposal(tokens=toks, q_ids=[one(t)[0] for t in toks], q_probs=[one(t)[1] for t in toks])
        if self.collect_topk:
            prop.topk_ids = [np.array([good, 5, 6, 7, 8, 9, 10, 11], dtype=np.int32),
                             np.array([wrong, nxt, 6, 7, 8, 9, 10, 11], dtype=np.int32)][: len(toks)]
            prop.topk_probs = [np.full(8, 0.1, dtype=np.float32)] * len(toks)
        return prop


def test_loop_accounting_with_scripted_drafter(mtp_model):
    plain = SpeculativeGenerator(mtp_model, None, n_ctx=512)
    prompt = mtp_model.tokenize("Hello world")
    ref = plain.generate(prompt, sampling=SamplerParams(temp=0.0), n_predict=40, ignore_eos=True)
    plain.close()
    drafter = ScriptedDrafter(prompt + ref.tokens, len(prompt), mtp_model.n_vocab)
    gen = SpeculativeGenerator(mtp_model, drafter, n_ctx=512, n_max=2)
    st = TopKStats(every=1000).attach(gen)
    r = gen.generate(prompt, sampling=SamplerParams(temp=0.0), n_predict=40, n_max=2, ignore_eos=True)
    gen.close()
    assert r.tokens == ref.tokens  # greedy: the scripted drafts never change the output
    v = r.stats.verifications
    assert st.verifications == v > 5
    # every verification: position 1 accepted at rank 1, position 2 rejected and the emitted
    # token (the reference) sits at rank 2 of the drafter's list
    assert st.reach[0] == v and st.accepted[0] == r.stats.accepted_at[0] == v
    assert st.hist[0, 0] == v
    assert st.reach[1] == r.stats.reached[1] and st.hist[1, 1] == st.reach[1] and st.accepted[1] == 0
    assert st.as_dict()["widening_gain"][1]["width2"] == 1.0


@pytest.mark.slow
def test_qwen_pair_topk_report_json_and_png(qwen15, qwen05, tmp_path):
    from llama_spec import DraftModelDrafter

    gen = SpeculativeGenerator(qwen15, DraftModelDrafter(qwen05, n_ctx=1024), n_ctx=1024, n_max=3)
    logs = []
    st = TopKStats(every=16, log=logs.append).attach(gen)
    r = gen.generate("Write a long Python module that implements a linked list with many methods.\n",
                     sampling=SamplerParams(temp=0.8), seed=3, n_predict=192, ignore_eos=True)
    gen.close()
    st.to_json(tmp_path / "topk.json")
    st.plot(tmp_path / "topk.png")
    d = json.loads((tmp_path / "topk.json").read_text())
    assert (tmp_path / "topk.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert d["verifications"] == r.stats.verifications
    for i, p in enumerate(d["positions"]):
        assert sum(p["rank_hist"]) == p["reach"] == r.stats.reached[i]
        assert p["accepted"] == r.stats.accepted_at[i]
    assert d["positions"][0]["accepted"] == r.stats.accepted_at[0]
    assert logs and "statistics" in logs[0]
