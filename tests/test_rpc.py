"""Models split across llama.cpp rpc-servers (issue 7): outputs, placement, lost servers, bad input.

Every rpc-server here is a local ``ggml-rpc-server`` on 127.0.0.1 started and stopped by the
tests (one CPU thread each). Outputs are compared with the same model on the local CPU, all
loaded with ``repack=False`` (see conftest).
"""

from __future__ import annotations

import json
import logging
import re
import socket
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from llama_spec import DraftModelDrafter, Model, SamplerParams, SpeculativeGenerator
from llama_spec import rpc as lrpc
from llama_spec.llama.devices import add_rpc_server, devices
from llama_spec.rpc import RpcConnectionError, local_rpc_server_handles, local_rpc_servers

ROOT = Path(__file__).resolve().parent.parent
GREEDY = SamplerParams(temp=0.0)
PROMPT = "Write a Python function that returns the n-th Fibonacci number.\n"
BUFFER_LINE = re.compile(r"RPC\d+\[([^\]]+)\] model buffer size =\s*([0-9.]+) MiB")

pytestmark = pytest.mark.skipif(
    not (ROOT / "llama_spec" / "_lib" / "ggml-rpc-server").exists(), reason="built without ggml-rpc-server"
)


@pytest.fixture(scope="module")
def servers():
    """Two rpc-servers on loopback for the module (nothing here kills these two)."""
    with local_rpc_server_handles(2, threads=1) as handles:
        yield handles


def _greedy(model: Model, n: int, drafter=None, n_threads: int = 1):
    # one thread: results do not depend on it, and spinning thread pools crawl on a busy machine
    gen = SpeculativeGenerator(model, drafter, n_ctx=512, n_threads=n_threads, n_max=3)
    try:
        return gen.generate(PROMPT, sampling=GREEDY, n_predict=n, ignore_eos=True)
    finally:
        gen.close()


def _closed_port() -> int:
    """A loopback port with nothing listening (connection refused)."""
    return lrpc.free_port()


# -- 1. a model split over two rpc-servers ------------------------------------------------------
@pytest.mark.parametrize("name", ["smollm", "qwen05"])
def test_split_over_two_rpc_servers_matches_single_device(servers, request, caplog, name):
    ref = _greedy(request.getfixturevalue(name), 64)
    eps = [s.endpoint for s in servers]
    with caplog.at_level(logging.INFO, logger="llama_spec.llama_cpp"):
        m = Model(request.getfixturevalue(f"{name}_path"), rpc_servers=eps, tensor_split=[1, 1], repack=False)
    try:
        # both remote devices hold the model, nothing else does (the CPU keeps only the token
        # embeddings, which llama.cpp never offloads)
        names = add_rpc_server(eps[0]) + add_rpc_server(eps[1])
        assert [d.name for d in m.devices()] == names
        assert [d.description for d in m.devices()] == eps
        sizes = {ep: float(mib) for ep, mib in BUFFER_LINE.findall(caplog.text)}
        assert set(sizes) == set(eps) and all(v > 1.0 for v in sizes.values()), sizes
        assert f"offloaded {m.n_layer + 1}/{m.n_layer + 1} layers to GPU" in caplog.text
        assert m.rpc_endpoints == tuple(eps)

        out = _greedy(m, 64)
        assert out.tokens == ref.tokens
        assert len(out.tokens) == 64
    finally:
        m.close()


def test_device_names_and_zero_weight_place_layers(servers, smollm, smollm_path, caplog):
    """devices=[...] by name (as llama.cpp's --device) and a 0 weight keep a device empty."""
    eps = [s.endpoint for s in servers]
    names = add_rpc_server(eps[0]) + add_rpc_server(eps[1])
    ref = _greedy(smollm, 16)
    with caplog.at_level(logging.INFO, logger="llama_spec.llama_cpp"):
        m = Model(smollm_path, devices=names, tensor_split=[0, 1], repack=False)
    try:
        sizes = {ep: float(mib) for ep, mib in BUFFER_LINE.findall(caplog.text)}
        assert set(sizes) == {eps[1]}, sizes  # nothing on the first server
        assert _greedy(m, 16).tokens == ref.tokens
    finally:
        m.close()


