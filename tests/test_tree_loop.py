"""Tree proposals in the loop (issue 12): greedy equality, width 1 == the token rule, memory, bad input.

smollm2-135m is target and draft (fast); flash attention is off in the greedy test: llama.cpp's
CPU flash-attention kernel accumulates in fp16 and its rounding depends on the order of the KV
cells, which a tree's rejected branches change (see docs/trees.md).
"""

from __future__ import annotations

import numpy as np
import pytest
from conftest import THREADS

from llama_spec import SpeculativeGenerator
from llama_spec.drafters.draft_model import DraftModelDrafter
from llama_spec.drafters.tree import TreeProposal
from llama_spec.llama.context import Context
from llama_spec.llama.sampling import SamplerParams
from llama_spec.observe.observers import Observer, RequestWatch

PROMPT = "The capital of France is"
NO_FA = {"flash_attn": "off"}


def _gen(model, tree=None, **kw):
    d = DraftModelDrafter(model, n_ctx=256, n_threads=THREADS)
    return SpeculativeGenerator(model, d, n_ctx=256, n_threads=THREADS, tree=tree, context_options=NO_FA, **kw)


class _Margins(Observer):
    """Per emitted token of a plain run: the gap between its top two logits."""

    def __init__(self) -> None:
        self.gaps: list[float] = []

    def on_verify(self, v) -> None:
        for row in v.logits[: len(v.emitted)]:
            top2 = np.sort(row)[-2:]
            self.gaps.append(float(top2[1] - top2[0]))


# A rejected branch can leave a hole in the KV cells before the live ones; llama.cpp's CPU
# attention then rounds differently (docs/trees.md: up to 0.7 on this model), so greedy tree
# output equals plain decoding up to a near-tie. On an AVX-512 CPU (session 7) one flip came at
# token 14, where plain's top-two gap is 0.19; on the AVX2 machines none came.
NEAR_TIE = 1.0


def test_greedy_tree_equals_plain(smollm):
    plain = SpeculativeGenerator(smollm, None, n_ctx=256, n_threads=THREADS, context_options=NO_FA)
    gen = _gen(smollm, (2, 2, 1))
    try:
        gaps = _Margins()
        r0 = plain.generate(PROMPT, sampling=SamplerParams(temp=0.0), n_predict=20, observers=[gaps])
        r1 = gen.generate(PROMPT, sampling=SamplerParams(temp=0.0), n_predict=20)
        diff = next((i for i, (a, b) in enumerate(zip(r1.tokens, r0.tokens, strict=True)) if a != b), None)
        if diff is not None:   # only a near-tie of plain decoding may flip
            assert gaps.gaps[diff] < NEAR_TIE, (diff, gaps.gaps, r1.tokens, r0.tokens)
        assert r1.tokens[: diff or len(r0.tokens)] == r0.tokens[: diff or len(r0.tokens)]
        assert (diff or len(r0.tokens)) >= 8   # the bit-exact first verifications reach past the prompt
        assert r1.stats.verifications > 0 and r1.stats.accepted > 0
    finally:
        gen.close()
        plain.close()


def test_width_one_tree_is_the_token_rule(smollm):
    """Invariant 10 at loop level: tree (1, 1, 1) drafts what the chain drafts (the mirror's own
    draws) and every position is the token rule's step: same tokens, same accept RNG afterwards."""
    sp = SamplerParams(temp=0.9)
    chain, tree = _gen(smollm, None, n_max=3), _gen(smollm, (1, 1, 1), n_max=3)
    try:
        wc, wt = RequestWatch(), RequestWatch()
        rc = chain.generate(PROMPT, sampling=sp, seed=5, n_predict=16, observers=[wc])
        rt = tree.generate(PROMPT, sampling=sp, seed=5, n_predict=16, observers=[wt])
        assert rt.tokens == rc.tokens
        assert rt.stats.accepted == rc.stats.accepted
        assert wt.info is not None and wc.info is not None
        assert np.array_equal(wt.info.rng, wc.info.rng)          # same accept randomness consumed
        assert not np.array_equal(wt.info.rng, wt.rng_at_start)  # and some was consumed
    finally:
        chain.close()
        tree.close()


class _RowCheck(Observer):
    """After each tree verification: row 0 (the root) against a fresh context fed the prefix."""

    def __init__(self, fresh: Context) -> None:
        self.fresh, self.errors, self.argmax_ok = fresh, [], []

    def on_request(self, info) -> None:
        self.hist = list(info.prompt_tokens)

    def on_verify(self, v) -> None:
        if not v.first and isinstance(v.proposal, TreeProposal):
            self.fresh.clear()
            row = self.fresh.prefill(self.hist)
            self.errors.append(float(np.abs(row - v.logits[0]).max()))
            self.argmax_ok.append(int(np.argmax(row)) == int(np.argmax(v.logits[0])))
        self.hist += list(v.emitted)


