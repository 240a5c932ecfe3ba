"""Where auto's time goes where plain decoding wins: plain vs auto (and auto over the n-gram
members alone) on prompts of one class, interleaved (A B C C B A ..), each step split into the
time inside the target's decodes, inside the draft model's decodes (its drafts and lazy syncs),
and the rest (Python: the plan, the n-gram members' lookups, the cost model, the sampler).

Per token, against plain:
- auto's extra "target" is what its verifications cost beyond plain steps (drafts verified and
  lost: n-gram drafts and the model's tries);
- auto's "draft" is what the draft model cost (cold turns, tries within the exploration budget,
  the first steps of a request that starts from the shared survival, and the syncs);
- auto's extra "rest" is the controller's Python.
"auto ngram" (the chain without its model member) separates the n-gram members' part from the
model's. Counts per run: steps decided plain, drafted by each member, explored.

  python scripts/controller_overhead.py                       # 135M drafting for itself, 1 prose prompt
  python scripts/controller_overhead.py --target qwen2.5-coder-1.5b --drafter qwen2.5-coder-0.5b \\
      --prompts 2 --temps 0,0.8 --runs 4
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_auto  # noqa: E402
from bench_spec import loadavg, machine_info  # noqa: E402

PARTS = ("total", "target", "draft", "rest")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", default="smollm2-135m")
    ap.add_argument("--drafter", default=None, help="default: the target")
    ap.add_argument("--temps", default="0.8")
    ap.add_argument("--cls", default="prose", choices=("code", "prose", "edit"))
    ap.add_argument("--prompts", type=int, default=1, help="prompts of the class")
    ap.add_argument("-n", "--n-tokens", type=int, default=128)
    ap.add_argument("--runs", type=int, default=8, help="runs per arm and prompt (interleaved)")
    ap.add_argument("-t", "--threads", type=int, default=2)
    a = ap.parse_args(argv)
    from llama_spec.llama import context

    spent: dict[str, float] = {"target": 0.0, "draft": 0.0}
    target_ctxs: list[object] = []   # the generators' own contexts (the rest: drafters')

    def timing(fn):   # a Context method, its seconds added to the target's or the draft's
        def timed(self: context.Context, *args: object, **kw: object) -> object:
            t0 = time.perf_counter()
            try:
                return fn(self, *args, **kw)
            finally:
                spent["target" if any(self is c for c in target_ctxs) else "draft"] += time.perf_counter() - t0
        return timed

    for name in ("decode", "decode_multi", "decode_seq_sets"):
        setattr(context.Context, name, timing(getattr(context.Context, name)))
    b = bench_auto.parse_args(["--fixed", "", "--native", "off", "--target", a.target,
                               "--drafter", a.drafter or a.target, "-t", str(a.threads)])
    info = machine_info()
    print(f"# {info['cpu']}, {info['cores']} cores; {loadavg()}", file=sys.stderr)
    arms = bench_auto.Arms(b)
    ngram = [t for t in b.auto_spec.split(",") if t != "draft-simple"]
    from llama_spec import SpeculativeGenerator
    from llama_spec.drafters.chain import ChainDrafter
    from llama_spec.drafters.ngram import NgramModDrafter, build_ngram_drafter

    members = [build_ngram_drafter(t) for t in ngram]
    arms.gens["auto ngram"] = SpeculativeGenerator(arms.target, ChainDrafter(members, gate=True) if len(members) > 1
                                                   else members[0], n_max=64, n_ctx=b.n_ctx, n_threads=a.threads,
                                                   auto=True)
    arms.pools["auto ngram"] = [m.pool for m in members if isinstance(m, NgramModDrafter)]
    order = ["plain", "auto", "auto ngram"]
    target_ctxs.extend(arms.gens[arm].core.ctx for arm in order)
    arms.run("auto", "def f(x):", 0.0, 8, 1)   # warm-up
    texts = [t for c, t in bench_auto.prompts(a.prompts) if c == a.cls]
    temps = [float(x) for x in a.temps.split(",")]
    out: dict[tuple[int, float], dict[str, list[dict[str, float]]]] = {}
    try:
        for p, text in enumerate(texts):
            for temp in temps:
                cell = out[(p, temp)] = {arm: [] for arm in order}
                for i in range(a.runs):
                    for arm in (order if i % 2 == 0 else order[::-1]):
                        for pool in arms.pools[arm]:
                            pool.reset()
                        spent["target"] = spent["draft"] = 0.0
                        r = arms.gens[arm].generate(text, sampling=bench_auto.sampler(temp), n_predict=a.n_tokens,
                                                    seed=1 + i)
                        s, n = r.stats, max(r.stats.emitted, 1)
                        tot = 1e3 * s.t_decode_s / n
                        tgt, dft = 1e3 * spent["target"] / n, 1e3 * spent["draft"] / n
                        rec = {"total": tot, "target": tgt, "draft": dft, "rest": tot - tgt - dft,
                               "steps": s.auto_steps, "plain": s.auto_plain, "explored": s.auto_explored,
                               **{f"by {k}": v for k, v in s.auto_by_drafter.items()}}
                        cell[arm].append(rec)
                report(p, temp, cell)
    finally:
        arms.close()
    print(f"# {arms.target_path.name} <- {arms.draft_path.name}, {a.n_tokens} tokens, {a.runs} runs per arm; "
          f"{info['cpu']}, {info['cores']} cores")
    return 0


def report(p: int, temp: float, cell: dict[str, list[dict[str, float]]]) -> None:
    """One prompt and temperature: ms per token of each part (median of runs), against plain."""
    med = {arm: {k: statistics.median(r[k] for r in runs) for k in PARTS} for arm, runs in cell.items()}
    base = med["plain"]
    print(f"prompt {p} T={temp}: ms/token, median over {len(cell['plain'])} runs (extra over plain)")
    for arm, m in med.items():
        extra = "  ".join(f"{k} {m[k]:7.2f} ({m[k] - base[k]:+6.2f})" for k in PARTS)
        runs = cell[arm]
        counts = {k: sum(x.get(k, 0) for x in runs) for r in runs for k in r if k not in PARTS}
        tail = ", ".join(f"{k} {v:g}" for k, v in sorted(counts.items())) if arm != "plain" else ""
        print(f"  {arm:10}: {extra}   plain/total {base['total'] / m['total']:.3f}   {tail}", flush=True)


if __name__ == "__main__":
    raise SystemExit(main())
