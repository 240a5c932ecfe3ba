"""Parity with llama-completion at llama.cpp's default settings (weight repacking on).

Plain generation prefills the prompt as llama-completion does (the whole prompt, last token
included, in n_batch chunks), so greedy output equals the native tool's token for token even
with repacked weights, whose batched and single-token kernels round differently (docs/design.md
invariant 12). The other cross-checks (tests/test_binding.py) run with repacking off.
"""

from __future__ import annotations

import pytest
from conftest import THREADS, run_native

from llama_spec import Model, SamplerParams, SpeculativeGenerator

PROMPTS = [  # 3 models x 4 prompts x 64 tokens (issue 15)
    "The capital of France is",
    "def fibonacci(n):\n    ",
    "Once upon a time, in a small village by the sea,",
    "List three uses of a hash map:\n1.",
]
N = 64


def _native_greedy(native_bin, model_path, prompt: str, n: int) -> str:
    # no -nr: llama.cpp's default (repack on), like Model's default
    r = run_native(native_bin, "llama-completion", [
        "-m", str(model_path), "-p", prompt, "-n", str(n), "--temp", "0", "-no-cnv", "--no-warmup",
        "-c", "512", "-t", str(THREADS), "--ignore-eos", "--no-display-prompt", "--simple-io"])
    assert r.returncode == 0, r.stderr[-2000:]
    return r.stdout


@pytest.fixture(scope="module")
def generators(request):
    """One repacked (default) model and generator per test model, shared by the prompts."""
    made: dict = {}
    yield lambda which: made.get(which) or made.setdefault(which, _make(request.getfixturevalue(which)))
    for model, gen in made.values():
        gen.close()
        model.close()


def _make(path):
    model = Model(path)  # defaults: repack on
    return model, SpeculativeGenerator(model, None, n_ctx=512, n_threads=THREADS)



@pytest.mark.parametrize("i", range(len(PROMPTS)))
@pytest.mark.parametrize("which", ["smollm_path", "qwen05_path", "qwen15_path"])
def test_greedy_with_repack_matches_llama_completion(which, i, request, native_bin, generators):
    path = request.getfixturevalue(which)
    _, gen = generators(which)
    prompt = PROMPTS[i]
    native = _native_greedy(native_bin, path, prompt, N)
    ours = gen.generate(prompt, sampling=SamplerParams(temp=0.0), n_predict=N, ignore_eos=True)
    assert len(ours.tokens) == N
    assert native.strip() == ours.text.strip(), f"\nnative: {native!r}\nours:   {ours.text!r}"
