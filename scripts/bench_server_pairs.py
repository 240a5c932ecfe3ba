#!/usr/bin/env python
"""One client against our auto server and our plain server, in fresh process pairs (issue 25, 4).

At C = 1 the difference between ``--spec-auto`` (which mostly decodes plainly when the draft model
does not pay) and a server without a draft model is a few per cent, smaller than the ±10 %
these VMs vary by between processes. So each pair starts both servers afresh (1.5B <- 0.5B,
n-max 3, ``--parallel 8``, as ``bench_server.py``), sends --rounds x --requests completions to
each in A B B A order, one at a time, and reports auto ÷ plain of that pair; the figure is the
median over --pairs pairs, with every pair's ratio printed.

    python scripts/bench_server_pairs.py                 # 3 pairs x 3 rounds x 2 requests (~8 min)
    python scripts/bench_server_pairs.py --pairs 1 --rounds 1 --requests 1 -n 16   # smoke
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


def one(url: str, i: int, a: argparse.Namespace, seed: int) -> float:
    """Tokens/s of one completion (``bench_server.one``, timed by its wall time)."""
    t0 = time.perf_counter()
    tokens, _, _ = B.one(url, i, a, seed)
    return tokens / (time.perf_counter() - t0)


def pair(a: argparse.Namespace, target: Path, draft: Path) -> dict[str, list[float]]:
    servers = {}
    for name, d, auto in (("auto", draft, True), ("plain", None, None)):
        port = B.free_port()
        servers[name] = (B.start_ours(a, target, d, port, auto), f"http://127.0.0.1:{port}")
    res: dict[str, list[float]] = {n: [] for n in servers}
    try:
        for name, (p, url) in servers.items():
            B.wait_up(p, url, name)
            B.burst(url, 1, a, -1)   # warm-up, as bench_server.py
        for r in range(a.rounds):
            order = list(servers) if r % 2 == 0 else list(reversed(servers))
            for i in range(a.requests):
                for name in order:
                    res[name].append(one(servers[name][1], a.requests * r + i, a, 1000 * r + i))
    finally:
        for p, _ in servers.values():
            p.terminate()
        for p, _ in servers.values():
            p.wait(60)
    return res


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
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    target, draft = B.resolve(a.model), B.resolve(a.model_draft)
    ratios, raw = [], []
    for k in range(a.pairs):
        res = pair(a, target, draft)
        med = {n: statistics.median(v) for n, v in res.items()}
        ratios.append(med["auto"] / med["plain"])
        raw.append(res)
        print(f"pair {k}: auto {med['auto']:.2f} t/s, plain {med['plain']:.2f} t/s, auto / plain {ratios[-1]:.3f} "
              f"(load {os.getloadavg()[0]:.2f})", flush=True)
    print(f"auto / plain over {a.pairs} pairs: median {statistics.median(ratios):.3f}, "
          f"min {min(ratios):.3f}, max {max(ratios):.3f} (goal >= 0.97)")
    if a.json:
        Path(a.json).write_text(json.dumps({"ratios": ratios, "raw": raw, "n_tokens": a.n_tokens, "temp": a.temp,
                                            "threads": a.threads}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
