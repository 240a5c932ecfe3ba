#!/usr/bin/env python3
"""Is the top-k draft statistics hook inert when off, and cheap when on?

Three arms, interleaved A B C C B A per round, same prompts, seeds and models:

* ``never``: the loop with every top-k statistics line removed from its source (a build
  where the feature was never compiled in),
* ``off``: the shipped loop with statistics off (the default),
* ``on``: statistics on (``TopKStats().attach(gen)``).

Reports decode t/s medians and, per round (the six runs of a round share load and seeds), the
throughput ratios off/never and on/off: their median and spread are the figures to quote. Default pair: the synthetic MTP model
(fast, so Python overhead is most visible); ``--pair qwen`` uses Qwen2.5-Coder 1.5B <- 0.5B.

    python scripts/bench_topk_overhead.py [--pair mtp|qwen] [--rounds 20] [--tokens 256] [--json F]
"""

from __future__ import annotations

import argparse
import inspect
import json
import statistics
import sys
import textwrap
import time

from llama_spec import DraftModelDrafter, Model, MtpDrafter, SamplerParams, TopKStats
from llama_spec import speculative as sp


def never_compiled_in_class():
    """SpeculativeGenerator with the statistics lines stripped from `stream`."""
    src = textwrap.dedent(inspect.getsource(sp.SpeculativeGenerator.stream))
    lines = src.splitlines()
    out, skip = [], 0
    for ln in lines:
        if skip:
            skip -= 1
            continue
        if "self.topk_stats is not None and k > 0" in ln:
            skip = 1  # and the record() call under it
            continue
        if "drafter.collect_topk = self.topk_stats is not None" in ln:
            continue
        out.append(ln)
    assert len(out) == len(lines) - 3, "the hook lines were not found: update this script"
    ns: dict = {}
    exec(compile("\n".join(out), sp.__file__, "exec"), vars(sp), ns)  # noqa: S102 - our own source
    return type("NeverCompiledIn", (sp.SpeculativeGenerator,), {"stream": ns["stream"]})


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
    never_cls = never_compiled_in_class()
    gens = {
        "never": never_cls(target, make_drafter(), n_ctx=2048),
        "off": sp.SpeculativeGenerator(target, make_drafter(), n_ctx=2048),
        "on": sp.SpeculativeGenerator(target, make_drafter(), n_ctx=2048),
    }
    TopKStats(every=10**9).attach(gens["on"])
    prompts = ["Once upon a time", "def main():\n"]
    tps: dict[str, list[float]] = {k: [] for k in gens}
    per_round: list[dict[str, float]] = []
    order = ["never", "off", "on", "on", "off", "never"]
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
        "off_vs_never_pct": 100 * (med["off"] / med["never"] - 1),
        "on_vs_off_pct": 100 * (med["on"] / med["off"] - 1),
        "paired_off_vs_never": paired("off", "never"),
        "paired_on_vs_off": paired("on", "off"),
    }
    print("| arm | median t/s | min–max |\n|---|---|---|")
    for k in ("never", "off", "on"):
        print(f"| {k} | {med[k]:.1f} | {spread[k][0]:.1f}–{spread[k][1]:.1f} |")
    for name, key in (("off vs never-compiled-in", "paired_off_vs_never"), ("on vs off", "paired_on_vs_off")):
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
