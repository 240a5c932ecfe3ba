"""Exact-match vs rejection rule: throughput and acceptance per prompt class x temperature.

For one target/drafter pair (default Qwen2.5-Coder 1.5B <- 0.5B, draft-simple; ``--mtp`` for a
model's own MTP head, default the synthetic qwen35+MTP model), temperatures (default 0, 0.6,
0.8, 1.0), prompts of two classes (code, prose; scripts/prompts.json) and M tokens per request,
the two arms

  exact      spec_draft_sample=False  (llama.cpp's rule: argmax drafts, kept if equal)
  rejection  spec_draft_sample=True   (sampled drafts, kept with probability min(1, p/q))

run interleaved A B B A per prompt (seeds s, s, s+1, s+1), so drift of the machine's speed
cancels. Per class x temperature it reports decode t/s (median and min-max over runs),
acceptance rate, mean accepted length, the extra-acceptance counter, and the rejection/exact
throughput ratio (median of per-seed pairs, with its min-max band).

Temperature 0 is the control: both arms must emit identical tokens there (the harness checks it
and exits non-zero otherwise), and its throughput ratio is the noise floor: a gain at T > 0
counts only when the median ratio lies outside 1 ± (the control's largest deviation from 1) of
the same class.

Outputs: JSON (--json), a markdown table (--md, also printed), a PNG plot (--png; matplotlib,
Agg backend; skipped with a note when matplotlib is missing).

Run from the repository root:
  python scripts/bench_spec.py                      # the full measurement (~15 min on 2 cores)
  python scripts/bench_spec.py --mtp                # synthetic MTP model, draft-mtp
  python scripts/bench_spec.py --smoke              # tiny: synthetic MTP, 1 prompt/class, 16 tokens

This module also holds the helpers the other benchmark scripts import (machine info, prompts,
model names, medians).
"""

from __future__ import annotations

import argparse
import datetime as _dt
import hashlib
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PROMPTS_FILE = Path(__file__).resolve().parent / "prompts.json"
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))  # build_llama.py lives at the repository root

ARMS = ("exact", "rejection")
DEFAULT_TARGET = "qwen2.5-coder-1.5b"
DEFAULT_DRAFTER = "qwen2.5-coder-0.5b"
SYNTHETIC = "synthetic-mtp"


# ---------------------------------------------------------------------------------------------
# shared helpers (imported by bench_native.py, bench_bindings.py, ppl_parity.py, profile_spec.py)
# ---------------------------------------------------------------------------------------------

def loadavg() -> str:
    """The `uptime` line (load averages): the machine is shared, so every output records it."""
    try:
        return subprocess.run(["uptime"], capture_output=True, text=True, timeout=10).stdout.strip()
    except OSError:
        a, b, c = os.getloadavg()
        return f"load average: {a:.2f}, {b:.2f}, {c:.2f}"


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _git_commit() -> str | None:
    try:
        r = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True,
                           timeout=10)
        dirty = subprocess.run(["git", "status", "--porcelain"], cwd=REPO, capture_output=True, text=True,
                               timeout=10).stdout.strip()
        return r.stdout.strip() + ("+dirty" if dirty else "") if r.returncode == 0 else None
    except OSError:
        return None


def machine_info() -> dict:
    info = {
        "date": _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "host": platform.node(),
        "cpu": _cpu_model(),
        "cores": os.cpu_count(),
        "python": platform.python_version(),
        "git": _git_commit(),
        "uptime": loadavg(),
    }
    try:
        bi = json.loads((REPO / "llama_spec" / "_build_info.json").read_text())
        info["backend"] = bi.get("backend")
        info["llama_cpp_commit"] = bi.get("llama_cpp_commit")
    except (OSError, ValueError):
        pass
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20)
        if out.returncode == 0 and out.stdout.strip():
            info["gpu"] = out.stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        pass
    return info


def load_prompts(classes: list[str], n_per_class: int, path: Path = PROMPTS_FILE) -> list[tuple[str, int, str]]:
    """[(class, index, text)], the first n of each class, classes interleaved."""
    data = json.loads(Path(path).read_text())
    out = []
    for i in range(n_per_class):
        for c in classes:
            if c not in data:
                raise SystemExit(f"{path}: no prompt class {c!r} (have {[k for k in data if k != 'about']})")
            if i < len(data[c]):
                out.append((c, i, data[c][i]))
    return out


