#!/usr/bin/env python
"""Server throughput: ``llama-spec serve`` against native ``llama-server``, interleaved (issue 13, 5).

Both servers run the same target/draft pair (default 1.5B <- 0.5B, n-max 3) with ``--parallel``
= the largest concurrency; for each round and each concurrency C, C clients each send
--requests completions of --n-tokens tokens (temperature 0.8, ignore_eos, distinct prompts and
seeds), one server then the other (the order alternates per round). Aggregate t/s = completion
tokens / wall time of the whole burst. Reported: per-C medians, ours/native, and ours at C=4
over ours at C=1 (goals: >= 0.95x native at each C, >= 2.2x our single stream at C=4).

Native ``llama-server`` gets ``--spec-type draft-simple`` explicitly: this llama.cpp speculates
with ``-md`` alone only when the draft GGUF names a speculative type in its metadata, so without it
the native server decodes plainly with the draft loaded and unused (sessions before 6 measured that
by mistake). Every response's draft counts are summed per server (native: ``timings.draft_n`` /
``draft_n_accepted``; ours: the ``speculative`` object) and a speculating server that drafted
nothing is an error. ``--plain`` adds both servers without a draft model (plain batched decoding)
as a reference.

The native server is ``--native-server PATH``, else built from the same pinned source with
``build_llama.build_tools(["llama-server"])`` -- which needs a build directory configured with
``LLAMA_BUILD_SERVER=ON`` (the package's CPU build configures it OFF: pass a path, or use
--skip-native to measure ours alone).

    nice -n 10 python scripts/bench_server.py --quick          # smoke: 0.5B <- 0.5B, C=1,2, 16 tokens
    python scripts/bench_server.py --native-server /path/to/llama-server   # the full figure (minutes)
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
PROMPTS = [f"Write a short paragraph about {t}." for t in
           ("rivers", "bread", "the moon", "trains", "owls", "glass", "chess", "tea", "bees", "maps")]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_up(p: subprocess.Popen, url: str, name: str, timeout: float = 600) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if p.poll() is not None:
            raise SystemExit(f"{name} exited with {p.returncode}")
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.5)
    p.kill()
    raise SystemExit(f"{name} did not come up in {timeout:.0f} s")


def _pipe_log(p: subprocess.Popen, tag: str, quiet: bool) -> None:
    def pump() -> None:
        assert p.stderr is not None
        for ln in p.stderr:
            if not quiet:
                sys.stderr.write(f"  [{tag}] {ln}")
    threading.Thread(target=pump, daemon=True).start()


def start_ours(a: argparse.Namespace, target: Path, draft: Path | None, port: int,
               auto: bool | None = None) -> subprocess.Popen:
    """auto: --spec-auto / --no-spec-auto (None: the server's default, on)."""
    spec = ["-md", str(draft), "--spec-draft-n-max", str(a.n_max)] if draft is not None else []
    if auto is not None and draft is not None:
        spec.append("--spec-auto" if auto else "--no-spec-auto")
    cmd = [sys.executable, "-m", "llama_spec", "serve", "-m", str(target), *spec,
           "--parallel", str(a.parallel), "-c", str(a.ctx), "-t", str(a.threads), "--port", str(port),
           "--queue-size", str(4 * a.parallel)]
    if a.no_repack:
        cmd.append("-nr")
    p = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True, cwd=ROOT)
    _pipe_log(p, "ours", quiet=False)
    return p


def start_native(a: argparse.Namespace, binary: Path, target: Path, draft: Path | None, port: int) -> subprocess.Popen:
    # llama-server divides -c among the slots: give it parallel x the per-slot context we use.
    # --spec-type: without it this llama-server loads -md but does not speculate (module docstring).
    spec = ["-md", str(draft), "--spec-type", "draft-simple", "--spec-draft-n-max", str(a.n_max)] if draft else []
    cmd = [str(binary), "-m", str(target), *spec, "--parallel", str(a.parallel),
           "-c", str(a.ctx * a.parallel), "-t", str(a.threads), "--host", "127.0.0.1", "--port", str(port),
           "--no-webui"]
    if a.no_repack:
        cmd.append("-nr")
    env = dict(os.environ, LLAMA_LOG_COLORS="0")
    p = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True, env=env)
    _pipe_log(p, "native", quiet=True)
    return p


def draft_counts(js: dict) -> tuple[int, int]:
    """(drafted, accepted) of one completion response: ours' ``speculative``, native's ``timings``."""
    sp = js.get("speculative")
    if isinstance(sp, dict):
        return int(sp.get("drafted", 0)), int(sp.get("accepted", 0))
    t = js.get("timings") or {}
    return int(t.get("draft_n", 0)), int(t.get("draft_n_accepted", 0))


def one(url: str, i: int, a: argparse.Namespace, seed: int) -> tuple[int, int, int]:
    """(completion tokens, drafted, accepted) of one completion."""
    body = {"prompt": PROMPTS[i % len(PROMPTS)], "max_tokens": a.n_tokens, "temperature": a.temp,
            "seed": seed, "ignore_eos": True}
    r = httpx.post(url + "/v1/completions", json=body, timeout=a.timeout)
    r.raise_for_status()
    js = r.json()
    return (int(js["usage"]["completion_tokens"]), *draft_counts(js))


