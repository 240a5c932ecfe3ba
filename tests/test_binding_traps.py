"""The binding's traps (issue 23): Ctrl-C in the batched and tree decodes, an abort path for a
context of any thread, per-call piece buffers, no work at import, one lifetime mechanism for
every native object, no network I/O in finalizers."""

from __future__ import annotations

import gc
import json
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from conftest import THREADS

from llama_spec import Context, Model, SamplerParams
from llama_spec.errors import DecodeError

PKG = Path(__file__).resolve().parent.parent / "llama_spec"


# -- Ctrl-C during the batched and tree decodes ----------------------------------------------------
# Each child prints READY just before its long decode, the parent sends SIGINT `delay` seconds
# later, and the child reports when it caught what, and whether the next work was right.
_CHILD_DECODE = r"""
import json, sys, threading, time
import numpy as np
from llama_spec import Context, Model
from llama_spec.errors import DecodeError
path, mode = sys.argv[1], sys.argv[2]
m = Model(path, repack=False)
N_SEQ, N_TOK = 4, 1000
kw = dict(n_ctx=N_SEQ * 1024, n_batch=N_SEQ * N_TOK, n_ubatch=512, n_seq_max=N_SEQ, n_threads=2,
          kv_unified=(mode == "tree"))
box = {}
# built on a worker thread: its abort path must work on the main thread's decodes too
t = threading.Thread(target=lambda: box.setdefault("ctx", Context(m, **kw)))
t.start(); t.join()
ctx = box["ctx"]
toks = np.asarray(m.tokenize("The history of the world, " * 400)[:N_TOK], dtype=np.int32)
tokens = np.tile(toks, N_SEQ)
pos = np.tile(np.arange(N_TOK, dtype=np.int32), N_SEQ)
seqs = np.repeat(np.arange(N_SEQ, dtype=np.int32), N_TOK)
out = np.zeros(len(tokens), dtype=bool); out[N_TOK - 1::N_TOK] = True

def long_decode(c):
    if mode == "multi":
        return c.decode_multi(tokens, pos, seqs, out)
    # a tree: the first half of every row set shared by two sequences
    sets = [[int(s)] if p >= N_TOK // 2 else [int(s) - int(s) % 2, int(s) - int(s) % 2 + 1]
            for s, p in zip(seqs, pos)]
    keep = (seqs % 2 == 0) | (pos >= N_TOK // 2)
    return c.decode_seq_sets(tokens[keep], pos[keep], [s for s, k in zip(sets, keep) if k], out[keep])

def continuation(c):
    # greedy, 2 sequences at once through decode_multi (no clear(): the stopped batch must have
    # left nothing behind), then one plain decode
    prompts = [m.tokenize("The capital of France is"), m.tokenize("def add(a, b):")]
    lg = c.decode_multi(np.concatenate(prompts), np.concatenate([np.arange(len(p)) for p in prompts]),
                        np.concatenate([np.full(len(p), s) for s, p in enumerate(prompts)]),
                        np.concatenate([np.arange(len(p)) == len(p) - 1 for p in prompts]))
    nxt = [int(np.argmax(r)) for r in lg]
    got = [[t] for t in nxt]
    for step in range(5):
        lg = c.decode_multi(nxt, [len(p) + step for p in prompts], [0, 1], "all")
        nxt = [int(np.argmax(r)) for r in lg]
        for o, t in zip(got, nxt):
            o.append(t)
    got.append([int(np.argmax(c.decode([nxt[0]], seq_id=0)[-1]))])
    return got

print("READY", flush=True)
res = {"t_caught": None, "error": None}
try:
    long_decode(ctx)
    res["finished"] = True
except KeyboardInterrupt:
    res["t_caught"] = time.time()
except BaseException as e:
    res["error"] = f"{type(e).__name__}: {e}"
res["pos_max_after"] = [ctx.pos_max(s) for s in range(N_SEQ)]
try:
    res["after"] = continuation(ctx)
except BaseException as e:  # e.g. a KeyboardInterrupt parked by the stopped decode
    res["after_error"] = f"{type(e).__name__}: {e}"
fresh = Context(m, **kw)
res["fresh"] = continuation(fresh)
print("RESULT " + json.dumps(res), flush=True)
"""