def resolve(name: str) -> Path:
    """A model path from a file path, a test-model name, or synthetic-mtp[:SIGMA]."""
    if name.startswith(SYNTHETIC):
        from llama_spec.testing.synthetic_mtp import synthetic_mtp_path

        sigma = float(name.split(":", 1)[1]) if ":" in name else 0.0
        return synthetic_mtp_path(sigma=sigma, seed=0)
    from llama_spec.testing.models import resolve_model

    return resolve_model(name, progress=False)


def summarize(values: list[float]) -> dict:
    v = sorted(values)
    if not v:
        return {"n": 0, "median": None, "min": None, "max": None}
    return {"n": len(v), "median": statistics.median(v), "min": v[0], "max": v[-1],
            "mean": statistics.fmean(v)}


def fmt_spread(s: dict, digits: int = 1) -> str:
    if not s or s.get("median") is None:
        return "n/a"
    return f"{s['median']:.{digits}f} [{s['min']:.{digits}f}–{s['max']:.{digits}f}]"


def tokens_digest(tokens) -> str:
    return hashlib.sha1(",".join(map(str, tokens)).encode()).hexdigest()[:12]


def write_json(path: str | None, obj: dict) -> None:
    if path:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(json.dumps(obj, indent=2) + "\n")
        print(f"wrote {path}", file=sys.stderr)


def write_text(path: str | None, text: str) -> None:
    if path:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(text)
        print(f"wrote {path}", file=sys.stderr)


def sampler(temp: float):
    """llama.cpp's default sampler knobs (top-k 40, top-p 0.95, min-p 0.05) at `temp`."""
    from llama_spec import SamplerParams

    return SamplerParams(temp=float(temp))


class Pair:
    """Target model + drafter (draft-simple or draft-mtp) + one SpeculativeGenerator."""

    def __init__(self, target: str, drafter: str | None, *, mtp: bool, n_ctx: int, n_threads: int,
                 n_max: int, repack: bool, n_gpu_layers: int = -1) -> None:
        from llama_spec import DraftModelDrafter, Model, MtpDrafter, SpeculativeGenerator

        self.target_path = resolve(target)
        self.mtp = mtp
        self.target = Model(self.target_path, repack=repack, load_mtp=mtp, n_gpu_layers=n_gpu_layers)
        self.draft_model = None
        if mtp:
            self.drafter_path = None
            self.drafter = MtpDrafter(self.target, n_ctx=n_ctx, n_threads=n_threads)
        elif drafter:
            self.drafter_path = resolve(drafter)
            self.draft_model = Model(self.drafter_path, repack=repack, n_gpu_layers=n_gpu_layers)
            self.drafter = DraftModelDrafter(self.draft_model, n_ctx=n_ctx, n_threads=n_threads)
        else:
            self.drafter_path = None
            self.drafter = None
        self.gen = SpeculativeGenerator(self.target, self.drafter, n_ctx=n_ctx, n_threads=n_threads, n_max=n_max)
        self.n_max = n_max

    @property
    def label(self) -> str:
        if self.mtp:
            return f"{self.target_path.name} (draft-mtp)"
        if self.drafter_path is None:
            return f"{self.target_path.name} (no drafter)"
        return f"{self.target_path.name} <- {self.drafter_path.name} (draft-simple)"

    def run(self, prompt: str, *, temp: float, arm: str, n_predict: int, seed: int, ignore_eos: bool = True,
            verify: str = "token"):
        """arm "exact" (the switch off) or "rejection" (with `verify`, the token or block rule)."""
        return self.gen.generate(prompt, sampling=sampler(temp), n_predict=n_predict, seed=seed,
                                 spec_draft_sample=(arm == "rejection"), verify=verify, n_max=self.n_max,
                                 ignore_eos=ignore_eos)

    def close(self) -> None:
        self.gen.close()
        self.target.close()
        if self.draft_model is not None:
            self.draft_model.close()


# ---------------------------------------------------------------------------------------------
# the benchmark
# ---------------------------------------------------------------------------------------------

