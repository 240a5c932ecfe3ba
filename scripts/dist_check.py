#!/usr/bin/env python3
"""Full-N version of tests/test_distribution.py: a rejection rule (token or block) vs plain
sampling, and the deliberately broken rule, on Qwen2.5-Coder 1.5B <- 0.5B at temperature 1.0.

Joint samples (t0, t1) of the first two emitted tokens, N seeds per arm. Besides the two
p-values it prints the power the test had against the broken rule at this N, computed from the
exact laws rebuilt from the logged p and q (see llama_spec.testing.distribution).
Exit status 0 iff p(rule vs plain) > 5e-5 and p(broken vs plain) < 5e-5.

    python scripts/dist_check.py --n 2500 [--verify token|block] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from tqdm import tqdm

from llama_spec import DraftModelDrafter, Model, SamplerParams, SpeculativeGenerator
from llama_spec.testing import distribution as dist
from llama_spec.testing.models import model_path


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=2500, help="seeds per arm")
    ap.add_argument("--temp", type=float, default=1.0)
    ap.add_argument("--prompt", default="Q: Name a programming language.\nA:")
    ap.add_argument("--verify", choices=["token", "block"], default="token")
    ap.add_argument("--json", default=None)
    ns = ap.parse_args()
    broken = dist.BrokenTokenRule() if ns.verify == "token" else dist.BrokenBlockRule()
    sampling = SamplerParams(temp=ns.temp, top_k=40, top_p=1.0, min_p=0.0)
    target = Model(model_path("qwen2.5-coder-1.5b"))
    draft = Model(model_path("qwen2.5-coder-0.5b"))
    spec = SpeculativeGenerator(target, DraftModelDrafter(draft, n_ctx=256), n_ctx=256, n_max=3)
    plain = SpeculativeGenerator(target, None, n_ctx=256)
    t0 = time.time()
    bar = tqdm(total=3 * ns.n, desc="samples", file=sys.stderr)
    tick = lambda _i: bar.update(1)  # noqa: E731
    laws = dist.FirstTwoLaws()
    ref = dist.joint_samples(plain, ns.prompt, range(ns.n), sampling=sampling, n_predict=2, progress=tick)
    new = dist.joint_samples(spec, ns.prompt, range(10_000, 10_000 + ns.n), sampling=sampling, n_predict=3,
                             progress=tick, laws=laws, verify=ns.verify)
    power, lam, _ = dist.broken_rule_power(laws, ns.n, 5e-5)
    bad = dist.joint_samples(spec, ns.prompt, range(20_000, 20_000 + ns.n), sampling=sampling, n_predict=3,
                             progress=tick, verify=broken)
    bar.close()
    p_ok, cells = dist.homogeneity_pvalue(ref, new)
    p_bad, _ = dist.homogeneity_pvalue(ref, bad)
    out = {"n": ns.n, "temp": ns.temp, "verify": ns.verify, "cells": cells, "p_rejection_vs_plain": p_ok,
           "p_broken_vs_plain": p_bad, "power_vs_broken": power, "noncentrality": lam,
           "acceptance_t1": laws.acceptance(), "acceptance_rate": spec.total.acceptance_rate,
           "seconds": time.time() - t0}
    print(json.dumps(out, indent=2))
    if ns.json:
        with open(ns.json, "w") as fh:
            json.dump(out, fh, indent=2)
    return 0 if p_ok > 5e-5 and p_bad < 5e-5 else 1


if __name__ == "__main__":
    sys.exit(main())
