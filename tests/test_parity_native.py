"""Parity with llama-speculative-simple at llama.cpp's default settings (weight repacking on).

With a draft-simple drafter the loop uses the native tool's batch shapes on both contexts: the
target and the draft model decode prompt[:-1] in one batch, the first verification is
[prompt[-1], drafts..], every verification batch is also decoded by the draft context
(common_speculative_process), and the draft model drafts from single-token steps it then drops.
So greedy draft-simple output equals the native tool's token for token, repacked weights
included (docs/design.md invariant 12). Plain generation vs llama-completion: tests/test_parity_completion.py.
"""

from __future__ import annotations

import pytest
from conftest import THREADS, run_native

from llama_spec import Model, SamplerParams, SpeculativeGenerator
from llama_spec.drafters.draft_model import DraftModelDrafter

PROMPTS = ["The capital of France is", "def fibonacci(n):\n    "]
N = 64


def _native_spec(native_bin, target, draft, prompt: str, n: int) -> str:
    # no -nr: repack on, llama.cpp's default; n-max 3 and p-min 0 are its defaults too
    r = run_native(native_bin, "llama-speculative-simple", [
        "-m", str(target), "-md", str(draft), "-p", prompt, "-n", str(n), "--temp", "0", "-c", "1024",
        "-t", str(THREADS), "--spec-type", "draft-simple", "--spec-draft-n-max", "3"])
    assert r.returncode == 0, r.stderr[-2000:]
    out = r.stdout
    i = out.find(prompt)
    return out[i + len(prompt):] if i >= 0 else out


def _ours(target_path, draft_path, prompts, n):
    t, d = Model(target_path), Model(draft_path)   # defaults: repack on
    gen = SpeculativeGenerator(t, DraftModelDrafter(d, n_ctx=1024, n_threads=THREADS), n_ctx=1024, n_threads=THREADS, n_max=3)
    try:
        return [gen.generate(p, sampling=SamplerParams(temp=0.0), n_predict=n, ignore_eos=True).text for p in prompts]
    finally:
        gen.close()
        t.close()
        d.close()


def _check(native: str, ours: str) -> None:
    ours = ours.rstrip("\ufffd")
    assert ours and native.startswith(ours), f"\nnative: {native!r}\nours:   {ours!r}"


@pytest.mark.parametrize("pair", [("smollm_path", "smollm_path"), ("qwen15_path", "qwen05_path")],
                         ids=["smollm<-smollm", "qwen1.5b<-qwen0.5b"])
def test_draft_simple_greedy_matches_llama_speculative_simple(pair, request, native_bin):
    tp, dp = (request.getfixturevalue(x) for x in pair)
    prompts = PROMPTS if pair[0] == "smollm_path" else PROMPTS[:1]
    ours = _ours(tp, dp, prompts, N)
    for prompt, o in zip(prompts, ours, strict=True):
        _check(_native_spec(native_bin, tp, dp, prompt, N), o)


# An open-ended prompt (scripts/edit_prompts.json "open" #0): on it, before the n-gram drafters
# used the native batch shapes, ours and the native tool's greedy texts differed (0/4 equal,
# session 7); with them, 4/4.
OPEN_PROMPT = ("### Instruction:\nWrite a short story about a lighthouse keeper who finds a message in a bottle."
               "\n\n\n### Response:\n")


def _ours_ngram(target_path, kind: str, prompt: str, n: int) -> str:
    from llama_spec.drafters.ngram import build_ngram_drafter

    t = Model(target_path)   # repack on
    gen = SpeculativeGenerator(t, build_ngram_drafter(kind), n_ctx=1024, n_threads=THREADS, n_max=64)
    try:
        return gen.generate(prompt, sampling=SamplerParams(temp=0.0), n_predict=n, ignore_eos=True).text
    finally:
        gen.close()
        t.close()


@pytest.mark.parametrize("kind", ["ngram-simple", "ngram-mod"])
def test_ngram_greedy_matches_llama_speculative_simple(kind, qwen15_path, native_bin):
    ours = _ours_ngram(qwen15_path, kind, OPEN_PROMPT, N)
    r = run_native(native_bin, "llama-speculative-simple", [
        "-m", str(qwen15_path), "-p", OPEN_PROMPT, "-n", str(N), "--temp", "0", "-c", "1024",
        "-t", str(THREADS), "--spec-type", kind])
    assert r.returncode == 0, r.stderr[-2000:]
    i = r.stdout.find(OPEN_PROMPT)
    _check(r.stdout[i + len(OPEN_PROMPT):] if i >= 0 else r.stdout, ours)
