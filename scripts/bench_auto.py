"""The speculation controller (--spec-auto) against plain decoding, every fixed configuration and
native llama.cpp, interleaved, same seeds (issue 25).

Per prompt (code and prose from scripts/prompts.json, edits from scripts/edit_prompts.json in the
ChatML chat format) and temperature, every arm runs ``--reps`` times (default 2), in the order
A B .. Z Z .. B A (repeated):

* plain: no drafter;
* auto: the controller over a chain of the drafters (``--auto-spec``, default
  ngram-simple,ngram-mod,draft-simple: it asks the n-gram members first, the draft model only where
  it pays, and chooses plain decoding and the length each step);
* the fixed configurations of the sweep (auto off): draft-simple n-max 1..5, ngram-simple,
  ngram-map-k, ngram-mod, the chains ngram-simple,draft-simple and ngram-mod,draft-simple, trees
  (2,1,1) and (2,2,1) of draft-simple;
* ``--auto-tree 2,1,1``: the auto arm's chain with that tree shape (its draft-simple member's trees
  are one more option of the controller), reported against plain, the oracle and auto;
* ``--auto-ab explore_budget=0.02``: the auto arm again with one controller setting changed (an A/B
  of a default, its own controller and cost model); a numeric keyword of ``generate`` instead goes
  to its requests: ``p_min=0.75``, a draft confidence floor (the draft model stops drafting below it,
  as native's ``--draft-p-min``);
* native: ``llama-speculative-simple -m T -md D --spec-type draft-simple`` at its defaults (built like scripts/bench_native.py;
  ``--native off`` skips it, ``auto`` uses it only when it is built already).

Reported per prompt: decode t/s of each arm (median of its runs), auto / plain, auto / oracle
(the best fixed configuration of that prompt, or plain), auto / cross-fit (the best arm chosen on
one half of the passes and measured on the other: the maximum of 13 noisy medians is biased high),
auto / native, then the medians and minima, and the geometric mean of each ratio over the prompts
with its 95 % interval (t, over the prompts' log ratios): one run of an arm here varies by +-10 %,
so a single prompt's ratio of two medians of 2 runs is only good to about +-8 %; the mean over 24
prompts is good to about +-2 %. The
auto arm's controller keeps what it measured from prompt to prompt (as a server or chat session),
starting from a warm-up request outside the set (``--warmup-tokens``, temps 0 and 0.8: its cold turns,
a one-time cost of a process that scripts/cold_start.py measures);
ngram-mod's pool is reset before every run (``--keep-pools``: kept), so that no arm's second run of
a prompt drafts from its first run's output.

  python scripts/bench_auto.py                      # 12 prompts, 1.5B <- 0.5B, temps 0 and 0.8
  python scripts/bench_auto.py --quick              # smoke: SmolLM2-135M drafting for itself, 3 prompts
"""

from __future__ import annotations

import argparse
import inspect
import json
import math
import shlex
import statistics
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_native import run_native  # noqa: E402
from bench_spec import DEFAULT_DRAFTER, DEFAULT_TARGET, loadavg, machine_info, resolve, sampler, write_json  # noqa: E402

from llama_spec.env import parse_flag  # noqa: E402

HERE = Path(__file__).resolve().parent
FIXED_DRAFT = [f"draft-simple:{k}" for k in range(1, 6)]
FIXED_NGRAM = ["ngram-simple", "ngram-map-k", "ngram-mod"]
FIXED_CHAIN = ["ngram-simple,draft-simple", "ngram-mod,draft-simple"]
FIXED_TREE = ["tree:2,1,1", "tree:2,2,1"]
GOAL_PLAIN = 0.97   # issue 25 goal 1: auto >= 0.97 x plain on every prompt
WARMUP_PROMPT = "def fibonacci(n):"   # (not one of the prompts)


def prompts(n_per_class: int) -> list[tuple[str, str]]:
    base = json.loads((HERE / "prompts.json").read_text())
    edits = json.loads((HERE / "edit_prompts.json").read_text())["edit"]
    out = []
    for i in range(n_per_class):
        out += [("code", base["code"][i]), ("prose", base["prose"][i]),
                ("edit", f"<|im_start|>user\n{edits[i]}<|im_end|>\n<|im_start|>assistant\n")]
    return out


