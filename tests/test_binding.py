"""The binding layer against llama.cpp itself: load errors, tokens, logits, native cross-checks."""

from __future__ import annotations

import re

import numpy as np
import pytest
from conftest import THREADS, run_native

from llama_spec import Context, Model, ModelLoadError, SamplerParams, SpeculativeGenerator
from llama_spec.errors import DecodeError

PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):\n    ",
]


# -- bad input -----------------------------------------------------------------------------------
def test_missing_path_raises(tmp_path):
    with pytest.raises(ModelLoadError, match="no such file"):
        Model(tmp_path / "nope.gguf")


def test_text_file_renamed_gguf_raises(tmp_path):
    p = tmp_path / "notes.gguf"
    p.write_text("this is not a model, just some text that is long enough\n" * 4)
    with pytest.raises(ModelLoadError, match="not a GGUF"):
        Model(p)


def test_truncated_gguf_raises_and_interpreter_survives(tmp_path, smollm_path):
    p = tmp_path / "truncated.gguf"
    with open(smollm_path, "rb") as src:
        p.write_bytes(src.read(3_000_000))  # header and part of the tensor data
    with pytest.raises(ModelLoadError) as ei:
        Model(p)
    assert str(p) in str(ei.value)
    # the process is still healthy: a good model loads afterwards
    m = Model(smollm_path, vocab_only=True)
    assert m.n_vocab == 49152
    m.close()


def test_out_of_range_token_and_position_raise_before_c(smollm):
    ctx = Context(smollm, n_ctx=64, n_batch=16)
    with pytest.raises(ValueError, match="out of range"):
        ctx.decode([smollm.n_vocab])
    with pytest.raises(ValueError, match="outside the context"):
        ctx.decode([1], [ctx.n_ctx])
    with pytest.raises(ValueError, match="exceeds n_batch"):
        ctx.decode([1] * 17)
    ctx.close()


# -- model facts -----------------------------------------------------------------------------------
def test_model_metadata_and_tokens(smollm, qwen05):
    assert smollm.n_vocab == 49152
    assert qwen05.n_vocab == 151936
    assert qwen05.metadata()["general.architecture"] == "qwen2"
    assert "im_start" in (qwen05.chat_template or "")
    assert smollm.n_layer_nextn == 0
    toks = qwen05.tokenize("Hello, world!", add_special=False)
    assert qwen05.detokenize(toks) == "Hello, world!"
    assert b"".join(qwen05.token_to_piece(t) for t in toks) == b"Hello, world!"
    assert qwen05.is_eog(qwen05.token_eos)


def test_logits_view_is_zero_copy(smollm):
    ctx = Context(smollm, n_ctx=128, n_batch=32)
    toks = smollm.tokenize(PROMPTS[0])
    logits = ctx.decode(toks, outputs="all")
    assert logits.shape == (len(toks), smollm.n_vocab)
    assert logits.ctypes.data == ctx.logits_address()  # same memory as llama.cpp's buffer
    assert not logits.flags.owndata
    ctx.close()


def test_state_save_restore_gives_same_logits(smollm):
    ctx = Context(smollm, n_ctx=128, n_batch=32)
    toks = smollm.tokenize(PROMPTS[0])
    ctx.prefill(toks)
    state = ctx.save_state()
    a = ctx.decode([42]).copy()
    ctx.load_state(state)
    b = ctx.decode([42], [len(toks)]).copy()
    np.testing.assert_array_equal(a, b)
    ctx.close()


def test_seq_rm_then_redecode_is_identical(smollm):
    ctx = Context(smollm, n_ctx=128, n_batch=32)
    toks = smollm.tokenize(PROMPTS[1])
    ctx.prefill(toks)
    tail = [100, 200, 300]
    first = ctx.decode(tail, outputs="all").copy()
    ctx.rollback(0, len(toks))
    assert ctx.pos_max() == len(toks) - 1
    again = ctx.decode(tail, outputs="all").copy()
    np.testing.assert_array_equal(first, again)
    ctx.close()


def test_context_full_raises_decode_error_or_value_error(smollm):
    ctx = Context(smollm, n_ctx=16, n_batch=16)  # llama.cpp may round n_ctx up
    ctx.prefill(list(range(1, ctx.n_ctx - 1)))
    with pytest.raises((ValueError, DecodeError)):
        ctx.decode([5, 6, 7])
    ctx.close()


# -- cross-checks against llama.cpp's own tools ---------------------------------------------------
def _native_greedy(native_bin, model_path, prompt: str, n: int) -> str:
    r = run_native(native_bin, "llama-completion", [
        "-m", str(model_path), "-p", prompt, "-n", str(n), "--temp", "0", "-no-cnv", "--no-warmup",
        "-c", "512", "-t", str(THREADS), "--ignore-eos", "--no-display-prompt", "--simple-io", "-nr"])
    assert r.returncode == 0, r.stderr[-2000:]
    return r.stdout


@pytest.mark.parametrize("which", ["smollm", "qwen05"])
def test_greedy_64_tokens_match_llama_completion(which, request, native_bin):
    model = request.getfixturevalue(which)
    gen = SpeculativeGenerator(model, None, n_ctx=512)
    for prompt in PROMPTS:
        ours = gen.generate(prompt, sampling=SamplerParams(temp=0.0), n_predict=64, ignore_eos=True)
        native = _native_greedy(native_bin, model.path, prompt, 64)
        assert len(ours.tokens) == 64
        # 64 greedy tokens spell the same text as llama.cpp's own greedy run
        assert native.strip() == ours.text.strip(), f"\nnative: {native!r}\nours:   {ours.text!r}"
    gen.close()


PPL_TEXT_SEED = 1234


def _ppl_text() -> str:
    # A fixed, deterministic English-like text (no file in the repo needed): enough tokens for
    # 4 chunks of 512.
    words = ("the model reads a long text and predicts every next token while the context grows "
             "speculative decoding keeps the distribution exact because rejected drafts are "
             "replaced by draws from the residual of the target and the draft").split()
    rng = np.random.default_rng(PPL_TEXT_SEED)
    sents = []
    for _ in range(260):
        n = int(rng.integers(6, 14))
        s = " ".join(words[int(i)] for i in rng.integers(0, len(words), n))
        sents.append(s.capitalize() + ".")
    return " ".join(sents)


def test_perplexity_matches_llama_perplexity(smollm, native_bin, tmp_path):
    from llama_spec.generation.evaluation import perplexity

    text = _ppl_text()
    f = tmp_path / "ppl.txt"
    f.write_text(text)
    ours = perplexity(smollm, text, n_ctx=512, n_chunks=4)
    r = run_native(native_bin, "llama-perplexity", ["-m", str(smollm.path), "-f", str(f), "-c", "512", "-b", "512",
                                                    "--chunks", "4", "-t", str(THREADS), "-nr"])
    assert r.returncode == 0, r.stderr[-2000:]
    m = re.search(r"Final estimate: PPL = ([0-9.]+)", r.stdout + r.stderr)
    assert m, (r.stdout + r.stderr)[-2000:]
    assert f"{ours.ppl:.4f}" == m.group(1)