_CHILD_BATCH = r"""
import json, sys, time
from llama_spec import BatchGenerator, GenerationRequest, Model, SamplerParams
path = sys.argv[1]
m = Model(path, repack=False)
sp = SamplerParams(temp=0)
kw = dict(n_parallel=2, n_ctx=6400, n_batch=512, n_threads=2)
gen = BatchGenerator(m, None, **kw)
long_prompt = list(m.tokenize("The history of the world, " * 1200))[:6000]
short = [GenerationRequest("The capital of France is", sampling=sp, n_predict=8),
         GenerationRequest("def fibonacci(n):", sampling=sp, n_predict=8)]
print("READY", flush=True)
res = {"t_caught": None, "error": None}
try:
    gen.generate_batch([GenerationRequest(long_prompt, sampling=sp, n_predict=64, ignore_eos=True), short[0]])
    res["finished"] = True
except KeyboardInterrupt:
    res["t_caught"] = time.time()
except BaseException as e:
    res["error"] = f"{type(e).__name__}: {e}"
try:
    res["after"] = [r.tokens for r in gen.generate_batch(short)]
except BaseException as e:
    res["after_error"] = f"{type(e).__name__}: {e}"
res["fresh"] = [r.tokens for r in BatchGenerator(m, None, **kw).generate_batch(short)]
print("RESULT " + json.dumps(res), flush=True)
"""


def _default_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)  # a child of a process ignoring SIGINT would inherit it