def ab_setting(gen, name: str, value: str) -> dict[str, float]:
    """One --auto-ab setting of gen: a numeric keyword of its requests (returned, for generate), else an
    attribute of its controller (set here, in the type of the attribute's default)."""
    param = inspect.signature(type(gen).stream).parameters.get(name)
    if param is not None and isinstance(param.default, (int, float)) and not isinstance(param.default, bool):
        return {name: type(param.default)(value)}
    default = getattr(gen.controller, name)
    if isinstance(default, bool):   # (bool("False") is True)
        flag = parse_flag(value)
        if flag is None:
            raise SystemExit(f"--auto-ab {name}={value}: expected a switch (1/0, true/false, on/off)")
        setattr(gen.controller, name, flag)
    else:
        setattr(gen.controller, name, type(default)(value))
    return {}


class Arms:
    """The models and one generator per arm (built once; the auto arm's controller persists)."""

    def __init__(self, a: argparse.Namespace) -> None:
        from llama_spec import DraftModelDrafter, Model, SpeculativeGenerator
        from llama_spec.drafters.chain import ChainDrafter
        from llama_spec.drafters.ngram import NgramModDrafter, build_ngram_drafter, parse_spec_types

        self.target_path, self.draft_path = resolve(a.target), resolve(a.drafter)
        self.target = Model(self.target_path)
        self.draft = Model(self.draft_path) if self.draft_path != self.target_path else self.target
        kw = dict(n_ctx=a.n_ctx, n_threads=a.threads)

        def member(t: str, n_max: int = 3):
            if t == "draft-simple":
                return DraftModelDrafter(self.draft, n_max=n_max, **kw)
            return build_ngram_drafter(t)

        def chain(spec: str, n_max: int = 3):
            ms = [member(t, n_max) for t in parse_spec_types(spec)]
            return ms[0] if len(ms) == 1 else ChainDrafter(ms, gate=True)

        def gen(d, n_max: int, **more):
            return SpeculativeGenerator(self.target, d, n_max=n_max, **kw, **more)

        self.gens = {"plain": gen(None, 1, auto=False), "auto": gen(chain(a.auto_spec, a.n_max), 64, auto=True)}
        if a.auto_tree:   # the same chain, its draft-simple member's trees one more option
            self.gens["auto tree"] = gen(chain(a.auto_spec, a.n_max), 64, auto=True, tree=a.auto_tree)
        self.request_kw: dict[str, dict[str, float]] = {}   # arm -> keywords of its requests
        for variant in a.auto_ab:   # one setting changed: "auto explore_budget=0.02", "auto p_min=0.75"
            name, value = variant.split("=")
            g = self.gens[f"auto {variant}"] = gen(chain(a.auto_spec, a.n_max), 64, auto=True)
            self.request_kw[f"auto {variant}"] = ab_setting(g, name, value)
        for name in a.fixed:
            if name.startswith("draft-simple:"):
                k = int(name.split(":")[1])
                self.gens[name] = gen(member("draft-simple", k), k, auto=False)
            elif name.startswith("tree:"):
                shape = tuple(int(x) for x in name.split(":")[1].split(","))
                self.gens[name] = gen(member("draft-simple", len(shape)), len(shape), auto=False, tree=shape)
            else:
                self.gens[name] = gen(chain(name), 64 if "ngram" in name else 3, auto=False)
        self.keep_pools = a.keep_pools
        self.last_stats = None   # the SpecStats of the latest run
        self.pools = {arm: [m.pool for m in g.drafter.members() if isinstance(m, NgramModDrafter)]
                      if g.drafter is not None else [] for arm, g in self.gens.items()}

    def run(self, arm: str, prompt: str, temp: float, n: int, seed: int) -> float:
        if not self.keep_pools:   # every run a request never seen (the second run would copy the first)
            for pool in self.pools[arm]:
                pool.reset()
        r = self.gens[arm].generate(prompt, sampling=sampler(temp), n_predict=n, seed=seed,
                                    **self.request_kw.get(arm, {}))
        self.last_stats = r.stats   # (what an auto arm chose in this run: run_prompt records it)
        return r.stats.decode_tps

    def close(self) -> None:
        for g in self.gens.values():
            g.close()
        if self.draft is not self.target:
            self.draft.close()
        self.target.close()


