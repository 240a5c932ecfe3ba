"""Hostile input and faults (issue 15): damaged GGUF files, fuzzed API arguments, resources,
interrupts, concurrency. Small N here; the full-N runs are scripts/fuzz_gguf.py, fuzz_api.py,
leak_check.py."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

SCRIPTS = Path(__file__).resolve().parent.parent / "scripts"


def _script(name: str):
    spec = importlib.util.spec_from_file_location(name, SCRIPTS / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


def test_gguf_mutations_load_or_raise_model_load_error():
    fz = _script("fuzz_gguf")
    r = fz.fuzz(40, seed=123, timeout=60)
    assert r["cases"] == 40
    assert r["failures"] == [], r["failures"]
    c = r["counts"]
    assert c.get("ModelLoadError", 0) >= 20 and c.get("loaded", 0) >= 2, c  # both outcomes exercised
    assert c.get("loaded (template refused)", 0) >= 1, c  # the invalid-Jinja case: TemplateError, not a crash


def test_duplicate_token_is_refused_before_llama_cpp(tmp_path):
    # llama.cpp GGML_ASSERTs (aborts) on a vocabulary with a repeated token: found by the fuzzer
    from llama_spec import Model
    from llama_spec.errors import ModelLoadError

    fz = _script("fuzz_gguf")
    good = fz.write_tiny_llama(tmp_path / "ok.gguf").read_bytes()
    bad = good.replace(b"<0x0D>", b"<0x0C>", 1)
    assert bad != good
    (tmp_path / "dup.gguf").write_bytes(bad)
    with pytest.raises(ModelLoadError, match="appears more than once"):
        Model(tmp_path / "dup.gguf")
    m = Model(tmp_path / "ok.gguf")  # the undamaged file loads
    assert m.n_vocab == 300
    m.close()


def test_public_api_fuzz_never_kills_the_process():
    # ~300 Hypothesis cases in a worker subprocess: each returns or raises ValueError/TypeError/LlamaSpecError
    fz = _script("fuzz_api")
    r = fz.fuzz(300, seed=7)
    assert r["cases"] == 300
    assert r["failures"] == [], r["failures"][:3]
    assert r["counts"].get("ok", 0) >= 10 and r["counts"].get("allowed", 0) >= 100, r["counts"]


def test_known_aborts_now_raise_naming_the_argument(smollm_path):
    from llama_spec import Model, SamplerParams, SpeculativeGenerator
    from llama_spec.context import Context

    m = Model(smollm_path)
    try:
        with pytest.raises(ValueError, match="n_threads"):  # was: std::bad_alloc, exit 134
            Context(m, n_ctx=64, n_threads=10**9)
        with pytest.raises(ValueError, match="n_ubatch"):
            Context(m, n_ctx=64, n_ubatch=0)
        with pytest.raises(ValueError, match="top_k"):
            SamplerParams(top_k=2**32)
        with pytest.raises(TypeError, match="n_max"):
            SpeculativeGenerator(m, None, n_ctx=64, n_max=float("inf"))
        gen = SpeculativeGenerator(m, None, n_ctx=64, n_threads=2)
        with pytest.raises(ValueError, match="prompt"):
            gen.generate([2**63 - 1, 5])
        with pytest.raises(ValueError, match="text"):
            gen.generate("a\ud800b")
        with pytest.raises(TypeError, match="token"):
            m.token_to_piece(float("-inf"))
        assert gen.generate("Hi", n_predict=2).tokens  # still usable after the refusals
        gen.close()
    finally:
        m.close()
