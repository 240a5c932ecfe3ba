"""The OpenAI-compatible server, driven by the official `openai` client over loopback.

A real uvicorn server runs in a background thread on 127.0.0.1 (a socket bound to port 0),
with smollm2-135m as target and as its own draft model (repack off, so every sequence at
temperature 0 equals its solo run). Everything is bounded: clients have timeouts, loops have
caps, servers stop at the end of the module.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

pytest.importorskip("starlette")
pytest.importorskip("uvicorn")
openai = pytest.importorskip("openai")
httpx = pytest.importorskip("httpx")

from conftest import same_or_near_tie  # noqa: E402

API_KEY = "test-key-123"
N_CTX = 384
THREADS = 1  # on an oversubscribed 2-core machine one thread per context is faster
NEAR_TIE = 1.5  # logits: concurrent requests verify in other widths than a solo run, and with flash
                # attention on (the default) such decodes differ by up to 1.3 (scripts/batch_shape_rounding.py)


class _Server:
    """uvicorn + ServerEngine in a background thread; stop() ends both."""

    def __init__(self, model, *, n_parallel: int = 2, max_queue: int = 16, api_key: str | None = None,
                 engine=None, mode: str = "draft-simple") -> None:
        """engine: a ServerEngine not yet started (e.g. from the CLI's build_engine); None: one over a
        BatchGenerator of `n_parallel` slots with smollm as its own draft model."""
        import uvicorn

        from llama_spec.drafters.draft_model import DraftModelDrafter
        from llama_spec.generation.batch import BatchGenerator
        from llama_spec.server import ServerConfig, ServerEngine, create_app

        def make_batch():
            return BatchGenerator(model, lambda: DraftModelDrafter(model, n_ctx=N_CTX, n_threads=THREADS),
                                  n_parallel=n_parallel, n_ctx=N_CTX, n_threads=THREADS, n_max=3)

        self.model = model
        self.engine = engine if engine is not None else ServerEngine(make_batch, max_queue=max_queue)
        self.engine.start()
        app = create_app(self.engine, model, ServerConfig(model_name="smollm", api_key=api_key,
                                                          speculative_mode=mode))
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.bind(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        cfg = uvicorn.Config(app, lifespan="off", log_level="warning", timeout_graceful_shutdown=2)
        self.uv = uvicorn.Server(cfg)
        self.thread = threading.Thread(target=self.uv.run, kwargs={"sockets": [self.sock]}, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 20
        while not self.uv.started:
            assert time.monotonic() < deadline and self.thread.is_alive(), "server did not start"
            time.sleep(0.02)

    def client(self, key: str | None = API_KEY, timeout: float = 60.0):
        return openai.OpenAI(base_url=self.url + "/v1", api_key=key or "none", max_retries=0, timeout=timeout)

    def health(self) -> dict:
        r = httpx.get(self.url + "/health", timeout=5)
        assert r.status_code == 200
        return r.json()

    def wait_idle(self, timeout: float = 10.0) -> float:
        """Seconds until no request holds a slot or queue place (fails after `timeout`)."""
        t0 = time.monotonic()
        while self.health()["busy"]:
            assert time.monotonic() - t0 < timeout, f"still busy after {timeout} s: {self.health()}"
            time.sleep(0.02)
        return time.monotonic() - t0

    def stop(self) -> None:
        self.uv.should_exit = True
        self.thread.join(15)
        self.engine.stop()
        self.sock.close()
        assert not self.thread.is_alive()


def _until(pred, timeout: float) -> None:
    """Poll `pred` until it is true (bounded; the assertions after it say what was expected)."""
    t0 = time.monotonic()
    while not pred() and time.monotonic() - t0 < timeout:
        time.sleep(0.02)


@pytest.fixture(scope="module")
def server(smollm):
    s = _Server(smollm, n_parallel=2, max_queue=16, api_key=API_KEY)
    yield s
    s.stop()


@pytest.fixture(scope="module")
def solo(smollm):
    """The reference: the same target/drafter pair run alone through SpeculativeGenerator."""
    from llama_spec import SamplerParams, SpeculativeGenerator
    from llama_spec.drafters.draft_model import DraftModelDrafter

    gen = SpeculativeGenerator(smollm, DraftModelDrafter(smollm, n_ctx=N_CTX, n_threads=THREADS),
                               n_ctx=N_CTX, n_threads=THREADS, n_max=3)

    def run(prompt, n: int, **kw):
        return gen.generate(prompt, sampling=SamplerParams(temp=0.0), n_predict=n, **kw)

    yield run
    gen.close()


def _chat_tokens(model, messages):
    from llama_spec.chat_api import prepare_prompt

    return prepare_prompt(model, messages).tokens


MSGS = [{"role": "user", "content": "Name three colours."}]


def test_chat_non_streaming_equals_solo(server, solo, smollm):
    r = server.client().chat.completions.create(model="smollm", messages=MSGS, max_tokens=20, temperature=0)
    ref = solo(_chat_tokens(smollm, MSGS), 20)
    assert r.object == "chat.completion"
    assert r.choices[0].message.role == "assistant"
    assert r.choices[0].message.content == ref.text and ref.text.strip()
    assert r.usage.completion_tokens == len(ref.tokens)
    assert r.usage.prompt_tokens == len(ref.prompt_tokens)
    assert r.choices[0].finish_reason == ("length" if ref.stop_reason == "length" else "stop")
    spec = r.model_extra["speculative"]
    assert spec["rule"] == "token" and spec["drafted"] > 0 and 0 < spec["accepted"] <= spec["drafted"]


def test_chat_streaming_equals_non_streaming(server):
    c = server.client()
    kw = dict(model="smollm", messages=MSGS, max_tokens=24, temperature=0.8, seed=1234)
    full = c.chat.completions.create(**kw)
    parts, finish, spec = [], None, None
    with c.chat.completions.create(stream=True, stream_options={"include_usage": True}, **kw) as stream:
        for ch in stream:
            if ch.choices:
                parts.append(ch.choices[0].delta.content or "")
                finish = ch.choices[0].finish_reason or finish
                spec = (ch.model_extra or {}).get("speculative") or spec
            else:
                usage = ch.usage
    assert "".join(parts) == full.choices[0].message.content
    assert finish == full.choices[0].finish_reason
    assert usage.completion_tokens == full.usage.completion_tokens
    assert spec is not None and spec["drafted"] > 0


def test_completions_and_stop_string(server, solo):
    c = server.client()
    prompt = "The three primary colours are"
    ref = solo(prompt, 24)
    r = c.completions.create(model="smollm", prompt=prompt, max_tokens=24, temperature=0)
    assert r.choices[0].text == ref.text
    # a stop string from the middle of the reference: the answer ends just before it
    words = [w for w in ref.text.split() if len(w) >= 3]
    assert len(words) >= 2, ref.text
    stop = words[len(words) // 2]
    cut = ref.text[: ref.text.find(stop)]
    r = c.completions.create(model="smollm", prompt=prompt, max_tokens=24, temperature=0, stop=[stop])
    assert r.choices[0].text == cut and r.choices[0].finish_reason == "stop"
    streamed = "".join(ch.choices[0].text for ch in c.completions.create(
        model="smollm", prompt=prompt, max_tokens=24, temperature=0, stop=stop, stream=True) if ch.choices)
    assert streamed == cut  # no piece of the stop string leaks into the stream


def test_bad_requests_are_400_naming_the_field(server):
    c = server.client()
    with pytest.raises(openai.BadRequestError) as e:
        c.chat.completions.create(model="smollm", messages=MSGS, temperature="hot")
    assert e.value.param == "temperature" and "temperature" in e.value.message
    with pytest.raises(openai.BadRequestError) as e:
        c.completions.create(model="smollm", prompt="hi", n=2)
    assert e.value.param == "n"
    with pytest.raises(openai.BadRequestError) as e:
        c.chat.completions.create(model="smollm", messages=[{"role": "wizard", "content": "x"}])
    assert e.value.param == "messages[0].role"
    with pytest.raises(openai.BadRequestError) as e:
        c.completions.create(model="smollm", prompt="word " * 1200, max_tokens=4)
    assert e.value.code == "context_length_exceeded" and e.value.param == "prompt"
    r = httpx.post(server.url + "/v1/chat/completions", content=b"{not json",
                   headers={"Authorization": f"Bearer {API_KEY}", "Content-Type": "application/json"}, timeout=10)
    assert r.status_code == 400 and set(r.json()["error"]) == {"message", "type", "param", "code"}
    assert "JSON" in r.json()["error"]["message"]
    # the server is unharmed
    assert c.completions.create(model="smollm", prompt="Hi", max_tokens=2, temperature=0).choices[0].text


def test_prompt_too_long_names_both_numbers(server, smollm):
    prompt = "word " * 1200
    n = len(smollm.tokenize(prompt))
    n_ctx = server.engine.n_ctx_per_seq  # llama.cpp may round the context up (N_CTX=384 -> 512)
    assert n >= n_ctx >= N_CTX
    r = httpx.post(server.url + "/v1/completions", json={"prompt": prompt, "max_tokens": 4},
                   headers={"Authorization": f"Bearer {API_KEY}"}, timeout=10)
    err = r.json()["error"]
    assert r.status_code == 400 and err["param"] == "prompt"
    assert str(n) in err["message"] and str(n_ctx) in err["message"]


def test_bad_request_inside_the_worker_disturbs_no_one(server, solo):
    """A grammar llama.cpp cannot parse fails when its sequence starts (in the worker): 400 for it,
    the stream running next to it completes unchanged."""
    prompt = "Here are some facts about rivers:"
    ref = solo(prompt, 16, ignore_eos=True)
    c = server.client()

    def good() -> str:
        s = c.completions.create(model="smollm", prompt=prompt, max_tokens=16, temperature=0, stream=True,
                                 extra_body={"ignore_eos": True})
        return "".join(ch.choices[0].text for ch in s if ch.choices)

    with ThreadPoolExecutor(1) as ex:
        fut = ex.submit(good)
        with pytest.raises(openai.BadRequestError) as e:
            c.completions.create(model="smollm", prompt="Hi", max_tokens=4, extra_body={"grammar": "root ::= ("})
        assert "grammar" in e.value.message
        assert same_or_near_tie(server.model, ref, fut.result(timeout=120), NEAR_TIE)


def test_api_key(server):
    for path in ("/v1/models", "/v1/chat/completions"):
        r = httpx.request("GET" if "models" in path else "POST", server.url + path, json={}, timeout=10)
        assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
    r = httpx.get(server.url + "/v1/models", headers={"Authorization": "Bearer wrong"}, timeout=10)
    assert r.status_code == 401
    with pytest.raises(openai.AuthenticationError):
        server.client(key="wrong").models.list()
    assert [m.id for m in server.client().models.list()] == ["smollm"]
    assert server.health()["status"] == "ok"  # /health needs no key
    r = httpx.get(server.url + "/v1/nothing", timeout=10)
    assert r.status_code == 404 and r.json()["error"]["code"] == "not_found"


def _stream_some(url: str, n_chunks: int, max_tokens: int, *, key: str = API_KEY) -> int:
    """Open a streaming completion, read `n_chunks` SSE events, then drop the connection."""
    got = 0
    with httpx.stream("POST", url + "/v1/completions", timeout=30, headers={"Authorization": f"Bearer {key}"},
                      json={"prompt": "Once upon a time", "max_tokens": max_tokens, "stream": True,
                            "temperature": 0.8, "ignore_eos": True}) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if line.startswith("data: "):
                got += 1
                if got >= n_chunks:
                    break
    return got


def test_full_queue_503_and_disconnect_frees_the_slot(smollm):
    s = _Server(smollm, n_parallel=1, max_queue=0)
    try:
        c = s.client()
        done = threading.Event()
        holder = {}

        def hold():  # occupies the only slot until told to go away
            with httpx.stream("POST", s.url + "/v1/completions", timeout=30,
                              json={"prompt": "Once upon a time", "max_tokens": 2000, "stream": True,
                                    "ignore_eos": True}) as r:
                for line in r.iter_lines():
                    if line.startswith("data: "):
                        holder["started"] = True
                        if done.is_set():
                            break

        t = threading.Thread(target=hold, daemon=True)
        t.start()
        deadline = time.monotonic() + 20
        while "started" not in holder:
            assert time.monotonic() < deadline
            time.sleep(0.02)
        with pytest.raises(openai.InternalServerError) as e:
            c.completions.create(model="smollm", prompt="Hi", max_tokens=2)
        assert e.value.status_code == 503 and e.value.code == "queue_full"
        done.set()  # the streaming client disconnects mid-stream
        t.join(10)
        s.wait_idle(timeout=10.0)
        _until(lambda: s.engine.cancelled, 10.0)  # the worker counts it after its current step
        # dropped from its slot (cancelled), not run until its slot's context is full (served)
        assert (s.engine.cancelled, s.engine.served, s.engine.failed) == (1, 0, 0)
        r = c.completions.create(model="smollm", prompt="Hi", max_tokens=3, temperature=0)
        assert r.usage.completion_tokens >= 1
    finally:
        s.stop()


def test_load_eight_clients_three_disconnect(server, solo):
    topics = ["rivers", "bread", "the moon", "trains", "owls", "glass", "chess", "tea"]
    prompts = [f"Here are some facts about {t}:" for t in topics]
    n_tok = 16
    refs = [solo(p, n_tok, ignore_eos=True) for p in prompts]
    drop = {1, 4, 6}
    failed0, cancelled0 = server.engine.failed, server.engine.cancelled

    def client(i: int):
        c = server.client(timeout=120)
        stream = c.completions.create(model="smollm", prompt=prompts[i], max_tokens=n_tok, temperature=0,
                                      stream=True, extra_body={"ignore_eos": True})
        parts = []
        for ch in stream:
            if ch.choices:
                parts.append(ch.choices[0].text)
            if i in drop and len(parts) >= 3:
                stream.close()  # disconnect mid-stream
                return None
        return "".join(parts)

    with ThreadPoolExecutor(8) as ex:
        out = list(ex.map(client, range(8)))
    for i in range(8):
        if i in drop:
            assert out[i] is None
        else:
            assert refs[i].text.strip() and same_or_near_tie(server.model, refs[i], out[i], NEAR_TIE), i
    server.wait_idle(timeout=10)
    _until(lambda: server.engine.cancelled > cancelled0, 10.0)
    assert server.engine.failed == failed0
    # a client that leaves after its last token may find its sequence already done: not a cancel
    assert 1 <= server.engine.cancelled - cancelled0 <= len(drop)
    # no slot leaked: both slots still serve
    c = server.client()
    with ThreadPoolExecutor(2) as ex:
        texts = list(ex.map(lambda p: c.completions.create(model="smollm", prompt=p, max_tokens=n_tok, temperature=0,
                                                           extra_body={"ignore_eos": True}).choices[0].text,
                            prompts[:2]))
    assert all(same_or_near_tie(server.model, r, t, NEAR_TIE) for r, t in zip(refs[:2], texts, strict=True))


def _read_until_closed(url: str, started: threading.Event) -> None:
    try:
        with httpx.stream("POST", url + "/v1/completions", timeout=30,
                          json={"prompt": "Once upon a time", "max_tokens": 200, "stream": True,
                                "ignore_eos": True}) as r:
            for line in r.iter_lines():
                if line.startswith("data: "):
                    started.set()
    except httpx.HTTPError:
        pass  # the server closed the connection at shutdown


def test_cli_serve_sigterm_stops_cleanly(smollm_path):
    with socket.socket() as sk:
        sk.bind(("127.0.0.1", 0))
        port = sk.getsockname()[1]
    cmd = [sys.executable, "-m", "llama_spec", "serve", "-m", str(smollm_path), "-nr", "-c", "256", "-np", "1",
           "-t", str(THREADS), "--port", str(port), "--timeout-graceful", "1"]
    p = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True, env=dict(os.environ))
    try:
        deadline = time.monotonic() + 60
        while True:
            assert p.poll() is None and time.monotonic() < deadline, "serve did not come up"
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.2)
        r = httpx.post(f"http://127.0.0.1:{port}/v1/completions", timeout=30,
                       json={"prompt": "Hi", "max_tokens": 2, "temperature": 0})
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] >= 1
        # SIGTERM while a long stream is open: the stream ends, the process exits 0
        streaming = threading.Event()
        t = threading.Thread(target=_read_until_closed, args=(f"http://127.0.0.1:{port}", streaming), daemon=True)
        t.start()
        assert streaming.wait(30)
        p.send_signal(signal.SIGTERM)
        _, err = p.communicate(timeout=30)
        t.join(10)
        assert not t.is_alive()
    finally:
        if p.poll() is None:
            p.kill()
            p.wait(10)
    assert p.returncode == 0, err
    assert "llama-spec serve: stopped" in err


def test_tree_and_block_requests_report_their_rule(smollm_path):
    """``llama-spec serve -md DRAFT --spec-draft-tree 2,1`` (its build_engine): a request with
    "tree": "2,1" runs the tree rule, one with "verify": "block" the block rule (a chain: the server's
    default tree is for token-rule requests), and each response's speculative statistics name it."""
    from llama_spec.cli import build_parser
    from llama_spec.cli.serve import build_engine

    ns = build_parser().parse_args(["serve", "-m", str(smollm_path), "-md", str(smollm_path), "--spec-draft-tree",
                                    "2,1", "-nr", "-c", str(N_CTX), "-np", "2", "-t", str(THREADS)])
    engine, target, closers, mode = build_engine(ns)
    s = _Server(target, engine=engine, mode=mode)
    try:
        c = s.client()
        kw = dict(model="smollm", max_tokens=24, temperature=0.8, seed=7)
        tree = c.completions.create(prompt="Here are some facts about owls:",
                                    extra_body={"tree": "2,1", "ignore_eos": True}, **kw)
        block = c.chat.completions.create(messages=MSGS, extra_body={"verify": "block", "ignore_eos": True}, **kw)
        default = c.completions.create(prompt="Here are some facts about owls:", extra_body={"ignore_eos": True}, **kw)
        with pytest.raises(openai.BadRequestError) as e:  # a tree is verified by the tree rule only
            c.completions.create(prompt="Hi", extra_body={"tree": "2,1", "verify": "block"}, **kw)
        assert "tree" in e.value.message and "block" in e.value.message
    finally:
        s.stop()
        for fn in closers:
            fn()
    for r, rule in ((tree, "tree"), (block, "block"), (default, "tree")):
        assert r.usage.completion_tokens == 24, rule
        spec = r.model_extra["speculative"]
        assert spec["rule"] == rule and spec["mode"] == "draft-simple", spec
        assert spec["drafted"] > 0 and 0 <= spec["accepted"] <= spec["drafted"] and spec["verifications"] > 0, spec
    assert tree.choices[0].text.strip() and block.choices[0].message.content.strip()
    assert tree.choices[0].text == default.choices[0].text  # "tree": "2,1" is the server's default tree
