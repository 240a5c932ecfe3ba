"""Our Python loop vs llama.cpp's own `llama-speculative-simple`, same machine, same run.

For each prompt (scripts/prompts.json) and temperature, interleaved

  native, ours(exact), ours(rejection), ours(rejection), ours(exact), native

with the same pair, n-max, threads, context and seed. Native is llama.cpp's exact-match loop
(draft-simple with `-md`, or `--spec-type draft-mtp`); "ours(exact)" is the like-for-like arm
(spec_draft_sample=False), "ours(rejection)" the feature. Reported: decode t/s of each (the
native tool's "decoded N tokens in X s" line; ours: SpecStats.decode_tps, both timed from the
end of the prompt to the last token), acceptance, and ours ÷ native per prompt, then the median
over prompts. At temperature 0 the texts must be identical (ours is a prefix of native's: the
tool may emit up to n-max tokens past -n); with --no-repack on both sides (default) a mismatch
fails the run. At T > 0 ours(exact) uses the same seed as native: whether the texts agree is
reported, not required.

  python scripts/bench_native.py                        # 1.5B <- 0.5B, temps 0 and 0.8
  python scripts/bench_native.py --mtp                  # synthetic qwen35 + MTP, draft-mtp
  python scripts/bench_native.py --repack both          # also the repacked (default) kernels
  python scripts/bench_native.py --smoke                # synthetic MTP, 1 prompt/class, 32 tokens
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_spec import (  # noqa: E402
    DEFAULT_DRAFTER,
    DEFAULT_TARGET,
    SYNTHETIC,
    Pair,
    fmt_spread,
    load_prompts,
    loadavg,
    machine_info,
    summarize,
    write_json,
    write_text,
)

_DECODED = re.compile(r"decoded\s+(\d+)\s+tokens in\s+([\d.]+)\s+seconds, speed:\s+([\d.]+) t/s")
_DRAFTED = re.compile(r"n_drafted\s*=\s*(\d+)")
_ACCEPT = re.compile(r"n_accept\s*=\s*(\d+)")


def native_bin(tools=("llama-speculative-simple",)) -> Path:
    import build_llama

    return build_llama.build_tools(list(tools))


def native_cmd(bin_dir: Path, pair: Pair, prompt: str, *, temp: float, n_tokens: int, n_max: int, threads: int,
               n_ctx: int, seed: int, repack: bool, n_gpu_layers: int) -> list[str]:
    cmd = [str(bin_dir / "llama-speculative-simple"), "-m", str(pair.target_path), "-p", prompt,
           "-n", str(n_tokens), "--temp", str(temp), "--seed", str(seed), "--spec-draft-n-max", str(n_max),
           "-t", str(threads), "-c", str(n_ctx), "-ngl", str(n_gpu_layers if n_gpu_layers >= 0 else 999)]
    if pair.mtp:
        cmd += ["--spec-type", "draft-mtp"]
    else:
        cmd += ["--spec-type", "draft-simple", "-md", str(pair.drafter_path),
                "-ngld", str(n_gpu_layers if n_gpu_layers >= 0 else 999)]
    if not repack:
        cmd.append("-nr")
    return cmd


def run_native(cmd: list[str], prompt: str, timeout: int = 900) -> dict:
    env = dict(os.environ, LLAMA_LOG_COLORS="0")
    t0 = time.perf_counter()
    p = subprocess.run(cmd, capture_output=True, text=True, errors="replace", timeout=timeout, env=env)
    wall = time.perf_counter() - t0
    if p.returncode != 0:
        raise RuntimeError(f"native tool failed (exit {p.returncode}): {shlex.join(cmd)}\n{p.stderr[-3000:]}")
    m = _DECODED.search(p.stderr)
    if not m:
        raise RuntimeError(f"no 'decoded N tokens' line from the native tool:\n{p.stderr[-3000:]}")
    out = p.stdout
    i = out.find(prompt)
    gen = out[i + len(prompt):] if i >= 0 else out
    d, a = _DRAFTED.search(p.stderr), _ACCEPT.search(p.stderr)
    return {"tps": float(m.group(3)), "emitted": int(m.group(1)), "t_decode_s": float(m.group(2)),
            "drafted": int(d.group(1)) if d else None, "accepted": int(a.group(1)) if a else None,
            "text": gen, "wall_s": wall, "prompt_found": i >= 0}


def same_text(ours: str, native: str) -> bool:
    """Ours (n tokens) must be a prefix of native's (n .. n + n_max tokens)."""
    ours = ours.rstrip("\ufffd")  # a character cut at the end of our n tokens
    return len(ours) > 0 and native.startswith(ours)