def _interrupted_child(code: str, *args: str, delay: float = 0.5, timeout: float = 600) -> dict:
    p = subprocess.Popen([sys.executable, "-c", code, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True, preexec_fn=_default_sigint)
    assert p.stdout is not None
    try:
        for line in p.stdout:
            if line.startswith("READY"):
                break
        time.sleep(delay)
        t_sent = time.time()
        p.send_signal(signal.SIGINT)
        res: dict = {}
        for line in p.stdout:
            if line.startswith("RESULT "):
                res = json.loads(line[7:])
        p.wait(timeout=timeout)
    finally:
        if p.poll() is None:
            p.kill()
    assert p.stderr is not None
    res["rc"] = p.returncode
    res["latency_s"] = None if res.get("t_caught") is None else res["t_caught"] - t_sent
    res["stderr_tail"] = p.stderr.read()[-2000:]
    return res


@pytest.mark.parametrize("mode", ["multi", "tree"])
def test_sigint_during_a_batched_or_tree_decode_raises_keyboardinterrupt(smollm_path, mode):
    # 4 sequences x 1000 tokens in ONE decode_multi / decode_seq_sets call (8 ubatches: seconds
    # on 2 threads), SIGINT after 0.5 s
    r = _interrupted_child(_CHILD_DECODE, str(smollm_path), mode)
    assert r["rc"] == 0 and not r.get("finished"), r
    assert r["error"] is None, r                       # not DecodeError(2)
    assert r["latency_s"] is not None and r["latency_s"] < 1.0, r
    assert r["pos_max_after"] == [-1] * 4, r            # no cell of the stopped batch is left
    assert "after_error" not in r, r                   # nothing parked for a later decode
    assert r["after"] == r["fresh"], r                 # the context then decodes as a fresh one


def test_sigint_during_a_batch_generator_run_and_the_next_request(smollm_path):
    r = _interrupted_child(_CHILD_BATCH, str(smollm_path))
    assert r["rc"] == 0 and not r.get("finished"), r
    assert r["error"] is None, r
    assert r["latency_s"] is not None and r["latency_s"] < 1.0, r
    assert "after_error" not in r, r
    assert r["after"] == r["fresh"], r                 # the same generator, then a correct request


# -- an abort path for contexts of any thread -------------------------------------------------------
def _long_batch(model: Model, n: int) -> np.ndarray:
    return np.asarray(model.tokenize("Once upon a time, in a land far away, " * (n // 8 + 1))[:n], dtype=np.int32)


def _abort_from_here(ctx_box: dict, timeout: float = 60.0) -> float:
    """Call ctx.abort() until a decode is running (then it returns True); the time it did."""
    deadline = time.monotonic() + timeout
    while "ctx" not in ctx_box or not ctx_box["ctx"].abort():
        if time.monotonic() > deadline or "done" in ctx_box:
            raise AssertionError(f"no decode to abort: {ctx_box}")
        time.sleep(0.005)
    return time.monotonic()


@pytest.mark.parametrize("built_on", ["worker", "main"])
def test_a_decode_on_a_worker_thread_can_be_aborted_from_another(smollm, built_on):
    toks = _long_batch(smollm, 3000)
    kw = dict(n_ctx=4096, n_batch=3072, n_ubatch=256, n_threads=THREADS)
    box: dict = {}
    if built_on == "main":
        box["ctx"] = Context(smollm, **kw)

    def work() -> None:
        try:
            ctx = box.get("ctx") or box.setdefault("ctx", Context(smollm, **kw))
            try:
                ctx.decode(toks, outputs="last")
            except DecodeError as e:
                box["err"], box["t_err"] = e, time.monotonic()
            box["pos_max"] = ctx.pos_max(0)
            box["after"] = ctx.decode(toks[:16], outputs="all").copy()   # usable, as a fresh context
        except BaseException as e:  # noqa: BLE001 - reported below
            box["unexpected"] = e
        finally:
            box["done"] = True

    th = threading.Thread(target=work)
    th.start()
    try:
        t_abort = _abort_from_here(box)
    finally:
        th.join(120)   # never leave a decode running past the test (the model is shared)
    assert not th.is_alive()
    assert "unexpected" not in box, box
    err = box.get("err")
    assert isinstance(err, DecodeError) and err.code == 2 and "abort" in str(err), box
    assert box["t_err"] - t_abort < 1.0   # within a graph node, not at the end of the prompt
    assert box["pos_max"] == -1           # the stopped batch left no cell
    fresh = Context(smollm, **kw)
    np.testing.assert_array_equal(box["after"], fresh.decode(toks[:16], outputs="all"))
    assert not box["ctx"].abort()         # idle: nothing to stop, nothing parked for later
    box["ctx"].decode(toks[16:32])
    fresh.close()
    box["ctx"].close()


def test_abort_decodes_stops_every_running_decode(smollm):
    from llama_spec.llama.context import abort_decodes

    toks = _long_batch(smollm, 2000)
    assert abort_decodes() == 0
    ctxs = [Context(smollm, n_ctx=2048, n_batch=2048, n_ubatch=256, n_threads=1) for _ in range(2)]
    errs: list[BaseException | None] = [None, None]

    def work(i: int) -> None:
        try:
            ctxs[i].decode(toks)
        except DecodeError as e:
            errs[i] = e

    ths = [threading.Thread(target=work, args=(i,)) for i in range(2)]
    for t in ths:
        t.start()
    deadline = time.monotonic() + 60
    stopped = 0
    while stopped < 2 and time.monotonic() < deadline and any(t.is_alive() for t in ths):
        stopped += abort_decodes()
        time.sleep(0.005)
    for t in ths:
        t.join(120)
    assert all(isinstance(e, DecodeError) and e.code == 2 for e in errs), errs
    assert [c.pos_max(0) for c in ctxs] == [-1, -1]
    for c in ctxs:
        c.close()


# -- per-call piece buffers: one Model shared by threads -------------------------------------------
_TEXTS = [f"Thread {i}: " + t for i, t in enumerate([
    "The quick brown fox jumps over the lazy dog.", "def fibonacci(n):\n    return n if n < 2 else n",
    "Ünïcödé, 日本語のテキスト, emoji 🎉 and more", "SELECT * FROM users WHERE id = 42;",
    "Lorem ipsum dolor sit amet, consectetur adipiscing elit.", "{'a': [1, 2, 3], 'b': None}",
    "    indented\n\ttabs\r\nand newlines", "1234567890 + 0.5e-3 = ?"])]


def test_threads_sharing_a_model_get_the_single_thread_results(smollm_path):
    ref_model = Model(smollm_path, vocab_only=True)
    ref = [(toks := ref_model.tokenize(t), ref_model.detokenize(toks)) for t in _TEXTS]
    ids = list(range(ref_model.n_vocab))
    ref_pieces = [ref_model.token_to_piece(i) for i in ids]
    ref_model.close()

    shared = Model(smollm_path, vocab_only=True)   # a cold piece cache: every thread reaches C
    errors: list[str] = []
    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)   # switch threads as often as possible
    barrier = threading.Barrier(8)

    def work(i: int) -> None:
        barrier.wait()
        order = ids[i * 6000:] + ids[: i * 6000]   # each thread starts at another id
        for t in order:
            if shared.token_to_piece(t) != ref_pieces[t]:
                errors.append(f"thread {i}: piece of {t}")
                return
        for _ in range(500):
            toks = shared.tokenize(_TEXTS[i])
            if toks != ref[i][0] or shared.detokenize(toks) != ref[i][1]:
                errors.append(f"thread {i}: text {_TEXTS[i]!r}")
                return

    try:
        ths = [threading.Thread(target=work, args=(i,)) for i in range(8)]
        for t in ths:
            t.start()
        for t in ths:
            t.join()
    finally:
        sys.setswitchinterval(old)
    assert errors == []
    assert [shared.token_to_piece(i) for i in ids] == ref_pieces   # nothing wrong was cached
    shared.close()


# -- no work at import -----------------------------------------------------------------------------
def test_import_only_loads_the_library_backend_init_on_first_model(smollm_path):
    code = (
        "import sys, llama_spec._ffi as f\n"
        "assert not f.backend_initialized(), 'after import llama_spec._ffi'\n"
        "import llama_spec, llama_spec.llama.context, llama_spec.llama.sampling, llama_spec.llama.devices\n"
        "assert not f.backend_initialized(), 'after import llama_spec'\n"
        "m = llama_spec.Model(sys.argv[1], vocab_only=True)\n"
        "assert f.backend_initialized(), 'after Model()'\n"
        "print('OK')\n")
    r = subprocess.run([sys.executable, "-c", code, str(smollm_path)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and r.stdout.strip() == "OK", r.stderr[-2000:]
    code = ("import llama_spec._ffi as f, llama_spec\n"
            "llama_spec.devices(memory=False)\n"
            "assert f.backend_initialized()\nprint('OK')\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and r.stdout.strip() == "OK", r.stderr[-2000:]


# -- one lifetime mechanism for every native object -------------------------------------------------
def test_ffi_gc_only_in_the_handle_module():
    """Every native object is freed through NativeHandle (close / context manager / finalizer)."""
    offenders = sorted(str(p.relative_to(PKG)) for p in PKG.rglob("*.py")
                       if p.name != "_handle.py" and re.search(r"\bffi\.gc\(", p.read_text()))
    assert not offenders, offenders


def _grammar_sampler(model: Model):
    from llama_spec.llama.sampling import TargetSampler

    return TargetSampler(model, SamplerParams(temp=0.8, grammar='root ::= "yes" | "no"', seed=1))


def test_sampler_grammar_budget_close_twice_and_use_after_close(smollm):
    from llama_spec.llama.sampling import ReasoningBudget, SamplerChain

    row = np.zeros(smollm.n_vocab, dtype=np.float32)
    ts = _grammar_sampler(smollm)
    g = ts.grammar_clone()
    assert g is not None
    clone = ts.clone()
    ts.candidates(row)
    ts.close()
    ts.close()   # twice: a no-op
    assert ts.closed
    for call in (lambda: ts.candidates(row), lambda: ts.sample(row), lambda: ts.accept(1), ts.reset, ts.clone,
                 ts.grammar_clone, lambda: ts.candidates_and_sample(row)):
        with pytest.raises(ValueError, match="TargetSampler is closed"):
            call()
    clone.candidates(row)   # a clone owns its own chain and grammar
    g.allowed(np.array([1, 2], dtype=np.int32))
    clone.close()
    g.close()
    g.close()
    with pytest.raises(ValueError, match="GrammarState is closed"):
        g.allowed(np.array([1], dtype=np.int32))
    with pytest.raises(ValueError, match="GrammarState is closed"):
        g.clone()

    toks = smollm.tokenize(" think", add_special=False)
    rb = ReasoningBudget(smollm, start=[toks], end=[toks], forced=toks, budget=2)
    rb2 = rb.clone()
    with rb:
        assert rb.state == "idle"
    rb.close()
    with pytest.raises(ValueError, match="ReasoningBudget is closed"):
        _ = rb.state
    assert rb2.state == "idle"   # the clone is its own object
    rb2.close()

    with SamplerChain(SamplerParams(), smollm, with_dist=False) as ch:
        assert ch.ptr is not None
    with pytest.raises(ValueError, match="SamplerChain is closed"):
        _ = ch.ptr


def test_unclosed_samplers_are_freed_by_their_finalizer(smollm):
    import weakref

    ts = _grammar_sampler(smollm)
    refs = [weakref.ref(ts), weakref.ref(ts._grammar_state)]
    del ts
    gc.collect()
    assert all(r() is None for r in refs)


# -- no network I/O in finalizers ------------------------------------------------------------------
def test_rpc_handle_finalizer_does_no_socket_call(monkeypatch):
    from llama_spec._handle import NativeHandle, endpoints

    ep = "127.0.0.1:1"   # nothing listens there: a probe would be a (refused) connection
    freed: list[object] = []
    socket_calls: list[str] = []

    class _OnRpc(NativeHandle):
        _kind = "test handle"

        def __init__(self) -> None:
            self._adopt(object(), [ep])

        def _free(self, ptr: object) -> None:
            freed.append(ptr)

    def no_socket(*a: object, **k: object) -> None:
        socket_calls.append(repr(a))
        raise AssertionError("network I/O in a finalizer")

    h = _OnRpc()
    ptr = h._ptr
    queued = [x for x in getattr(endpoints, "_deferred", [])]
    monkeypatch.setattr(socket, "socket", no_socket)
    monkeypatch.setattr(socket, "create_connection", no_socket)
    del h
    gc.collect()
    assert socket_calls == []                   # the finalizer asked no server ...
    assert freed == []                          # ... so it did not free ...
    assert endpoints.deferred() == len(queued) + 1  # ... but queued the handle
    monkeypatch.undo()
    # the next safe point frees it (the free check, i.e. the probe, stubbed: no server here)
    monkeypatch.setattr(endpoints, "_free_check", lambda eps: True)
    from llama_spec import rpc

    assert rpc.free_deferred() >= 1
    assert freed == [ptr] and endpoints.deferred() == 0
    endpoints._eps.pop(ep, None)