def test_memory_holds_the_accepted_prefix(smollm):
    """Target seq 0 holds exactly the accepted prefix after each verification, no other sequence
    holds anything, and the next verification's root logits match a fresh context's: bit for bit
    at the first one (the second was 0.0 on the AVX2 machines and 0.62 on an AVX-512 one, session 7:
    a hole left earlier or that CPU's rounding, not told apart), then up to the rounding of
    llama.cpp's CPU attention, which depends on where the cells lie (docs/trees.md: a shifted but
    otherwise identical plain context differs by up to 0.7 on this model), with the same argmax."""
    gen = _gen(smollm, (2, 1, 1))
    fresh = Context(smollm, n_ctx=256, n_threads=THREADS, flash_attn="off")
    check = _RowCheck(fresh)
    try:
        r = gen.generate(PROMPT, sampling=SamplerParams(temp=0.0), n_predict=16, observers=[check])
        n = len(r.prompt_tokens) + len(r.tokens)
        assert gen.ctx.pos_max(0) <= n - 1
        assert all(gen.ctx.pos_max(s) == -1 for s in range(1, gen.ctx.n_seq_max))
        # the first tree verification follows a plain prefill: no hole yet, so bit for bit
        assert len(check.errors) >= 3 and check.errors[0] == 0.0, check.errors
        assert max(check.errors) < 3.0 and all(check.argmax_ok), (check.errors, check.argmax_ok)
    finally:
        fresh.close()
        gen.close()


def test_bad_tree_input_before_any_decode(smollm, mtp_model):
    d = DraftModelDrafter(smollm, n_ctx=256, n_threads=THREADS)
    try:
        for bad, msg in (((0, 1), "width"), ((8, 8), "nodes"), ((), "depth"), ("3,x", "integers")):
            with pytest.raises(ValueError, match=msg):
                SpeculativeGenerator(smollm, d, n_ctx=256, n_threads=THREADS, tree=bad)
        with pytest.raises(ValueError, match="cannot draft trees"):
            SpeculativeGenerator(smollm, None, n_ctx=256, n_threads=THREADS, tree=(2, 1))
        assert d.ctx.pos_max(0) == -1  # nothing was decoded
        gen = SpeculativeGenerator(smollm, d, n_ctx=256, n_threads=THREADS)
        with pytest.raises(ValueError, match="sequences in the target context"):
            gen.stream(PROMPT, tree=(3, 1))
        assert gen.ctx.pos_max(0) == -1
        gen.close()
    finally:
        d.close()
    with pytest.raises(ValueError, match="recurrent"):  # the hybrid MTP model as draft model
        DraftModelDrafter(mtp_model, n_ctx=256, n_threads=THREADS).enable_tree((2, 1))
    from llama_spec.drafters.mtp import MtpDrafter

    mtp = MtpDrafter(mtp_model, n_ctx=256, n_threads=THREADS)
    with pytest.raises(ValueError, match="draft-mtp cannot draft trees"):
        mtp.enable_tree((2, 1))
    mtp.close()
    with pytest.raises(ValueError, match="recurrent"):  # ... and as target
        SpeculativeGenerator(mtp_model, None, n_ctx=256, n_threads=THREADS, n_max=3, tree=(2, 1))


class _Leaves(Observer):
    """Counts tree verifications that ended at an accepted leaf with a bonus token emitted."""

    def __init__(self) -> None:
        self.leaf_bonus = self.trees = 0

    def on_verify(self, v) -> None:
        if isinstance(v.proposal, TreeProposal) and len(v.proposal):
            self.trees += 1
            self.leaf_bonus += int(v.tree_outcome.ended_at_leaf and len(v.emitted) > v.n_accepted)


def test_tree_stats_count_bonus_at_leaves_and_topk_measures_the_gain(smollm):
    """SpecStats: a bonus follows an accepted leaf (not 'every node kept'); positions are depths.
    TopKStats: the tree's accepted length next to its first-child chain's (the measured gain)."""
    from llama_spec.observe.stats import TopKStats

    gen = _gen(smollm, (3, 1))
    try:
        topk = TopKStats().attach(gen)
        leaves = _Leaves()
        r = gen.generate(PROMPT, sampling=SamplerParams(temp=1.0), seed=2, n_predict=40, ignore_eos=True,
                         observers=[leaves])
        st = r.stats
        assert st.verifications == leaves.trees > 0
        assert st.bonus == leaves.leaf_bonus > 0
        assert st.verifications - 1 <= st.recovered + st.bonus <= st.verifications  # the last may stop early
        assert st.reached[0] == st.verifications and sum(st.reached[2:]) == 0  # depth 2 only
        assert st.accepted == sum(st.accepted_at[:2])
        g = topk.measured_tree_gain()
        assert g is not None and g["verifications"] == st.verifications and g["width_depth1"] == 3
        assert g["tree_accepted_per_verification"] * g["verifications"] == pytest.approx(st.accepted)
        assert g["tree_accepted_per_verification"] >= g["chain_accepted_per_verification"]
        assert "tree:" in topk.table() and topk.as_dict()["tree"] == g
    finally:
        gen.close()


def test_cli_spec_draft_tree_greedy_equals_plain(smollm_path):
    import subprocess
    import sys

    def run(*extra):
        r = subprocess.run([sys.executable, "-m", "llama_spec", "generate", "-m", str(smollm_path), "-p", PROMPT,
                            "-n", "16", "--temp", "0", "-c", "256", "-t", "1", "-fa", "off", "-nr", *extra],
                           capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stderr[-2000:]
        return r
    plain = run("--spec-type", "none")
    tree = run("-md", str(smollm_path), "--spec-draft-tree", "2,1", "--spec-topk-stats")
    assert tree.stdout == plain.stdout and len(plain.stdout.strip()) > 0
    assert "tree:" in tree.stderr and "verifications=" in tree.stderr
    bad = subprocess.run([sys.executable, "-m", "llama_spec", "generate", "-m", str(smollm_path), "-p", PROMPT,
                          "-md", str(smollm_path), "--spec-draft-tree", "0,1", "-n", "4"],
                         capture_output=True, text=True, timeout=300)
    assert bad.returncode != 0 and "tree" in bad.stderr and "Traceback" not in bad.stderr