def native_tool(mode: str) -> Path | None:
    if mode == "off":
        return None
    import build_llama

    bin_dir = Path(build_llama.build_info()["build_dir"]) / "bin"
    tool = bin_dir / "llama-speculative-simple"
    if tool.exists():
        return tool
    if mode == "auto":
        print("# native llama-speculative-simple is not built: skipped (--native build builds it)", file=sys.stderr)
        return None
    return build_llama.build_tools(["llama-speculative-simple"]) / "llama-speculative-simple"


def cross_fit_best(runs: dict[str, list[float]]) -> tuple[float, list[str]]:
    """The best arm's speed without the maximum's bias: chosen on one pass, measured on the other.

    runs: arm -> t/s of each pass, in order (plain and the fixed arms); fold 0 is the even passes,
    fold 1 the odd ones (with 2 passes: the first and the second). The maximum
    of 13 noisy medians sits about one spread above the best arm's true speed when several arms do
    the same work (n-gram drafters that find nothing are plain); choosing by pass 1 and reading
    pass 2 (and the reverse) is unbiased for the arm chosen. Returns (mean of the two folds, the
    arms chosen)."""
    vals, chosen = [], []
    for f in (0, 1):
        arm = max(runs, key=lambda k: statistics.median(runs[k][f::2]))
        vals.append(statistics.median(runs[arm][1 - f::2]))
        chosen.append(arm)
    return statistics.fmean(vals), chosen