# -- 2. speculative decoding with the target split over RPC ------------------------------------
def test_speculative_target_split_over_rpc_matches_plain(servers, qwen15, qwen15_path, qwen05_path, caplog):
    eps = [s.endpoint for s in servers]
    ref = _greedy(qwen15, 48)
    target = Model(qwen15_path, rpc_servers=eps, tensor_split=[1, 1], repack=False)
    # the draft model placed on one device by name (the CLI's --spec-draft-device)
    draft_dev = add_rpc_server(eps[0])[0]
    draft = Model(qwen05_path, devices=[draft_dev], repack=False)
    try:
        assert [d.description for d in target.devices()] == eps
        assert [d.name for d in draft.devices()] == [draft_dev]
        r = _greedy(target, 48, drafter=DraftModelDrafter(draft, n_ctx=512, n_threads=1))
        assert r.tokens == ref.tokens
        assert r.stats.drafted > 0 and r.stats.accepted > 0
    finally:
        target.close()
        draft.close()


# -- 3. a server killed mid-generation ------------------------------------------------------------
_KILL_SCRIPT = textwrap.dedent("""
    import json, os, signal, sys, time
    from llama_spec import Model, SamplerParams, SpeculativeGenerator
    from llama_spec import rpc

    path, ep0, ep1, victim, mode = sys.argv[1:6]
    G = SamplerParams(temp=0.0)
    m = Model(path, rpc_servers=[ep0, ep1], tensor_split=[1, 1], repack=False)
    gen = SpeculativeGenerator(m, None, n_ctx=512, n_threads=1)

    def run():
        n = 0
        for _ in gen.stream("Once upon a time", sampling=G, n_predict=200, ignore_eos=True):
            n += 1
            if n == 8:
                os.kill(int(victim), signal.SIGKILL)
        return n

    if mode == "plain":
        print("generating", flush=True)
        try:
            run()
            print(json.dumps({"error": None}), flush=True)
        except ConnectionError as e:
            print(json.dumps({"error": str(e)}), flush=True)
        sys.exit(0)

    out = {}
    t0 = time.monotonic()
    try:
        out["n"] = rpc.call_guarded(run)
    except ConnectionError as e:
        out.update(type=type(e).__name__, error=str(e), endpoint=getattr(e, "endpoint", None))
    out["elapsed"] = time.monotonic() - t0
    out["lost"] = rpc.lost_endpoints()
    try:
        gen.generate("again", sampling=G, n_predict=2)
    except ConnectionError as e:
        out["reuse_error"] = str(e)
    gen.close()
    m.close()  # no-ops now: freeing would wait on the lost connection forever
    # the process goes on: a new model on the surviving server, and one on the local CPU
    m2 = Model(path, rpc_servers=[ep0], repack=False)
    out["survivor_devices"] = [d.description for d in m2.devices()]
    g2 = SpeculativeGenerator(m2, None, n_ctx=512, n_threads=1)
    out["survivor_tokens"] = rpc.call_guarded(g2.generate, "Once upon a time", sampling=G, n_predict=8,
                                              ignore_eos=True).tokens
    g2.close()
    m2.close()
    m3 = Model(path, repack=False)
    g3 = SpeculativeGenerator(m3, None, n_ctx=512, n_threads=1)
    out["cpu_tokens"] = g3.generate("Once upon a time", sampling=G, n_predict=8, ignore_eos=True).tokens
    g3.close()
    m3.close()
    try:
        Model(path, rpc_servers=[ep1])
    except ConnectionError as e:
        out["reload_lost_error"] = str(e)
    print(json.dumps(out), flush=True)
""")


