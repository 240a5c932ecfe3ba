#!/usr/bin/env python
"""Load test of ``llama-spec serve`` on loopback (issue 13, "what it must show" 4).

Starts the server as a subprocess (``--parallel 4``, repack off), then N concurrent streaming
clients (default 32) of which D (default 10) disconnect mid-stream. Checks:

* every completed response equals its solo run (temperature 0, same target/drafter pair run
  alone through SpeculativeGenerator in this process);
* the server stays up (``/health``), no request failed, no slot leaked (``busy`` drops to 0);
* a final request is served at full speed (best of 3 >= --min-speed-ratio x the best of 3 warm
  requests through the server before the load).

Bounded: every client has a timeout, the whole run a deadline (--deadline), and the server
subprocess is stopped (SIGTERM) at the end. Exit code 0 when every check passes.

    python scripts/load_server.py                       # smollm2-135m drafting for itself
    python scripts/load_server.py -m qwen2.5-coder-1.5b -md qwen2.5-coder-0.5b --clients 32
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

TOPICS = ["rivers", "bread", "the moon", "trains", "owls", "glass", "chess", "tea", "volcanoes", "bees",
          "maps", "salt", "clocks", "whales", "paper", "copper"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_server(args: argparse.Namespace, port: int) -> subprocess.Popen:
    """``llama-spec serve`` in a subprocess; returns once /health answers (or raises)."""
    cmd = [sys.executable, "-m", "llama_spec", "serve", "-m", args.model, "-md", args.model_draft, "-nr",
           "--parallel", str(args.parallel), "-c", str(args.ctx), "--port", str(port),
           "--queue-size", str(args.clients), "--spec-draft-n-max", str(args.n_max)]
    if args.threads:
        cmd += ["-t", str(args.threads)]
    p = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True)
    threading.Thread(target=lambda: [sys.stderr.write("  [server] " + ln) for ln in p.stderr], daemon=True).start()
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if p.poll() is not None:
            raise SystemExit(f"the server exited with {p.returncode}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                return p
        except httpx.TransportError:
            pass
        time.sleep(0.3)
    p.kill()
    raise SystemExit("the server did not come up in 300 s")


def solo_refs(args: argparse.Namespace, prompts: list[str]) -> list[str]:
    """The reference texts: each prompt alone through SpeculativeGenerator (temperature 0, repack off)."""
    from llama_spec import Model, SamplerParams, SpeculativeGenerator
    from llama_spec.drafters.draft_model import DraftModelDrafter
    from llama_spec.models.registry import resolve_model

    tm = Model(resolve_model(args.model), repack=False)
    dm = Model(resolve_model(args.model_draft), repack=False)
    gen = SpeculativeGenerator(tm, DraftModelDrafter(dm, n_ctx=args.ctx, n_threads=args.threads), n_ctx=args.ctx,
                               n_threads=args.threads, n_max=args.n_max)
    try:
        return [gen.generate(p, sampling=SamplerParams(temp=0.0), n_predict=args.n_tokens, ignore_eos=True).text
                for p in prompts]
    finally:
        gen.close()
        dm.close()
        tm.close()


def stream_one(url: str, prompt: str, n_tokens: int, drop_after: int | None, timeout: float) -> dict:
    """One streaming completion; drop the connection after `drop_after` chunks (None: read it all)."""
    parts: list[str] = []
    t0 = time.perf_counter()
    body = {"prompt": prompt, "max_tokens": n_tokens, "temperature": 0, "stream": True, "ignore_eos": True}
    with httpx.stream("POST", url + "/v1/completions", json=body, timeout=timeout) as r:
        if r.status_code != 200:
            return {"status": r.status_code, "error": r.read().decode(errors="replace")}
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            ch = json.loads(line[6:])
            if "error" in ch:
                return {"status": 500, "error": ch["error"]}
            if ch["choices"]:
                parts.append(ch["choices"][0]["text"])
            if drop_after is not None and len(parts) >= drop_after:
                return {"status": 200, "dropped": True, "text": "".join(parts)}
    return {"status": 200, "dropped": False, "text": "".join(parts), "s": time.perf_counter() - t0}


def timed_request(url: str, prompt: str, n_tokens: int) -> float:
    """Tokens per second of one non-streaming completion (wall time, prefill included)."""
    t0 = time.perf_counter()
    r = httpx.post(url + "/v1/completions", timeout=300,
                   json={"prompt": prompt, "max_tokens": n_tokens, "temperature": 0, "ignore_eos": True})
    r.raise_for_status()
    return float(r.json()["usage"]["completion_tokens"]) / (time.perf_counter() - t0)


def run_load(url: str, args: argparse.Namespace, prompts: list[str], refs: list[str]) -> list[str]:
    """The concurrent phase; returns the failed checks (empty: all good)."""
    rng = random.Random(args.seed)
    drop = set(rng.sample(range(args.clients), args.disconnect))
    plan = [(i, prompts[i % len(prompts)], rng.randint(1, max(1, args.n_tokens // 3)) if i in drop else None)
            for i in range(args.clients)]
    with ThreadPoolExecutor(args.clients) as ex:
        futs = [ex.submit(stream_one, url, p, args.n_tokens, d, args.client_timeout) for _, p, d in plan]
        results = [f.result(timeout=args.deadline) for f in futs]
    bad: list[str] = []
    for (i, _, d), res in zip(plan, results, strict=True):
        if res["status"] != 200:
            bad.append(f"client {i}: HTTP {res['status']} {res.get('error')}")
        elif d is None and res["text"] != refs[i % len(prompts)]:
            bad.append(f"client {i}: text differs from its solo run: {res['text']!r} != {refs[i % len(prompts)]!r}")
    done = sum(1 for (_, _, d), r in zip(plan, results, strict=True) if d is None and r["status"] == 200)
    print(f"load: {args.clients} clients, {len(drop)} disconnected mid-stream, {done} completed", file=sys.stderr)
    return bad


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-m", "--model", default="smollm2-135m")
    ap.add_argument("-md", "--model-draft", default=None, help="default: the target itself")
    ap.add_argument("--parallel", type=int, default=4)
    ap.add_argument("--clients", type=int, default=32)
    ap.add_argument("--disconnect", type=int, default=10)
    ap.add_argument("--n-tokens", type=int, default=32)
    ap.add_argument("--n-max", type=int, default=3)
    ap.add_argument("--ctx", type=int, default=512, help="context per slot")
    ap.add_argument("-t", "--threads", type=int, default=None)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--client-timeout", type=float, default=600)
    ap.add_argument("--deadline", type=float, default=1800, help="seconds for the whole concurrent phase")
    ap.add_argument("--min-speed-ratio", type=float, default=0.7)
    ap.add_argument("--json", default=None, help="write the figures here")
    args = ap.parse_args(argv)
    args.model_draft = args.model_draft or args.model
    if not 0 <= args.disconnect <= args.clients:
        ap.error("--disconnect must be in [0, --clients]")
    prompts = [f"Here are some facts about {t}:" for t in TOPICS]
    print("solo references ...", file=sys.stderr)
    refs = solo_refs(args, prompts)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    server = start_server(args, port)
    bad: list[str] = []
    try:
        timed_request(url, prompts[0], args.n_tokens)  # warm-up
        # best of 3: one request's speed on a shared machine is noisy
        before = max(timed_request(url, prompts[1], args.n_tokens) for _ in range(3))
        t0 = time.perf_counter()
        bad += run_load(url, args, prompts, refs)
        wall = time.perf_counter() - t0
        t_idle = time.monotonic()
        while (h := httpx.get(url + "/health", timeout=5).json())["busy"] and time.monotonic() - t_idle < 30:
            time.sleep(0.1)
        if h["busy"]:
            bad.append(f"slots leaked: {h}")
        after = max(timed_request(url, prompts[1], args.n_tokens) for _ in range(3))
        if after < args.min_speed_ratio * before:
            bad.append(f"final request at {after:.1f} t/s, before the load {before:.1f} t/s")
        figures = {"clients": args.clients, "disconnected": args.disconnect, "parallel": args.parallel,
                   "wall_s": wall, "solo_tps_before": before, "solo_tps_after": after,
                   "load": os.getloadavg(), "failures": bad}
        print(json.dumps(figures, indent=2))
        if args.json:
            Path(args.json).write_text(json.dumps(figures, indent=2))
    finally:
        server.send_signal(signal.SIGTERM)
        try:
            server.wait(60)
        except subprocess.TimeoutExpired:
            server.kill()
            bad.append("the server did not stop within 60 s of SIGTERM")
    if server.returncode not in (0, None):
        bad.append(f"the server exited with {server.returncode}")
    for b in bad:
        print("FAIL:", b, file=sys.stderr)
    print("OK" if not bad else f"{len(bad)} checks failed", file=sys.stderr)
    return 0 if not bad else 1


if __name__ == "__main__":
    sys.exit(main())