def run_bench(args) -> dict:
    prompts = load_prompts(args.classes, args.n_prompts)
    pair = Pair(args.target, args.drafter, mtp=args.mtp, n_ctx=args.n_ctx, n_threads=args.threads,
                n_max=args.n_max, repack=args.repack, n_gpu_layers=args.n_gpu_layers)
    machine = machine_info()
    print(f"# {pair.label}, n-max {args.n_max}, {args.n_tokens} tokens, threads {args.threads}, "
          f"repack {'on' if args.repack else 'off'}; {machine['uptime']}", file=sys.stderr)
    # warm-up: numba cache load, page faults of the mmapped weights, both arms' code paths
    for arm in ARMS:
        pair.run(prompts[0][2], temp=0.8, arm=arm, n_predict=min(8, args.n_tokens), seed=1)
    # every prompt once, so that all measured runs take the same (prompt-cache) path: a first run
    # prefills the drafter with prompt + first token in one batch, later runs decode that token
    # alone, and with repacked weights the two round differently (different greedy drafts)
    for _, _, text in prompts:
        pair.run(text, temp=0.0, arm="exact", n_predict=2, seed=1)

    runs = []
    t_start = time.perf_counter()
    for temp in args.temps:
        for cls, idx, text in prompts:
            for r in range(args.rounds):
                s = args.seed + 2 * r
                order = [("exact", s), ("rejection", s), ("rejection", s + 1), ("exact", s + 1)]
                for slot, (arm, seed) in enumerate(order):
                    res = pair.run(text, temp=temp, arm=arm, n_predict=args.n_tokens, seed=seed, verify=args.verify)
                    st = res.stats
                    rec = {
                        "class": cls, "prompt": idx, "temp": temp, "arm": arm, "seed": seed, "round": r,
                        "slot": slot, "tps": st.decode_tps, "emitted": st.emitted, "t_decode_s": st.t_decode_s,
                        "verifications": st.verifications, "drafted": st.drafted, "accepted": st.accepted,
                        "recovered": st.recovered, "bonus": st.bonus, "extra_accepted": st.extra_accepted,
                        "exact_match_verifications": st.exact_match_verifications,
                        "fallback_positions": st.fallback_positions,
                        "tokens_sha1": tokens_digest(res.tokens), "stop_reason": res.stop_reason,
                    }
                    runs.append(rec)
                    print(f"  T={temp:<4} {cls:5} #{idx} {arm:9} seed {seed}: {st.decode_tps:6.2f} t/s, "
                          f"accept {st.accepted}/{st.drafted}, extra {st.extra_accepted}", file=sys.stderr)
    wall = time.perf_counter() - t_start
    pair_label = pair.label
    pair.close()

    # the control: temperature 0 emits identical tokens in both arms
    mismatches = []
    by_key = {(r["class"], r["prompt"], r["temp"], r["seed"], r["arm"]): r for r in runs}
    for (cls, idx, temp, seed, arm), r in by_key.items():
        if temp == 0 and arm == "exact":
            other = by_key[(cls, idx, temp, seed, "rejection")]
            if other["tokens_sha1"] != r["tokens_sha1"]:
                mismatches.append({"class": cls, "prompt": idx, "seed": seed,
                                   "exact": r["tokens_sha1"], "rejection": other["tokens_sha1"]})

    rows = summarize_runs(runs, args.classes, args.temps)
    machine["uptime_after"] = loadavg()
    return {
        "kind": "bench_spec", "smoke": bool(args.smoke),
        "config": {
            "pair": pair_label, "target": str(pair.target_path), "drafter": str(pair.drafter_path or ""),
            "mtp": args.mtp, "n_max": args.n_max, "verify": args.verify, "n_tokens": args.n_tokens, "temps": args.temps,
            "classes": args.classes, "n_prompts": args.n_prompts, "rounds": args.rounds,
            "threads": args.threads, "n_ctx": args.n_ctx, "repack": args.repack, "seed": args.seed,
            "sampler": "llama.cpp defaults: top-k 40, top-p 0.95, min-p 0.05 (temp 0: greedy)",
            "order": "per prompt: exact(s) rejection(s) rejection(s+1) exact(s+1)",
            "command": " ".join([Path(sys.executable).name, *sys.argv]),
        },
        "machine": machine, "wall_s": wall,
        "control_identical": not mismatches, "control_mismatches": mismatches,
        "rows": rows, "runs": runs,
    }