def _run_kill_script(path: Path, mode: str, timeout: float = 240):
    with local_rpc_server_handles(2, threads=1) as (a, b):
        t0 = time.monotonic()
        proc = subprocess.run([sys.executable, "-c", _KILL_SCRIPT, str(path), a.endpoint, b.endpoint, str(b.pid), mode],
                              capture_output=True, text=True, timeout=timeout, cwd=ROOT)
        assert not b.alive()
        return proc, a.endpoint, b.endpoint, time.monotonic() - t0


def test_server_killed_mid_generation_raises_and_process_survives(smollm_path):
    """Under rpc.call_guarded: ConnectionError naming the endpoint; the process goes on."""
    proc, ep0, ep1, _ = _run_kill_script(smollm_path, "guarded")
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out.get("type") == "RpcConnectionError", out
    assert out["endpoint"] == ep1
    assert f"RPC server {ep1} was lost" in out["error"] and ep0 not in out["error"]
    assert out["elapsed"] < 60
    assert set(out["lost"]) == {ep1}
    assert ep1 in out["reuse_error"]
    assert out["survivor_devices"] == [ep0]
    assert out["survivor_tokens"] == out["cpu_tokens"] and len(out["cpu_tokens"]) == 8
    assert ep1 in out["reload_lost_error"] and "cannot use it again" in out["reload_lost_error"]


def test_server_killed_mid_plain_generate(smollm_path):
    """A plain generate(): every decode on an RPC model runs guarded, so the lost server is a
    clear RpcConnectionError naming it, and the process survives."""
    proc, ep0, ep1, _ = _run_kill_script(smollm_path, "plain")
    assert "generating" in proc.stdout
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["error"] and f"RPC server {ep1} was lost" in out["error"]


# -- 4. bad input -------------------------------------------------------------------------------
def test_tensor_split_longer_than_device_count(servers, smollm_path):
    eps = [s.endpoint for s in servers]
    t0 = time.monotonic()
    with pytest.raises(ValueError, match=r"tensor_split has 3 entries but only 2 device\(s\)"):
        Model(smollm_path, rpc_servers=eps, tensor_split=[1, 1, 1], repack=False)
    with pytest.raises(ValueError, match=r"tensor_split has 2 entries but only 1 device"):
        Model(smollm_path, rpc_servers=eps[:1], tensor_split=[1, 1], repack=False)
    assert time.monotonic() - t0 < 10


@pytest.mark.parametrize("ts", [[1, -1], [float("nan"), 1], [0, 0], [float("inf"), 1]])
def test_tensor_split_bad_weights_fail_before_any_network(smollm_path, ts):
    # an unreachable endpoint: the weights are checked first, so nothing is dialled
    t0 = time.monotonic()
    with pytest.raises(ValueError, match="tensor_split"):
        Model(smollm_path, rpc_servers=[f"127.0.0.1:{_closed_port()}"], tensor_split=ts)
    assert time.monotonic() - t0 < 2


def test_unreachable_endpoint_fails_fast(smollm_path):
    ep = f"127.0.0.1:{_closed_port()}"
    t0 = time.monotonic()
    with pytest.raises(ConnectionError, match=re.escape(f"RPC server {ep} is unreachable")) as ei:
        Model(smollm_path, rpc_servers=[ep])
    assert isinstance(ei.value, RpcConnectionError) and ei.value.endpoint == ep
    assert time.monotonic() - t0 < 5.0  # connection refused: immediate (the probe's bound is 5 s)
    assert ep not in lrpc.registered_endpoints()