def burst(url: str, c: int, a: argparse.Namespace, round_no: int) -> tuple[float, int, int]:
    """C clients x --requests completions each: (aggregate completion tokens per second, drafted, accepted)."""
    def client(k: int) -> list[tuple[int, int, int]]:
        return [one(url, k * a.requests + j, a, 1000 * round_no + 10 * k + j) for j in range(a.requests)]
    t0 = time.perf_counter()
    with ThreadPoolExecutor(c) as ex:
        rows = [x for xs in ex.map(client, range(c)) for x in xs]
    dt = time.perf_counter() - t0
    return sum(r[0] for r in rows) / dt, sum(r[1] for r in rows), sum(r[2] for r in rows)


def resolve(name: str) -> Path:
    from llama_spec.models.registry import resolve_model

    return resolve_model(name)


def build_native_server() -> Path:
    """Build native llama-server from the pinned source in its own cmake folder (the package's
    build has LLAMA_BUILD_SERVER=OFF), niced; return the binary. Cached: a second call is a no-op."""
    sys.path.insert(0, str(ROOT))
    import build_llama

    src, src_id = build_llama.llama_source()
    bdir = build_llama.cache_root() / f"server-{build_llama.backend()}-{src_id.replace(':', '_').replace('/', '_')[-24:]}"
    binary = bdir / "bin" / "llama-server"
    if binary.exists():
        return binary
    bdir.mkdir(parents=True, exist_ok=True)
    args = [x.replace("-DLLAMA_BUILD_SERVER=OFF", "-DLLAMA_BUILD_SERVER=ON") for x in build_llama.cmake_args(src, bdir)]
    log = bdir / "bench-server-build.log"
    nice = ["nice", "-n", "10"]
    print(f"building llama-server in {bdir} (log: {log})", file=sys.stderr)
    build_llama._configure([*nice, *args], log)
    jobs = os.environ.get("CMAKE_BUILD_PARALLEL_LEVEL") or str(os.cpu_count() or 2)
    build_llama._run_logged([*nice, "cmake", "--build", str(bdir), "-j", jobs, "--target", "llama-server"], log,
                            "cmake build (llama-server)")
    # it must link and run: --version exits 0
    subprocess.run([str(binary), "--version"], check=True, capture_output=True, timeout=60)
    return binary


def native_binary(a: argparse.Namespace) -> Path | None:
    if a.skip_native:
        return None
    if a.native_server:
        return Path(a.native_server)
    if a.build_native:
        return build_native_server()
    sys.path.insert(0, str(ROOT))
    import build_llama

    cache = Path(build_llama.build_info()["build_dir"]) / "CMakeCache.txt"
    if cache.exists() and "LLAMA_BUILD_SERVER:BOOL=OFF" in cache.read_text():
        print(f"{cache} has LLAMA_BUILD_SERVER=OFF: llama-server cannot be built there; pass --native-server PATH. "
              "Measuring ours alone.", file=sys.stderr)
        return None
    try:
        return build_llama.build_tools(["llama-server"]) / "llama-server"
    except Exception as e:  # noqa: BLE001 - explain, then measure ours alone
        print(f"cannot build llama-server from the cached build ({e}); the package's build configures "
              "LLAMA_BUILD_SERVER=OFF: pass --native-server PATH. Measuring ours alone.", file=sys.stderr)
        return None