def _pair_ratios(runs: list[dict]) -> list[float]:
    """rejection/exact t/s for each (prompt, seed) pair."""
    ex = {(r["prompt"], r["seed"]): r["tps"] for r in runs if r["arm"] == "exact"}
    return [r["tps"] / ex[(r["prompt"], r["seed"])] for r in runs
            if r["arm"] == "rejection" and ex.get((r["prompt"], r["seed"]))]


def summarize_runs(runs: list[dict], classes: list[str], temps: list[float]) -> list[dict]:
    rows = []
    for cls in classes:
        control = None
        for temp in temps:
            sel = [r for r in runs if r["class"] == cls and r["temp"] == temp]
            if not sel:
                continue
            row = {"class": cls, "temp": temp}
            for arm in ARMS:
                a = [r for r in sel if r["arm"] == arm]
                drafted = sum(r["drafted"] for r in a)
                accepted = sum(r["accepted"] for r in a)
                ver = sum(r["verifications"] for r in a)
                row[arm] = {
                    "tps": summarize([r["tps"] for r in a]),
                    "acceptance_rate": accepted / drafted if drafted else 0.0,
                    "mean_accepted_length": accepted / ver if ver else 0.0,
                    "drafted": drafted, "accepted": accepted, "verifications": ver,
                    "extra_accepted": sum(r["extra_accepted"] for r in a),
                    "emitted": sum(r["emitted"] for r in a),
                    "tokens_per_verification": (sum(r["emitted"] for r in a) / ver) if ver else 0.0,
                }
            ratio = summarize(_pair_ratios(sel))
            row["ratio"] = ratio
            ex_len = row["exact"]["mean_accepted_length"]
            row["accepted_length_ratio"] = row["rejection"]["mean_accepted_length"] / ex_len if ex_len else None
            if temp == 0:
                control = ratio
                row["verdict"] = "control"
            elif control and control.get("median") is not None and ratio.get("median") is not None:
                # the arms are identical at T=0, so the true control ratio is 1: the band is the
                # control's largest deviation from 1, both ways
                d = max(abs(control["min"] - 1.0), abs(control["max"] - 1.0))
                lo, hi = 1.0 - d, 1.0 + d
                row["noise_band"] = [lo, hi]
                row["verdict"] = ("gain" if ratio["median"] > hi else
                                  "loss" if ratio["median"] < lo else "within noise")
            else:
                row["verdict"] = "no control"
            rows.append(row)
    return rows