@pytest.mark.parametrize("reply", [None, b"HTTP/1.0 400 Bad Request\r\n\r\n"])
def test_endpoint_that_is_not_an_answering_rpc_server(reply):
    """A listener that never answers (or a busy rpc-server), or one speaking another protocol."""
    lsock = socket.create_server(("127.0.0.1", 0))
    ep = f"127.0.0.1:{lsock.getsockname()[1]}"
    conns = []

    def serve():
        while True:
            try:
                c, _ = lsock.accept()
            except OSError:
                return
            conns.append(c)
            if reply is not None:
                c.sendall(reply)
                c.close()

    threading.Thread(target=serve, daemon=True).start()
    try:
        t0 = time.monotonic()
        with pytest.raises(RpcConnectionError, match=re.escape(f"RPC server {ep}")) as ei:
            add_rpc_server(ep, timeout=1.0)
        elapsed = time.monotonic() - t0
        if reply is None:
            assert "did not answer the RPC handshake within 1 s" in str(ei.value)
            assert 0.9 < elapsed < 3.0
        else:
            assert "ggml rpc-server" in str(ei.value)
            assert elapsed < 3.0
    finally:
        lsock.close()
        for c in conns:
            c.close()


def test_bad_endpoint_strings(smollm_path):
    for bad in ["localhost", "127.0.0.1:", ":50052", "127.0.0.1:port", "127.0.0.1:70000"]:
        with pytest.raises(ValueError, match="host:port"):
            add_rpc_server(bad)
    with pytest.raises(TypeError, match="lists of strings"):
        Model(smollm_path, rpc_servers="127.0.0.1:1")


def test_stopped_server_does_not_break_later_loads(smollm_path):
    """A registered server that went away: devices() and other models do not touch it."""
    with local_rpc_servers(1) as (ep,):
        names = add_rpc_server(ep)
    t0 = time.monotonic()
    listed = {d.name: d for d in devices()}
    assert listed[names[0]].memory_total == 0  # not asked: it does not answer
    with pytest.raises(RpcConnectionError, match=re.escape(f"RPC server {ep} cannot be used")):
        Model(smollm_path, rpc_servers=[ep], repack=False)
    m = Model(smollm_path, repack=False)  # llama.cpp alone would put it on every RPC device
    try:
        assert m.devices() == [] and m.rpc_endpoints == ()
    finally:
        m.close()
    assert time.monotonic() - t0 < 20


def test_local_rpc_servers_stop_on_exit():
    with local_rpc_server_handles(2) as handles:
        eps = [h.endpoint for h in handles]
        assert len(set(eps)) == 2 and all(h.alive() for h in handles)
        for ep in eps:
            assert lrpc.probe(ep) == (lrpc.RPC_PROTO_MAJOR_VERSION, lrpc.RPC_PROTO_MINOR_VERSION, 0)
    assert not any(h.alive() for h in handles)
    for ep in eps:
        with pytest.raises(RpcConnectionError, match="unreachable"):
            lrpc.probe(ep, timeout=1.0)


# -- the CLI ------------------------------------------------------------------------------------
def test_cli_rpc_server_and_devices():
    port = _closed_port()
    ep = f"127.0.0.1:{port}"
    server = subprocess.Popen([sys.executable, "-m", "llama_spec", "rpc-server", "--host", "127.0.0.1",
                               "--port", str(port), "-t", "1"],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT)
    try:
        lrpc.wait_until_ready(ep, timeout=30, proc=server)
        r = subprocess.run([sys.executable, "-m", "llama_spec", "devices", "--rpc", ep],
                           capture_output=True, text=True, timeout=120, cwd=ROOT)
        assert r.returncode == 0, r.stderr
        rpc_lines = [ln for ln in r.stdout.splitlines() if ln.startswith("RPC")]
        assert len(rpc_lines) == 1 and rpc_lines[0].startswith(f"RPC0: {ep} (gpu, RPC,"), r.stdout
        assert "MiB free of" in rpc_lines[0] and " 0 MiB free of 0 MiB" not in rpc_lines[0]
    finally:
        server.terminate()
        out = server.communicate(timeout=10)[0]
    assert f"endpoint       : {ep}" in out

    # an unreachable endpoint: a clear error, exit code 2, no hang
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, "-m", "llama_spec", "devices", "--rpc", ep],
                       capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert r.returncode == 2 and f"error: RPC server {ep} is unreachable" in r.stderr
    assert time.monotonic() - t0 < 60