def run_setting(args, repack: bool, bin_dir: Path, prompts) -> dict:
    pair = Pair(args.target, args.drafter, mtp=args.mtp, n_ctx=args.n_ctx, n_threads=args.threads,
                n_max=args.n_max, repack=repack, n_gpu_layers=args.n_gpu_layers)
    print(f"# {pair.label}, repack {'on' if repack else 'off'}; {loadavg()}", file=sys.stderr)
    for arm in ("exact", "rejection"):  # warm-up
        pair.run(prompts[0][2], temp=0.8, arm=arm, n_predict=8, seed=1, ignore_eos=False)
    kw = dict(n_tokens=args.n_tokens, n_max=args.n_max, threads=args.threads, n_ctx=args.n_ctx,
              repack=repack, n_gpu_layers=args.n_gpu_layers)
    per_prompt = []
    example_cmd = None
    for temp in args.temps:
        for cls, idx, text in prompts:
            seed = args.seed
            cmd = native_cmd(bin_dir, pair, text, temp=temp, seed=seed, **kw)
            example_cmd = example_cmd or shlex.join(cmd[:4] + ["PROMPT"] + cmd[5:])
            rec = {"class": cls, "prompt": idx, "temp": temp, "seed": seed,
                   "native": [], "exact": [], "rejection": []}
            for slot in ("native", "exact", "rejection", "rejection", "exact", "native"):
                if slot == "native":
                    r = run_native(cmd, text)
                else:
                    res = pair.run(text, temp=temp, arm=slot, n_predict=args.n_tokens, seed=seed, ignore_eos=False)
                    st = res.stats
                    r = {"tps": st.decode_tps, "emitted": st.emitted, "t_decode_s": st.t_decode_s,
                         "drafted": st.drafted, "accepted": st.accepted, "text": res.text}
                rec[slot].append(r)
                print(f"  T={temp:<4} {cls:5} #{idx} {slot:9}: {r['tps']:7.2f} t/s, {r['emitted']} tokens, "
                      f"accept {r['accepted']}/{r['drafted']}", file=sys.stderr)
            nat_text = rec["native"][0]["text"]
            rec["native_deterministic"] = rec["native"][0]["text"] == rec["native"][1]["text"]
            for arm in ("exact", "rejection"):
                rec[f"{arm}_same_text"] = all(same_text(r["text"], nat_text) for r in rec[arm])
                rec[f"{arm}_ratio"] = (statistics.median(r["tps"] for r in rec[arm])
                                       / statistics.median(r["tps"] for r in rec["native"]))
            for slot in ("native", "exact", "rejection"):
                for r in rec[slot]:
                    r["text"] = r["text"][:400]
            per_prompt.append(rec)
    pair.close()
    rows = []
    for temp in args.temps:
        for cls in [*args.classes, "all"]:
            sel = [r for r in per_prompt if r["temp"] == temp and (cls == "all" or r["class"] == cls)]
            if not sel:
                continue
            row = {"temp": temp, "class": cls, "n_prompts": len(sel)}
            for slot in ("native", "exact", "rejection"):
                row[f"{slot}_tps"] = summarize([x["tps"] for r in sel for x in r[slot]])
                dr = sum(x["drafted"] or 0 for r in sel for x in r[slot])
                ac = sum(x["accepted"] or 0 for r in sel for x in r[slot])
                row[f"{slot}_acceptance"] = ac / dr if dr else 0.0
            for arm in ("exact", "rejection"):
                row[f"{arm}_ratio"] = summarize([r[f"{arm}_ratio"] for r in sel])
                row[f"{arm}_same_text"] = sum(r[f"{arm}_same_text"] for r in sel)
            rows.append(row)
    return {"repack": repack, "pair": pair.label, "native_command": example_cmd, "rows": rows, "prompts": per_prompt}