def report(res: dict[str, dict[int, list[float]]], conc: list[int], drafts: dict[str, tuple[int, int]]) -> dict:
    out: dict = {"concurrency": conc, "median_tps": {}, "ratio_vs_native": {}, "spread": {}, "acceptance": {}}
    for name, per in res.items():
        out["median_tps"][name] = {c: statistics.median(v) for c, v in per.items()}
        out["spread"][name] = {c: [min(v), max(v)] for c, v in per.items()}
    med = out["median_tps"]
    for name, (dr, ac) in drafts.items():
        out["acceptance"][name] = {"drafted": dr, "accepted": ac, "rate": ac / dr if dr else None}
        if dr:
            print(f"{name}: drafted {dr}, accepted {ac} ({ac / max(dr, 1):.1%})")
    print(f"\naggregate t/s\n{'C':>3} " + " ".join(f"{n:>12}" for n in med) + ("   ours/native" if "native" in med else ""))
    for c in conc:
        row = f"{c:>3} " + " ".join(f"{med[n][c]:>12.2f}" for n in med)
        if "native" in med:
            out["ratio_vs_native"][c] = med["ours"][c] / med["native"][c]
            row += f"   {out['ratio_vs_native'][c]:.3f}x"
        print(row)
    if 1 in med["ours"] and 4 in med["ours"]:
        out["ours_c4_over_c1"] = med["ours"][4] / med["ours"][1]
        print(f"ours C=4 / C=1: {out['ours_c4_over_c1']:.2f}x (goal >= 2.2x)")
    if "ours-auto" in med and "ours-plain" in med:
        out["auto_over_best"] = {c: med["ours-auto"][c] / max(med["ours"][c], med["ours-plain"][c]) for c in conc}
        print("auto / max(fixed, plain): " + ", ".join(f"C={c} {r:.3f}x" for c, r in out["auto_over_best"].items())
              + " (goal >= 0.97)")
    if "ours-plain" in med and "native-plain" in med:
        out["plain_ratio_vs_native"] = {c: med["ours-plain"][c] / med["native-plain"][c] for c in conc}
        print("plain ours/native: " + ", ".join(f"C={c} {r:.3f}x" for c, r in out["plain_ratio_vs_native"].items()))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-m", "--model", default="qwen2.5-coder-1.5b")
    ap.add_argument("-md", "--model-draft", default="qwen2.5-coder-0.5b")
    ap.add_argument("--concurrency", default="1,4,8")
    ap.add_argument("--n-tokens", type=int, default=96)
    ap.add_argument("--requests", type=int, default=2, help="completions per client per burst")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--temp", type=float, default=0.8)
    ap.add_argument("--n-max", type=int, default=3)
    ap.add_argument("--ctx", type=int, default=1024, help="context per slot")
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--no-repack", action="store_true", help="-nr on both servers (default: llama.cpp's default)")
    ap.add_argument("--native-server", default=None, help="llama-server binary built from the pinned source")
    ap.add_argument("--skip-native", action="store_true")
    ap.add_argument("--build-native", action="store_true",
                    help="build llama-server from the pinned source in a separate cmake folder (niced, cached)")
    ap.add_argument("--timeout", type=float, default=1200)
    ap.add_argument("--plain", action="store_true", help="also both servers without a draft model (plain batching)")
    ap.add_argument("--auto", action="store_true",
                    help="issue 25: ours fixed (--no-spec-auto), ours-auto (the controller) and ours-plain "
                         "(no draft model); reports auto / max(fixed, plain) per C (goal >= 0.97)")
    ap.add_argument("--quick", action="store_true", help="smoke run: 0.5B <- 0.5B, C=1,2, 16 tokens, 1 round")
    ap.add_argument("--json", default=None)
    a = ap.parse_args(argv)
    if a.quick:
        a.model = a.model_draft = "qwen2.5-coder-0.5b"
        a.concurrency, a.n_tokens, a.rounds, a.requests, a.ctx = "1,2", 16, 1, 1, 256
    conc = sorted({int(x) for x in a.concurrency.split(",")})
    a.parallel = max(conc)
    target, draft = resolve(a.model), resolve(a.model_draft)
    servers: dict[str, tuple[subprocess.Popen, str]] = {}
    binary = native_binary(a)
    for suffix, d in [("", draft), *([("-plain", None)] if a.plain or a.auto else [])]:
        port = free_port()
        servers["ours" + suffix] = (start_ours(a, target, d, port, False if a.auto else None),
                                    f"http://127.0.0.1:{port}")
        if suffix == "" and a.auto:
            port = free_port()
            servers["ours-auto"] = (start_ours(a, target, d, port, True), f"http://127.0.0.1:{port}")
        if binary is not None and (suffix == "" or a.plain):
            port = free_port()
            servers["native" + suffix] = (start_native(a, binary, target, d, port), f"http://127.0.0.1:{port}")
    res: dict[str, dict[int, list[float]]] = {n: {c: [] for c in conc} for n in servers}
    drafts = {n: [0, 0] for n in servers}
    try:
        for name, (p, url) in servers.items():
            wait_up(p, url, name)
            burst(url, 1, a, -1)  # warm-up
        for r in range(a.rounds):
            order = list(servers) if r % 2 == 0 else list(reversed(servers))
            for c in conc:
                for name in order:
                    tps, dr, ac = burst(servers[name][1], c, a, r)
                    res[name][c].append(tps)
                    drafts[name][0] += dr
                    drafts[name][1] += ac
                    print(f"round {r} C={c} {name}: {tps:.2f} t/s, accepted {ac}/{dr} "
                          f"(load {os.getloadavg()[0]:.2f})", file=sys.stderr)
                    if name in ("ours", "native") and dr == 0:
                        raise SystemExit(f"{name} drafted nothing: it is not speculating (see the docstring)")
        out = report(res, conc, {n: (v[0], v[1]) for n, v in drafts.items()})
        out.update(model=str(target), draft=str(draft), n_tokens=a.n_tokens, temp=a.temp, threads=a.threads,
                   rounds=a.rounds, requests=a.requests, raw=res, load=os.getloadavg())
        if a.json:
            Path(a.json).write_text(json.dumps(out, indent=2))
    finally:
        for p, _ in servers.values():
            p.send_signal(signal.SIGTERM)
        for p, _ in servers.values():
            try:
                p.wait(60)
            except subprocess.TimeoutExpired:
                p.kill()
    return 0


if __name__ == "__main__":
    sys.exit(main())
