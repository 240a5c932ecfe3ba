#!/usr/bin/env python3
"""Per-position acceptance vs sum_y min(p, q), at an N large enough for the 2 % band.

Runs the rejection rule on the synthetic MTP model (sigma = 0.02, temperature 0.8) until every
one of the first n_max draft positions was visited at least --visits times, then prints the
empirical acceptance rate and the mean of sum min(p, q) logged at the same visits, their
difference and its standard error. Passes when every position is within 2 % (absolute) and
within 4.5 standard errors.

    python scripts/accept_rate_check.py [--visits 10000] [--sigma 0.02] [--temp 0.8] [--json F]
"""

from __future__ import annotations

import argparse
import json
import math
import sys

from llama_spec import Model, MtpDrafter, SamplerParams, SpecStats, SpeculativeGenerator
from llama_spec.observe.observers import PQLog
from llama_spec.testing.synthetic_mtp import synthetic_mtp_path


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--visits", type=int, default=10_000)
    ap.add_argument("--sigma", type=float, default=0.02)
    ap.add_argument("--temp", type=float, default=0.8)
    ap.add_argument("--n-max", type=int, default=3)
    ap.add_argument("--json", default=None)
    ns = ap.parse_args()
    m = Model(synthetic_mtp_path(sigma=ns.sigma, seed=0), load_mtp=True, repack=False)
    # a PQLog observer makes the rules log p and q, so SpecStats sums min(p, q) per position
    gen = SpeculativeGenerator(m, MtpDrafter(m, n_ctx=4096), n_ctx=4096, n_max=ns.n_max, observers=[PQLog()])
    total = SpecStats()
    seed = 0
    while min(total.reached[: ns.n_max]) < ns.visits:
        r = gen.generate("Once upon a time", sampling=SamplerParams(temp=ns.temp), seed=seed, n_predict=1000,
                         n_max=ns.n_max, ignore_eos=True)
        total += r.stats
        seed += 1
        print(f"visits {total.reached[: ns.n_max]}", file=sys.stderr)
    rows, ok = [], True
    for i in range(ns.n_max):
        n = total.reached[i]
        emp = total.accepted_at[i] / n
        exp = total.expected_accept[i] / n
        se = math.sqrt(max(exp * (1 - exp), 1e-12) / n)
        good = abs(emp - exp) < 0.02 and abs(emp - exp) < 4.5 * se
        ok &= good
        rows.append({"position": i + 1, "visits": n, "empirical": emp, "sum_min_pq": exp, "diff": emp - exp,
                     "se": se, "pass": good})
        print(f"position {i + 1}: visits {n}, empirical {emp:.4f}, sum min(p,q) {exp:.4f}, "
              f"diff {emp - exp:+.4f} (se {se:.4f}) {'ok' if good else 'FAIL'}")
    if ns.json:
        with open(ns.json, "w") as fh:
            json.dump({"sigma": ns.sigma, "temp": ns.temp, "positions": rows}, fh, indent=2)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
