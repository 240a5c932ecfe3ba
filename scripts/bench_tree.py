#!/usr/bin/env python3
"""Chain vs tree drafts: accepted tokens per verification, target tokens per verification, t/s.

Protocol (defaults): the real pair Qwen2.5-Coder 1.5B <- 0.5B (draft-simple), prompts from
scripts/prompts.json (code + prose), 96 tokens each, temperatures 0.6 / 0.8 / 1.0, llama.cpp's
default sampler knobs otherwise. Arms: the chain (n-max 3, the token rule) and the trees
(2,1,1), (3,1,1), (2,2,1) (the tree rule), all with depth 3. The synthetic qwen35+MTP model
cannot run trees (a hybrid recurrent target refuses them, docs/trees.md), so it is not an arm.

Per prompt, temperature and seed the arms run in one interleaved block, forwards then backwards
(A B C D D C B A, the second half with seed + 1): the same models, one generator per arm (the chain
generator has one sequence, a tree generator one per path). Reported per temperature and arm:

* accepted tokens per verification (kept drafts) and its ratio to the chain's; the goal is
  >= +15 % for the best tree at T >= 0.8;
* tokens emitted per verification (kept + recovered/bonus) and target tokens per verification
  (1 + drafted nodes: the verification batch);
* decode t/s (median over runs) and tree / chain (median of per-seed ratios, min-max);
* the break-even: the tree pays when its time per verification is at most
  ``tokens_per_verification(tree) / tokens_per_verification(chain)`` times the chain's; next to
  it the ratio measured here. On a GPU, where a batch of 4-10 tokens costs about one token, the
  measured ratio approaches the drafting cost ratio alone;
* the chain arm's top-k statistics' prediction for a width-2/3 first level (TopKStats), next to
  the measured gain (each tree's own first-child chain, the counterfactual, is in ``topk``).

  python scripts/bench_tree.py                        # the protocol above (~15 min on 2 cores)
  python scripts/bench_tree.py --n-prompts 1 --n-tokens 32 --temps 0.8 --shapes 2,1,1   # smoke
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_spec import (  # noqa: E402
    DEFAULT_DRAFTER,
    DEFAULT_TARGET,
    fmt_spread,
    load_prompts,
    loadavg,
    machine_info,
    resolve,
    sampler,
    summarize,
    write_json,
    write_text,
)

DEFAULT_SHAPES = ["2,1,1", "3,1,1", "2,2,1"]


def build_arms(args):
    from llama_spec import DraftModelDrafter, Model, SpeculativeGenerator
    from llama_spec.observe.stats import TopKStats

    target = Model(resolve(args.target), repack=args.repack)
    draft = Model(resolve(args.drafter), repack=args.repack)
    arms = {}
    for name in ["chain", *args.shapes]:
        tree = None if name == "chain" else tuple(int(x) for x in name.split(","))
        d = DraftModelDrafter(draft, n_ctx=args.n_ctx, n_threads=args.threads)
        gen = SpeculativeGenerator(target, d, n_ctx=args.n_ctx, n_threads=args.threads, n_max=args.n_max, tree=tree)
        arms[name] = (gen, TopKStats(every=10**9).attach(gen))
    return target, draft, arms


def bench(args) -> dict:
    prompts = load_prompts(args.classes, args.n_prompts)
    target, draft, arms = build_arms(args)
    names = list(arms)
    for name in names:  # warm-up: numba cache, page faults, every arm's code path
        arms[name][0].generate(prompts[0][2], sampling=sampler(0.8), n_predict=8, seed=1, ignore_eos=True)
    for _, topk in arms.values():
        topk.__init__(every=10**9)  # forget the warm-up
    runs = []
    per_temp_topk: dict = {}
    for temp in args.temps:
        for name in names:
            arms[name][1].__init__(every=10**9)
        for cls, idx, text in prompts:
            for half, order in enumerate((names, names[::-1])):
                seed = args.seed + half
                for name in order:
                    gen = arms[name][0]
                    st = gen.generate(text, sampling=sampler(temp), n_predict=args.n_tokens, seed=seed,
                                      ignore_eos=True).stats
                    runs.append({"class": cls, "prompt": idx, "temp": temp, "arm": name, "seed": seed,
                                 "tps": st.decode_tps, "emitted": st.emitted, "verifications": st.verifications,
                                 "drafted": st.drafted, "accepted": st.accepted, "recovered": st.recovered,
                                 "bonus": st.bonus, "t_decode_s": st.t_decode_s})
        per_temp_topk[temp] = {name: arms[name][1].as_dict() for name in names}
        print(f"  T={temp}: done ({loadavg()})", file=sys.stderr)
    for gen, _ in arms.values():
        gen.close()
    target.close()
    draft.close()
    return {"rows": summarize_rows(runs, args.temps, names, per_temp_topk), "runs": runs, "topk": per_temp_topk}


def summarize_rows(runs, temps, names, topk) -> list[dict]:
    rows = []
    for temp in temps:
        row: dict = {"temp": temp}
        chain_key = {(r["class"], r["prompt"], r["seed"]): r for r in runs if r["temp"] == temp and r["arm"] == "chain"}
        for name in names:
            a = [r for r in runs if r["temp"] == temp and r["arm"] == name]
            ver = sum(r["verifications"] for r in a)
            acc = sum(r["accepted"] for r in a)
            out = acc + sum(r["recovered"] + r["bonus"] for r in a)
            t_dec = sum(r["t_decode_s"] for r in a)
            ratios = [r["tps"] / chain_key[(r["class"], r["prompt"], r["seed"])]["tps"] for r in a
                      if chain_key.get((r["class"], r["prompt"], r["seed"]))]
            row[name] = {"accepted_per_verification": acc / ver if ver else 0.0,
                         "tokens_per_verification": out / ver if ver else 0.0,
                         "target_tokens_per_verification": 1 + sum(r["drafted"] for r in a) / ver if ver else 0.0,
                         "s_per_verification": t_dec / ver if ver else 0.0,
                         "tps": summarize([r["tps"] for r in a]), "tps_ratio": summarize(ratios),
                         "verifications": ver}
        c = row["chain"]
        g = topk[temp]["chain"]["widening_gain"]
        for name in names[1:]:
            t = row[name]
            t["accepted_gain"] = t["accepted_per_verification"] / c["accepted_per_verification"] - 1 \
                if c["accepted_per_verification"] else None
            t["break_even_time_ratio"] = t["tokens_per_verification"] / c["tokens_per_verification"] \
                if c["tokens_per_verification"] else None
            t["measured_time_ratio"] = t["s_per_verification"] / c["s_per_verification"] \
                if c["s_per_verification"] else None
            w = min(int(name.split(",")[0]), 3)
            if g and c["verifications"]:
                extra = g[0]["rejections"] * g[0][f"width{w}"] / c["verifications"]
                t["predicted_gain"] = extra / c["accepted_per_verification"] if c["accepted_per_verification"] else None
            t["own_chain"] = topk[temp][name]["tree"]
        rows.append(row)
    return rows


def markdown(res: dict, names: list[str]) -> str:
    def pct(x):
        return "n/a" if x is None else f"{100 * x:+.1f} %"

    out = ["| temp | arm | accepted / verif. (vs chain) | predicted | emitted / verif. | target tokens / verif. "
           "| t/s median | t/s ÷ chain median [min–max] | time/verif. ÷ chain: measured vs break-even |",
           "|---|---|---|---|---|---|---|---|---|"]
    for r in res["rows"]:
        for name in names:
            a = r[name]
            if name == "chain":
                gain = pred = ratio = be = "—"
            else:
                gain, pred = pct(a["accepted_gain"]), pct(a.get("predicted_gain"))
                tr = a["tps_ratio"]
                ratio = fmt_spread(tr, 3) if tr["n"] else "n/a"
                be = f"{a['measured_time_ratio']:.2f} vs {a['break_even_time_ratio']:.2f}"
            out.append(f"| {r['temp']:.1f} | {name} | {a['accepted_per_verification']:.3f} ({gain}) | {pred} | "
                       f"{a['tokens_per_verification']:.3f} | {a['target_tokens_per_verification']:.2f} | "
                       f"{a['tps']['median']:.2f} | {ratio} | {be} |")
    return "\n".join(out)


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", default=DEFAULT_TARGET)
    ap.add_argument("--drafter", default=DEFAULT_DRAFTER)
    ap.add_argument("--shapes", nargs="+", default=DEFAULT_SHAPES)
    ap.add_argument("--temps", type=float, nargs="+", default=[0.6, 0.8, 1.0])
    ap.add_argument("--classes", nargs="+", default=["code", "prose"])
    ap.add_argument("--n-prompts", type=int, default=2, help="prompts per class")
    ap.add_argument("--n-tokens", type=int, default=96)
    ap.add_argument("--n-max", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--n-ctx", type=int, default=1024)
    ap.add_argument("--no-repack", dest="repack", action="store_false")
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--json", default=None)
    ap.add_argument("--md", default=None)
    return ap.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    machine = machine_info()
    t0 = time.perf_counter()
    res = bench(args)
    machine["uptime_after"] = loadavg()
    names = ["chain", *args.shapes]
    res.update(kind="bench_tree", machine=machine, wall_s=time.perf_counter() - t0,
               config={k: v for k, v in vars(args).items() if k not in ("json", "md")})
    md = markdown(res, names)
    print(md)
    write_json(args.json, res)
    write_text(args.md, md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