def run_prompt(arms: Arms, tool: Path | None, a: argparse.Namespace, cls: str, text: str, temp: float,
               seed: int) -> dict:
    order = list(arms.gens) + (["native"] if tool else [])
    runs: dict[str, list[float]] = {k: [] for k in order}
    chose: dict[str, list[str]] = {k: [] for k in order if k.startswith("auto")}   # per run, in order
    cmd = None
    if tool:
        cmd = [str(tool), "-m", str(arms.target_path), "-md", str(arms.draft_path), "-p", text, "-n", str(a.n_tokens),
               "--temp", str(temp), "--seed", str(seed), "-t", str(a.threads), "-c", str(a.n_ctx),
               "--spec-type", "draft-simple"]   # (the tool needs the type named; every other knob: its default)
    for arm in (order + order[::-1]) * (a.reps // 2):
        tps = run_native(cmd, text)["tps"] if arm == "native" and cmd else arms.run(arm, text, temp, a.n_tokens, seed)
        runs[arm].append(tps)
        if arm in chose:
            st = arms.last_stats
            ctl = getattr(arms.gens[arm], "controller", None)   # (and what it had measured by then)
            chose[arm].append(f"{tps:.1f} t/s: {st.auto_summary()}; kept {st.accepted}/{st.drafted}"
                              + (f" | {ctl.describe()}" if ctl is not None else ""))
    tps = {k: statistics.median(v) for k, v in runs.items()}
    fixed = {k: v for k, v in tps.items() if k not in ("plain", "native") and not k.startswith("auto")}
    oracle = max(fixed, key=lambda k: fixed[k]) if fixed else "plain"
    best_cv, chosen = cross_fit_best({k: v for k, v in runs.items() if k in fixed or k == "plain"})
    # per pass, auto / plain (the two ran next to each other): its geometric mean's 95 % interval
    paired = geo_mean_ci([x / y for x, y in zip(runs["auto"], runs["plain"], strict=True)])
    rec = {"class": cls, "temp": temp, "seed": seed, "tps": tps, "runs": runs, "chose": chose, "oracle": oracle,
           "auto_plain": tps["auto"] / tps["plain"], "auto_plain_paired": list(paired), "auto_oracle": tps["auto"] / max(tps[oracle], tps["plain"]),
           "oracle_cv": chosen, "best_cv": best_cv, "auto_oracle_cv": tps["auto"] / best_cv}
    if "native" in tps:
        rec["auto_native"] = tps["auto"] / tps["native"]
    for variant in a.auto_ab:   # auto / the variant (> 1: the default is faster)
        rec[f"auto_ab {variant}"] = tps["auto"] / tps[f"auto {variant}"]
    if "auto tree" in tps:
        rec["auto_tree_plain"] = tps["auto tree"] / tps["plain"]
        rec["auto_tree_oracle"] = tps["auto tree"] / max(tps[oracle], tps["plain"])
        rec["auto_tree_auto"] = tps["auto tree"] / tps["auto"]
    nat = f", /native {rec['auto_native']:.2f}" if "auto_native" in rec else ""
    if "auto tree" in tps:
        nat += (f"; auto tree {tps['auto tree']:6.1f}: /plain {rec['auto_tree_plain']:.2f}, "
                f"/oracle {rec['auto_tree_oracle']:.2f}, /auto {rec['auto_tree_auto']:.2f}")
    nat += "".join(f", /({v}) {rec[f'auto_ab {v}']:.2f}" for v in a.auto_ab)
    print(f"T={temp:<4} {cls:5}: plain {tps['plain']:6.1f}  auto {tps['auto']:6.1f}  oracle {oracle} "
          f"{tps[oracle]:6.1f} (cross-fit {'/'.join(chosen)} {best_cv:6.1f})   auto/plain {rec['auto_plain']:.2f} "
          f"(paired {paired[0]:.2f} [{paired[1]:.2f}..{paired[2]:.2f}]), "
          f"/oracle {rec['auto_oracle']:.2f}, /cross-fit {rec['auto_oracle_cv']:.2f}{nat}", flush=True)
    return rec


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", default=DEFAULT_TARGET)
    ap.add_argument("--drafter", default=DEFAULT_DRAFTER)
    ap.add_argument("--auto-spec", default="ngram-simple,ngram-mod,draft-simple", help="the auto arm's chain")
    ap.add_argument("--n-max", type=int, default=5, help="the auto arm's draft-simple cap")
    ap.add_argument("-n", "--n-tokens", type=int, default=128)
    ap.add_argument("--per-class", type=int, default=4, help="prompts per class (code, prose, edit)")
    ap.add_argument("--temps", default="0,0.8")
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("-c", "--n-ctx", type=int, default=2048)
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--native", choices=("auto", "build", "off"), default="build")
    ap.add_argument("--fixed", default=None, metavar="ARM[;ARM..]",
                    help="the fixed arms (default: the whole sweep), e.g. 'draft-simple:3;ngram-simple;tree:2,1,1'")
    ap.add_argument("--classes", default="code,prose,edit", help="prompt classes")
    ap.add_argument("--keep-pools", action="store_true",
                    help="keep ngram-mod's pool from run to run (default: reset before each run; each prompt "
                    "runs twice per arm, and a kept pool would hold the first run's output in the second)")
    ap.add_argument("--auto-tree", default=None, metavar="W1,W2,..",
                    help="also run the auto arm with this tree shape (e.g. 2,1,1): trees as a controller option")
    ap.add_argument("--auto-ab", default="", metavar="ATTR=VALUE[;..]",
                    help="extra auto arms, each with one controller setting changed (e.g. explore_budget=0.02)")
    ap.add_argument("--warmup-tokens", type=int, default=48,
                    help="the auto arms' warm-up request, at temp 0 and 0.8 (its cold turns; 8 for the rest)")
    ap.add_argument("--reps", type=int, default=2, help="runs of every arm per prompt (even: A..Z Z..A repeated)")
    ap.add_argument("--json", default=None, metavar="FILE")
    ap.add_argument("--quick", action="store_true", help="smoke: small models, 1 prompt per class, 32 tokens, "
                    "a few fixed arms, native only if built")
    a = ap.parse_args(argv)
    sweep = [*FIXED_DRAFT, *FIXED_NGRAM, *FIXED_CHAIN, *FIXED_TREE]
    if a.quick:
        a.target = a.drafter = "smollm2-135m" if a.target == DEFAULT_TARGET else a.target
        a.per_class, a.n_tokens, a.native = 1, 32, "auto" if a.native == "build" else a.native
        sweep = ["draft-simple:3", "ngram-simple", "ngram-simple,draft-simple", "tree:2,1,1"]
    a.fixed = [x for x in a.fixed.split(";") if x] if a.fixed is not None else sweep
    a.temp_list = [float(x) for x in a.temps.split(",")]
    a.auto_ab = [x for x in a.auto_ab.split(";") if x]
    a.auto_tree = tuple(int(x) for x in a.auto_tree.split(",")) if a.auto_tree else None
    if a.reps < 2 or a.reps % 2:
        ap.error("--reps: an even number >= 2")
    if a.warmup_tokens < 1:
        ap.error("--warmup-tokens: >= 1")
    return a


def geo_mean_ci(vals: list[float]) -> tuple[float, float, float]:
    """(geometric mean, its 95 % interval low, high) of positive ratios: t over their logs."""
    from scipy import stats

    logs = np.log(np.asarray(vals, dtype=np.float64))
    m = float(logs.mean())
    if len(logs) < 2:
        return math.exp(m), float("nan"), float("nan")
    half = float(stats.t.ppf(0.975, len(logs) - 1) * logs.std(ddof=1) / math.sqrt(len(logs)))
    return math.exp(m), math.exp(m - half), math.exp(m + half)


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    info = machine_info()
    print(f"# {info['cpu']}, {info['cores']} cores; {loadavg()}", file=sys.stderr)
    tool = native_tool(a.native)
    arms = Arms(a)
    print(f"# {arms.target_path.name} <- {arms.draft_path.name}; arms: {', '.join(arms.gens)}"
          f"{', native' if tool else ''}; {a.n_tokens} tokens, -t {a.threads}", file=sys.stderr)
    # warm-up (kernels, the first prefill; the auto arms' cold turns, greedy and sampled): a request
    # outside the set, so that the first prompt's runs do not pay the process's one-time costs
    for arm in arms.gens:
        for temp in ((0.0, 0.8) if arm.startswith("auto") else (0.0,)):
            arms.run(arm, WARMUP_PROMPT, temp, a.warmup_tokens if arm.startswith("auto") else 8, 1)
    from llama_spec.kernels.warmup import warm_up_in_background
    warm_up_in_background().join(60)   # numba's set-up, as the server does when it starts
    recs = []
    try:
        for temp in a.temp_list:
            for i, (cls, text) in enumerate(p for p in prompts(a.per_class) if p[0] in a.classes.split(",")):
                recs.append(run_prompt(arms, tool, a, cls, text, temp, a.seed + i))
        ctl = arms.gens["auto"].controller
        summary = ctl.describe() if ctl is not None else ""
        tree_ctl = arms.gens["auto tree"].controller if "auto tree" in arms.gens else None
        if tree_ctl is not None:
            summary += f"\n  auto tree: {tree_ctl.describe()}"
    finally:
        arms.close()
    out = {"machine": info, "args": {k: v for k, v in vars(a).items() if k != "temp_list"}, "prompts": recs}
    print("\nmedian / min over prompts:")
    for key in ("auto_plain", "auto_oracle", "auto_oracle_cv", "auto_native", *(f"auto_ab {v}" for v in a.auto_ab),
                "auto_tree_plain", "auto_tree_oracle", "auto_tree_auto"):
        vals = [r[key] for r in recs if key in r]
        if vals:
            g, lo, hi = geo_mean_ci(vals)
            out[key] = {"median": statistics.median(vals), "min": min(vals), "geomean": g, "ci95": [lo, hi]}
            label = ({"auto_oracle_cv": "auto / cross-fit best", "auto_tree_plain": "auto tree / plain",
                      "auto_tree_oracle": "auto tree / oracle", "auto_tree_auto": "auto tree / auto"}
                     .get(key, key.replace("_", " / "))
                     if not key.startswith("auto_ab ") else f"auto / auto {key[8:]}")
            print(f"  {label}: median {statistics.median(vals):.3f}, min {min(vals):.3f}, "
                  f"geometric mean {g:.3f} (95 % interval {lo:.3f} .. {hi:.3f})")
    below = [r for r in recs if r["auto_plain_paired"][2] < GOAL_PLAIN]
    under = [r for r in recs if r["auto_plain_paired"][0] < GOAL_PLAIN]
    out["goal_plain"] = {"goal": GOAL_PLAIN, "point_below": len(under), "interval_below": len(below)}
    print(f"  auto / plain per prompt, paired by pass: {len(under)} of {len(recs)} below {GOAL_PLAIN} "
          f"(geometric mean), {len(below)} with the whole 95 % interval below it")
    print(f"  {summary}")
    print(f"  (native: {'llama-speculative-simple defaults' if tool else 'not run'}; "
          f"command: {shlex.join(['llama-speculative-simple', '-m', 'T', '-md', 'D', '-p', 'PROMPT'])} ...)")
    write_json(a.json, out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
