#!/usr/bin/env python
"""One client (or C at once) against our auto server and our plain server, in fresh process pairs (issue 25, 4).

At C = 1 the difference between ``--spec-auto`` (which mostly decodes plainly when the draft model
does not pay) and a server without a draft model is a few per cent, smaller than the ±10 %
these VMs vary by between processes. So each pair starts both servers afresh (1.5B <- 0.5B,
n-max 3, ``--parallel 8``, as ``bench_server.py``), sends --rounds x --requests completions to
each in A B B A order, one at a time, and reports auto ÷ plain of that pair; the figure is the
median over --pairs pairs, with every pair's ratio printed. Which server starts first alternates
from pair to pair (the first-started one ran ~2 % slower on the AVX2 EPYC). ``--control`` runs a
control pair after each pair, two plain servers in the same roles, so the harness's own ratio
(whatever the two processes differ by) is measured in the same run: the auto server's own ratio
is the auto pairs' median over the control pairs' median.

    python scripts/bench_server_pairs.py                 # 3 pairs x 3 rounds x 2 requests (~8 min)
    python scripts/bench_server_pairs.py --pairs 1 --rounds 1 --requests 1 -n 16   # smoke
    python scripts/bench_server_pairs.py --pairs 10 --rounds 2 --control            # with the control
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(1, str(Path(__file__).resolve().parent.parent))   # llama_spec from this checkout
import bench_server as B  # noqa: E402  (the same servers, prompts and model names)


def one(url: str, i: int, a: argparse.Namespace, seed: int) -> tuple[float, int]:
    """(tokens/s, tokens drafted) of one completion (``bench_server.one``, timed by its wall time)."""
    t0 = time.perf_counter()
    tokens, drafted, _ = B.one(url, i, a, seed)
    return tokens / (time.perf_counter() - t0), drafted


def pair(a: argparse.Namespace, target: Path, draft: Path | None,
         auto_first: bool) -> tuple[dict[str, list[float]], dict[str, int]]:
    """One pair: the "auto" server (with `draft`; None: a plain server in its role) and a plain one.
    Returns each server's rates and the tokens it drafted."""
    servers = {}
    roles = [("auto", draft, True if draft is not None else None), ("plain", None, None)]
    for name, d, auto in (roles if auto_first else roles[::-1]):
        port = B.free_port()
        servers[name] = (B.start_ours(a, target, d, port, auto), f"http://127.0.0.1:{port}")
    servers = {n: servers[n] for n in ("auto", "plain")}   # the requests' A B B A order starts with auto
    res: dict[str, list[float]] = {n: [] for n in servers}
    drafted = dict.fromkeys(servers, 0)
    try:
        for name, (p, url) in servers.items():
            B.wait_up(p, url, name)
            B.burst(url, 1, a, -1)   # warm-up, as bench_server.py
        for r in range(a.rounds):
            order = list(servers) if r % 2 == 0 else list(reversed(servers))
            if a.concurrency > 1:   # one burst per server per round: C clients x --requests each
                for name in order:
                    rate, n_drafted, _ = B.burst(servers[name][1], a.concurrency, a, r)
                    res[name].append(rate)
                    drafted[name] += n_drafted
                continue
            for i in range(a.requests):
                for name in order:
                    rate, n_drafted = one(servers[name][1], a.requests * r + i, a, 1000 * r + i)
                    res[name].append(rate)
                    drafted[name] += n_drafted
    finally:
        for p, _ in servers.values():
            p.terminate()
        for p, _ in servers.values():
            p.wait(60)
    return res, drafted


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-m", "--model", default="qwen2.5-coder-1.5b")
    ap.add_argument("-md", "--model-draft", default="qwen2.5-coder-0.5b")
    ap.add_argument("--pairs", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--requests", type=int, default=2, help="completions per server per round")
    ap.add_argument("-n", "--n-tokens", type=int, default=96)
    ap.add_argument("--temp", type=float, default=0.8)
    ap.add_argument("--n-max", type=int, default=3)
    ap.add_argument("--parallel", type=int, default=8)
    ap.add_argument("--ctx", type=int, default=1024, help="context per slot")
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--no-repack", action="store_true")
    ap.add_argument("--timeout", type=float, default=1200)
    ap.add_argument("-C", "--concurrency", type=int, default=1,
                    help="clients at once (> 1: each round times one burst of C x --requests per server)")
    ap.add_argument("--control", action="store_true", help="a pair of two plain servers after each pair")
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    target, draft = B.resolve(a.model), B.resolve(a.model_draft)
    kinds = ["auto", "control"] if a.control else ["auto"]
    ratios: dict[str, list[float]] = {k: [] for k in kinds}
    raw: dict[str, list[dict[str, list[float]]]] = {k: [] for k in kinds}
    drafted: dict[str, list[dict[str, int]]] = {k: [] for k in kinds}
    for k in range(a.pairs):
        for kind in kinds:
            res, n_drafted = pair(a, target, draft if kind == "auto" else None, auto_first=k % 2 == 0)
            drafted[kind].append(n_drafted)
            med = {n: statistics.median(v) for n, v in res.items()}
            ratios[kind].append(med["auto"] / med["plain"])
            raw[kind].append(res)
            role = "auto" if kind == "auto" else "plain (in auto's role)"
            first = "auto" if k % 2 == 0 else "plain"
            print(f"pair {k} {kind}: {role} {med['auto']:.2f} t/s, plain {med['plain']:.2f} t/s, ratio "
                  f"{ratios[kind][-1]:.3f}, drafted {n_drafted['auto']} ({first} started first, "
                  f"load {os.getloadavg()[0]:.2f})", flush=True)
    r = ratios["auto"]
    print(f"C {a.concurrency}: auto / plain over {a.pairs} pairs: median {statistics.median(r):.3f}, "
          f"min {min(r):.3f}, max {max(r):.3f} (goal >= 0.97)")
    if a.control:
        c = ratios["control"]
        print(f"control (plain / plain) over {a.pairs} pairs: median {statistics.median(c):.3f}, "
              f"min {min(c):.3f}, max {max(c):.3f}; auto's own: {statistics.median(r) / statistics.median(c):.3f}")
    if a.json:
        Path(a.json).write_text(json.dumps({"ratios": ratios, "raw": raw, "drafted": drafted, "n_tokens": a.n_tokens,
                                            "temp": a.temp, "concurrency": a.concurrency, "threads": a.threads},
                                           indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