def markdown(res: dict) -> str:
    c, m = res["config"], res["machine"]
    out = [f"Python loop vs native `llama-speculative-simple`, n-max {c['n_max']}, {c['n_tokens']} tokens, "
           f"threads {c['threads']}; {m['cpu']} ({m['cores']} cores), {m['date']}; load `{m['uptime']}` → "
           f"`{m.get('uptime_after', '')}`", ""]
    for s in res["settings"]:
        out += [f"**{s['pair']}**, repack {'on' if s['repack'] else 'off (-nr)'}; native: `{s['native_command']}`", "",
                "| temp | class | prompts | native t/s | ours exact t/s | ours rejection t/s | exact ÷ native "
                "(median over prompts [min–max]) | rejection ÷ native | accept native / exact / rej | "
                "same text as native (exact, rej) |",
                "|---|---|---|---|---|---|---|---|---|---|"]
        for r in s["rows"]:
            out.append(
                f"| {r['temp']:g} | {r['class']} | {r['n_prompts']} | {fmt_spread(r['native_tps'])} | "
                f"{fmt_spread(r['exact_tps'])} | {fmt_spread(r['rejection_tps'])} | "
                f"**{fmt_spread(r['exact_ratio'], 3)}** | {fmt_spread(r['rejection_ratio'], 3)} | "
                f"{100 * r['native_acceptance']:.0f} / {100 * r['exact_acceptance']:.0f} / "
                f"{100 * r['rejection_acceptance']:.0f} % | {r['exact_same_text']}/{r['n_prompts']}, "
                f"{r['rejection_same_text']}/{r['n_prompts']} |")
        out.append("")
    out.append(f"Command: `{c['command']}`")
    return "\n".join(out) + "\n"


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("--target", help=f"default {DEFAULT_TARGET}; with --mtp {SYNTHETIC}[:SIGMA]")
    ap.add_argument("--drafter", default=DEFAULT_DRAFTER)
    ap.add_argument("--mtp", action="store_true", help="draft-mtp with the target's own MTP head")
    ap.add_argument("--temps", type=float, nargs="+", default=[0.0, 0.8])
    ap.add_argument("--classes", nargs="+", default=["code", "prose"])
    ap.add_argument("--n-prompts", type=int, default=3, help="prompts per class")
    ap.add_argument("--n-tokens", type=int, default=128)
    ap.add_argument("--n-max", type=int, default=3)
    ap.add_argument("--threads", type=int, default=min(os.cpu_count() or 2, 8))
    ap.add_argument("--n-ctx", type=int, default=2048)
    ap.add_argument("--n-gpu-layers", type=int, default=-1)
    ap.add_argument("--repack", choices=["off", "on", "both"], default="off",
                    help="CPU weight repacking on both sides (off = -nr, needed for token identity)")
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--bin-dir", default=None, help="native tools folder (default: build them in the package's cache)")
    ap.add_argument("--json", default=None)
    ap.add_argument("--md", default=None)
    ap.add_argument("--smoke", action="store_true", help="synthetic MTP, 1 prompt per class, 32 tokens, temps 0 0.8")
    args = ap.parse_args(argv)
    if args.smoke:
        args.mtp, args.n_prompts, args.n_tokens, args.temps = True, 1, 32, [0.0, 0.8]
    if args.target is None:
        args.target = SYNTHETIC if args.mtp else DEFAULT_TARGET
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    bin_dir = Path(args.bin_dir) if args.bin_dir else native_bin()
    prompts = load_prompts(args.classes, args.n_prompts)
    machine = machine_info()
    t0 = time.perf_counter()
    settings = [run_setting(args, rp, bin_dir, prompts)
                for rp in {"off": [False], "on": [True], "both": [False, True]}[args.repack]]
    machine["uptime_after"] = loadavg()
    res = {"kind": "bench_native", "smoke": bool(args.smoke), "machine": machine, "wall_s": time.perf_counter() - t0,
           "config": {"target": args.target, "drafter": "" if args.mtp else args.drafter, "mtp": args.mtp,
                      "temps": args.temps, "classes": args.classes, "n_prompts": args.n_prompts,
                      "n_tokens": args.n_tokens, "n_max": args.n_max, "threads": args.threads,
                      "n_ctx": args.n_ctx, "seed": args.seed, "repack": args.repack,
                      "command": " ".join([Path(sys.executable).name, *sys.argv])},
           "settings": settings}
    # identity at temperature 0 (required where both sides run without repacking)
    bad = [(s["repack"], r["class"], r["prompt"], arm) for s in settings for r in s["prompts"]
           for arm in ("exact", "rejection") if r["temp"] == 0 and not r[f"{arm}_same_text"]]
    res["greedy_identity"] = {"checked": sum(1 for s in settings for r in s["prompts"] if r["temp"] == 0),
                              "mismatches": [list(b) for b in bad]}
    md = markdown(res)
    print(md)
    write_json(args.json, res)
    write_text(args.md, md)
    strict = [b for b in bad if not b[0]]
    if strict:
        print(f"IDENTITY FAILED at temperature 0 (no repack): {strict}", file=sys.stderr)
        return 3
    return 0


if __name__ == "__main__":
    sys.exit(main())
