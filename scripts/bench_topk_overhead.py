#!/usr/bin/env python3
"""Is the top-k draft statistics observer cheap when on, and the observer hook free when unused?

Three arms, interleaved A B C C B A per round, same prompts, seeds and models:

* ``none``: no observer attached (the default; SpecStats is the only one),
* ``noop``: a do-nothing ``Observer`` attached (the cost of the hook itself),
* ``on``: top-k statistics on (``TopKStats().attach(gen)``: the drafter also collects its top-8).

Reports decode t/s medians and, per round (the six runs of a round share load and seeds), the
throughput ratios noop/none and on/none: their median and spread are the figures to quote.
Default pair: the synthetic MTP model (fast, so Python overhead is most visible); ``--pair qwen``
uses Qwen2.5-Coder 1.5B <- 0.5B.

    python scripts/bench_topk_overhead.py [--pair mtp|qwen] [--rounds 20] [--tokens 256] [--json F]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

from llama_spec import DraftModelDrafter, Model, MtpDrafter, SamplerParams, SpeculativeGenerator, TopKStats
from llama_spec.observe.observers import Observer


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pair", choices=["mtp", "qwen"], default="mtp")
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--temp", type=float, default=0.8)
    ap.add_argument("--json", default=None)
    ns = ap.parse_args()
    if ns.pair == "mtp":
        from llama_spec.testing.synthetic_mtp import synthetic_mtp_path

        target = Model(synthetic_mtp_path(sigma=0.0, seed=0), load_mtp=True)
        make_drafter = lambda: MtpDrafter(target, n_ctx=2048)  # noqa: E731
    else:
        from llama_spec.testing.models import model_path

        target = Model(model_path("qwen2.5-coder-1.5b"))
        draft = Model(model_path("qwen2.5-coder-0.5b"))
        make_drafter = lambda: DraftModelDrafter(draft, n_ctx=2048)  # noqa: E731
    gens = {
        "none": SpeculativeGenerator(target, make_drafter(), n_ctx=2048),
        "noop": SpeculativeGenerator(target, make_drafter(), n_ctx=2048, observers=[Observer()]),
        "on": SpeculativeGenerator(target, make_drafter(), n_ctx=2048),
    }
    TopKStats(every=10**9).attach(gens["on"])
    prompts = ["Once upon a time", "def main():\n"]
    tps: dict[str, list[float]] = {k: [] for k in gens}
    per_round: list[dict[str, float]] = []
    order = ["none", "noop", "on", "on", "noop", "none"]
    for rnd in range(ns.rounds):
        secs = {k: 0.0 for k in gens}
        toks = {k: 0 for k in gens}
        for arm in order:
            for p in prompts:
                t0 = time.perf_counter()
                r = gens[arm].generate(p, sampling=SamplerParams(temp=ns.temp), seed=rnd, n_predict=ns.tokens,
                                       ignore_eos=True)
                dt = time.perf_counter() - t0
                tps[arm].append(r.stats.emitted / dt)
                secs[arm] += dt
                toks[arm] += r.stats.emitted
        per_round.append({k: toks[k] / secs[k] for k in gens})
        print(f"round {rnd + 1}/{ns.rounds} done", file=sys.stderr)
    med = {k: statistics.median(v) for k, v in tps.items()}
    spread = {k: (min(v), max(v)) for k, v in tps.items()}

    def paired(a: str, b: str) -> dict:
        """Per-round throughput ratio a/b (same round: same load, same seeds), in percent."""
        d = sorted(100 * (r[a] / r[b] - 1) for r in per_round)
        q = statistics.quantiles(d, n=4) if len(d) >= 2 else [d[0]] * 3
        return {"median_pct": statistics.median(d), "iqr_pct": [q[0], q[2]], "min_max_pct": [d[0], d[-1]]}

    res = {
        "pair": ns.pair, "tokens": ns.tokens, "rounds": ns.rounds, "temp": ns.temp,
        "median_tps": med, "min_max_tps": spread,
        "noop_vs_none_pct": 100 * (med["noop"] / med["none"] - 1),
        "on_vs_none_pct": 100 * (med["on"] / med["none"] - 1),
        "paired_noop_vs_none": paired("noop", "none"),
        "paired_on_vs_none": paired("on", "none"),
    }
    print("| arm | median t/s | min–max |\n|---|---|---|")
    for k in ("none", "noop", "on"):
        print(f"| {k} | {med[k]:.1f} | {spread[k][0]:.1f}–{spread[k][1]:.1f} |")
    for name, key in (("noop observer vs none", "paired_noop_vs_none"), ("on vs none", "paired_on_vs_none")):
        v = res[key]
        print(f"{name}: per-round ratio median {v['median_pct']:+.2f} % "
              f"(IQR {v['iqr_pct'][0]:+.2f} .. {v['iqr_pct'][1]:+.2f} %, min..max {v['min_max_pct'][0]:+.2f} .. "
              f"{v['min_max_pct'][1]:+.2f} %)")
    if ns.json:
        with open(ns.json, "w") as fh:
            json.dump(res, fh, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