def markdown(res: dict) -> str:
    c, m = res["config"], res["machine"]
    lines = [
        f"**{c['pair']}**, n-max {c['n_max']}, {c['n_tokens']} tokens/request, {c['n_prompts']} prompt(s) per "
        f"class × {2 * c['rounds']} runs per arm, threads {c['threads']}, repack {'on' if c['repack'] else 'off'}; "
        f"{m['cpu']} ({m['cores']} cores), {m['date']}; load: `{m['uptime']}` → `{m.get('uptime_after', '')}`",
        "",
        "| class | temp | exact t/s (median [min–max]) | rejection t/s | rejection ÷ exact t/s (median [min–max]) "
        "| accept rate exact → rej | mean accepted length exact → rej | extra accepted (rej) | verdict |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in res["rows"]:
        e, j = r["exact"], r["rejection"]
        ratio = r["ratio"]
        verdict = r["verdict"]
        if "noise_band" in r:
            verdict += f" (control band {r['noise_band'][0]:.3f}–{r['noise_band'][1]:.3f})"
        lines.append(
            f"| {r['class']} | {r['temp']:g} | {fmt_spread(e['tps'])} | {fmt_spread(j['tps'])} | "
            f"{fmt_spread(ratio, 3)} | {100 * e['acceptance_rate']:.1f} % → {100 * j['acceptance_rate']:.1f} % | "
            f"{e['mean_accepted_length']:.2f} → {j['mean_accepted_length']:.2f} | "
            f"{j['extra_accepted']} of {j['accepted']} | {verdict} |"
        )
    ok = "identical tokens in both arms" if res["control_identical"] else \
        f"**MISMATCH in {len(res['control_mismatches'])} pair(s)**"
    lines += ["", f"Control (temp 0): {ok}. Command: `{c['command']}`", ""]
    return "\n".join(lines)


def plot(res: dict, path: str) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: no plot", file=sys.stderr)
        return False
    classes = res["config"]["classes"]
    fig, axes = plt.subplots(2, len(classes), figsize=(5.5 * len(classes), 7), squeeze=False)
    for ci, cls in enumerate(classes):
        rows = [r for r in res["rows"] if r["class"] == cls]
        temps = [r["temp"] for r in rows]
        for arm, marker in (("exact", "o"), ("rejection", "s")):
            med = [r[arm]["tps"]["median"] for r in rows]
            lo = [r[arm]["tps"]["median"] - r[arm]["tps"]["min"] for r in rows]
            hi = [r[arm]["tps"]["max"] - r[arm]["tps"]["median"] for r in rows]
            axes[0][ci].errorbar(temps, med, yerr=[lo, hi], marker=marker, capsize=3, label=arm)
            axes[1][ci].plot(temps, [r[arm]["mean_accepted_length"] for r in rows], marker=marker, label=arm)
        axes[0][ci].set_title(f"{cls}: decode t/s (median, min–max)")
        axes[0][ci].set_xlabel("temperature")
        axes[0][ci].legend()
        axes[1][ci].set_title(f"{cls}: accepted draft tokens per verification")
        axes[1][ci].set_xlabel("temperature")
        axes[1][ci].set_ylim(0, res["config"]["n_max"])
        axes[1][ci].legend()
    fig.suptitle(f"{res['config']['pair']}, n-max {res['config']['n_max']} — {res['machine']['date']}", fontsize=9)
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    print(f"wrote {path}", file=sys.stderr)
    return True


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("--target", help=f"model path or test-model name (default {DEFAULT_TARGET}; "
                    f"with --mtp: {SYNTHETIC}[:SIGMA])")
    ap.add_argument("--drafter", default=DEFAULT_DRAFTER, help="draft model path or name (draft-simple)")
    ap.add_argument("--mtp", action="store_true", help="draft with the target's own MTP head (draft-mtp)")
    ap.add_argument("--temps", type=float, nargs="+", default=[0.0, 0.6, 0.8, 1.0])
    ap.add_argument("--classes", nargs="+", default=["code", "prose"])
    ap.add_argument("--n-prompts", type=int, default=3, help="prompts per class")
    ap.add_argument("--n-tokens", type=int, default=128, help="tokens per request")
    ap.add_argument("--rounds", type=int, default=1, help="A B B A blocks per prompt and temperature")
    ap.add_argument("--n-max", type=int, default=3)
    ap.add_argument("--verify", choices=["token", "block"], default="token", help="the rejection arm's rule")
    ap.add_argument("--threads", type=int, default=min(os.cpu_count() or 2, 8))
    ap.add_argument("--n-ctx", type=int, default=2048)
    ap.add_argument("--n-gpu-layers", type=int, default=-1)
    ap.add_argument("--no-repack", dest="repack", action="store_false",
                    help="llama.cpp's --no-repack (default: repack on, llama.cpp's default)")
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--json", default=None)
    ap.add_argument("--md", default=None)
    ap.add_argument("--png", default=None)
    ap.add_argument("--smoke", action="store_true",
                    help="tiny run: synthetic MTP model, 1 prompt per class, 16 tokens, temps 0 and 0.8")
    args = ap.parse_args(argv)
    if args.smoke:
        args.mtp = True
        args.n_prompts = 1
        args.n_tokens = 16
        args.temps = [0.0, 0.8]
        args.rounds = 1
    if args.target is None:
        args.target = SYNTHETIC if args.mtp else DEFAULT_TARGET
    if 0.0 not in args.temps:
        args.temps = [0.0, *args.temps]  # the control is not optional
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    res = run_bench(args)
    md = markdown(res)
    print(md)
    write_json(args.json, res)
    write_text(args.md, md)
    if args.png:
        res["png"] = args.png if plot(res, args.png) else None
    if not res["control_identical"]:
        print("CONTROL FAILED: at temperature 0 the exact-match and rejection arms emitted different tokens: "
              + json.dumps(res["control_mismatches"]), file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
