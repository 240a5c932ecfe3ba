"""Do two target contexts of one model decode at the same speed? (issue 25: bench_auto's arms are
generators of their own in one process, each with its own target context.)

Two contexts of one Model, the same settings as bench_auto's generators (n_ctx, threads, n_batch 512),
each prefilled with the same tokens, then single-token decodes alternating A B B A .. with nothing
between them; reports each context's median decode time and their ratio, and a paired interval
(t over the log ratios of the adjacent decodes). ``--gens``: the two contexts are those of a plain
and an auto ``SpeculativeGenerator`` as bench_auto builds them, after one 96-token run of each.

  python scripts/context_ab.py                       # 1.5B, 2 contexts, 120 decodes each
  python scripts/context_ab.py --gens --decodes 60
  python scripts/context_ab.py --quick               # smoke: SmolLM2-135M, 8 decodes
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_spec import DEFAULT_DRAFTER, DEFAULT_TARGET, loadavg, machine_info, resolve, write_json  # noqa: E402


def contexts(a: argparse.Namespace):
    """(model(s) to close, {label: Context}): two bare contexts, or bench_auto's plain and auto arms'."""
    from llama_spec import Model
    from llama_spec.llama.context import Context

    if not a.gens:
        m = Model(resolve(a.target))
        return [m], {"A": Context(m, n_ctx=a.n_ctx, n_threads=a.threads), "B": Context(m, n_ctx=a.n_ctx, n_threads=a.threads)}
    import bench_auto

    ns = argparse.Namespace(target=a.target, drafter=a.drafter, auto_spec="ngram-simple,ngram-mod,draft-simple",
                            n_max=5, n_ctx=a.n_ctx, threads=a.threads, auto_tree=None, auto_ab=[], fixed=[],
                            keep_pools=False)
    arms = bench_auto.Arms(ns)
    text = bench_auto.prompts(1)[0][1]
    for arm in ("plain", "auto"):
        arms.run(arm, text, 0.0, a.run_tokens, 1)
    return [arms], {"plain": arms.gens["plain"].core.ctx, "auto": arms.gens["auto"].core.ctx}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", default=DEFAULT_TARGET)
    ap.add_argument("--drafter", default=DEFAULT_DRAFTER)
    ap.add_argument("--gens", action="store_true", help="bench_auto's plain and auto generators' contexts")
    ap.add_argument("--decodes", type=int, default=120, help="single-token decodes per context")
    ap.add_argument("--run-tokens", type=int, default=96, help="--gens: each generator's run before")
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("-c", "--n-ctx", type=int, default=2048)
    ap.add_argument("--json", default=None, metavar="FILE")
    ap.add_argument("--quick", action="store_true", help="smoke: SmolLM2-135M, 8 decodes")
    a = ap.parse_args(argv)
    if a.quick:
        a.target = a.drafter = "smollm2-135m"
        a.decodes, a.run_tokens = 8, 8
    info = machine_info()
    print(f"# {info['cpu']}, {info['cores']} cores; {loadavg()}", file=sys.stderr)
    owners, ctxs = contexts(a)
    try:
        labels = list(ctxs)
        prefix = list(range(100, 150))
        for c in ctxs.values():
            c.rollback(0, 0)
            c.decode(prefix, None, 0, "last")
        times: dict[str, list[float]] = {k: [] for k in labels}
        for i in range(a.decodes):
            for k in (labels if i % 2 == 0 else labels[::-1]):   # A B B A ..
                t0 = time.perf_counter()
                ctxs[k].decode([1000 + i], [len(prefix) + i], 0, "all")
                times[k].append(time.perf_counter() - t0)
    finally:
        for o in owners:
            o.close()
    from bench_auto import geo_mean_ci  # (bench_auto's paired interval: t over the log ratios)

    med = {k: statistics.median(v) for k, v in times.items()}
    ratio = med[labels[1]] / med[labels[0]]
    paired = list(geo_mean_ci([b / a for a, b in zip(times[labels[0]], times[labels[1]], strict=True)]))
    for k in labels:
        print(f"{k}: median {med[k] * 1e3:.2f} ms per decode ({a.decodes} decodes)")
    print(f"{labels[1]} / {labels[0]}: ratio of medians {ratio:.4f}; paired {paired[0]:.4f} "
          f"(95 % interval {paired[1]:.4f} .. {paired[2]:.4f})")
    write_json(a.json, {"machine": info, "args": vars(a), "median_s": med, "ratio": ratio, "paired": paired,
                        "times_s": times})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
