"""Perplexity parity: the rejection-rule switch does not touch numerics.

Three perplexities of one fixed text, n_ctx 512, K chunks, no weight repacking:

  on      a fresh process runs a speculative generation with spec_draft_sample=True, then
          llama_spec.generation.evaluation.perplexity(target, text, n_ctx=512) on the same loaded model
  off     the same with spec_draft_sample=False
  native  llama.cpp's `llama-perplexity -c 512 -b 512 --chunks K -nr`

They must agree to every printed digit (4 decimals, the tool's "Final estimate: PPL = x.xxxx").
The text: --text FILE, else /usr/share/common-licenses/GPL-3 (plain English, ~7,900 tokens),
else a deterministic generated text.

  python scripts/ppl_parity.py                    # Qwen2.5-Coder 1.5B (<- 0.5B for the generation), 4 chunks
  python scripts/ppl_parity.py --smoke            # SmolLM2-135M (drafting for itself), 2 chunks

The smoke size uses SmolLM2-135M rather than the synthetic MTP model: that random-weight model
scores a PPL of ~1e9 on English, where 4 decimals are 13 significant digits and numpy's float32
exp and glibc's expf (1 ulp apart) already differ in the 10th.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_spec import (  # noqa: E402
    DEFAULT_DRAFTER,
    DEFAULT_TARGET,
    SYNTHETIC,
    loadavg,
    machine_info,
    resolve,
    write_json,
    write_text,
)

DEFAULT_TEXT = Path("/usr/share/common-licenses/GPL-3")
_FINAL = re.compile(r"Final estimate: PPL = ([0-9.]+) \+/- ([0-9.]+)")


def fallback_text() -> str:
    import numpy as np

    words = ("the quick brown fox jumps over a lazy dog while the river runs to the sea and every "
             "morning the baker opens the shop before the town wakes up").split()
    rng = np.random.default_rng(1234)
    sents = []
    for _ in range(700):
        n = int(rng.integers(6, 14))
        sents.append(" ".join(words[int(i)] for i in rng.integers(0, len(words), n)).capitalize() + ".")
    return " ".join(sents)


def worker(args) -> int:
    """One process: a speculative generation with the switch on/off, then perplexity."""
    from bench_spec import Pair

    from llama_spec.generation.evaluation import perplexity

    text = Path(args.text).read_text()
    pair = Pair(args.target, args.drafter, mtp=args.mtp, n_ctx=2048, n_threads=args.threads, n_max=3,
                repack=False)
    sd = args.worker == "on"
    res = pair.run("The history of the printing press begins", temp=0.8, arm="rejection" if sd else "exact",
                   n_predict=32, seed=7)
    t0 = time.perf_counter()
    ppl = perplexity(pair.target, text, n_ctx=args.n_ctx, n_chunks=args.chunks, n_threads=args.threads)
    out = {"switch": args.worker, "spec_draft_sample": res.spec_draft_sample, "generated": res.stats.emitted,
           "drafted": res.stats.drafted, "accepted": res.stats.accepted, "extra_accepted": res.stats.extra_accepted,
           "ppl": ppl.ppl, "ppl_4": f"{ppl.ppl:.4f}", "chunk_ppl": ppl.chunk_ppl, "n_chunks": ppl.n_chunks,
           "n_tokens_scored": ppl.n_tokens_scored, "t_ppl_s": time.perf_counter() - t0}
    pair.close()
    print("RESULT " + json.dumps(out))
    return 0


def run_worker(args, switch: str, text_path: Path) -> dict:
    cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", switch, "--target", args.target,
           "--drafter", args.drafter, "--text", str(text_path), "--chunks", str(args.chunks),
           "--n-ctx", str(args.n_ctx), "--threads", str(args.threads)] + (["--mtp"] if args.mtp else [])
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    line = next((ln for ln in p.stdout.splitlines() if ln.startswith("RESULT ")), None)
    if p.returncode != 0 or line is None:
        raise RuntimeError(f"worker {switch} failed (exit {p.returncode}):\n{p.stderr[-3000:]}")
    return json.loads(line[len("RESULT "):])


def run_native(args, text_path: Path) -> dict:
    import build_llama

    bin_dir = Path(args.bin_dir) if args.bin_dir else build_llama.build_tools(["llama-perplexity"])
    cmd = [str(bin_dir / "llama-perplexity"), "-m", str(resolve(args.target)), "-f", str(text_path),
           "-c", str(args.n_ctx), "-b", str(args.n_ctx), "--chunks", str(args.chunks), "-t", str(args.threads), "-nr"]
    t0 = time.perf_counter()
    p = subprocess.run(cmd, capture_output=True, text=True, errors="replace", timeout=1800,
                       env=dict(os.environ, LLAMA_LOG_COLORS="0"))
    m = _FINAL.search(p.stdout + p.stderr)
    if p.returncode != 0 or not m:
        raise RuntimeError(f"llama-perplexity failed (exit {p.returncode}):\n{(p.stdout + p.stderr)[-3000:]}")
    chunks = [float(x) for x in re.findall(r"\[\d+\]([0-9.]+)", p.stdout + p.stderr)]
    return {"ppl_4": m.group(1), "pm": m.group(2), "chunk_ppl": chunks, "wall_s": time.perf_counter() - t0,
            "command": " ".join(cmd[:1] + ["-m", Path(cmd[2]).name, "-f", "TEXT"] + cmd[5:])}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("--target", default=None, help=f"default {DEFAULT_TARGET} ({SYNTHETIC} with --mtp)")
    ap.add_argument("--drafter", default=DEFAULT_DRAFTER)
    ap.add_argument("--mtp", action="store_true")
    ap.add_argument("--text", default=None)
    ap.add_argument("--chunks", type=int, default=4)
    ap.add_argument("--n-ctx", type=int, default=512)
    ap.add_argument("--threads", type=int, default=min(os.cpu_count() or 2, 8))
    ap.add_argument("--bin-dir", default=None)
    ap.add_argument("--json", default=None)
    ap.add_argument("--md", default=None)
    ap.add_argument("--smoke", action="store_true", help="SmolLM2-135M drafting for itself, 2 chunks")
    ap.add_argument("--worker", choices=["on", "off"], help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.smoke:
        args.target = args.target or "smollm2-135m"
        args.drafter, args.chunks = args.target, 2
    if args.target is None:
        args.target = SYNTHETIC if args.mtp else DEFAULT_TARGET
    if args.worker:
        return worker(args)

    machine = machine_info()
    with tempfile.TemporaryDirectory() as td:
        if args.text:
            text_path, source = Path(args.text), args.text
        elif DEFAULT_TEXT.is_file():
            text_path, source = DEFAULT_TEXT, str(DEFAULT_TEXT)
        else:
            text_path, source = Path(td) / "text.txt", "generated (ppl_parity.fallback_text)"
            text_path.write_text(fallback_text())
        t0 = time.perf_counter()
        on = run_worker(args, "on", text_path)
        off = run_worker(args, "off", text_path)
        native = run_native(args, text_path)
    identical = on["ppl_4"] == off["ppl_4"] == native["ppl_4"]
    machine["uptime_after"] = loadavg()
    res = {"kind": "ppl_parity", "smoke": bool(args.smoke), "machine": machine, "wall_s": time.perf_counter() - t0,
           "config": {"target": str(resolve(args.target)), "text": source, "n_ctx": args.n_ctx, "chunks": args.chunks,
                      "threads": args.threads, "repack": False,
                      "command": " ".join([Path(sys.executable).name, *sys.argv])},
           "on": on, "off": off, "native": native, "identical": identical}
    md = "\n".join([
        f"Perplexity of `{source}` ({on['n_tokens_scored']} tokens scored, n_ctx {args.n_ctx}, {on['n_chunks']} chunks), "
        f"`{Path(res['config']['target']).name}`, no repack; {machine['date']}, load `{machine['uptime']}`",
        "",
        "| run | PPL | per-chunk running estimate |",
        "|---|---|---|",
        f"| llama-spec, after a generation with spec_draft_sample **on** ({on['accepted']}/{on['drafted']} drafts kept) "
        f"| {on['ppl_4']} | {', '.join(f'{x:.4f}' for x in on['chunk_ppl'])} |",
        f"| llama-spec, after a generation with spec_draft_sample **off** ({off['accepted']}/{off['drafted']} kept) "
        f"| {off['ppl_4']} | {', '.join(f'{x:.4f}' for x in off['chunk_ppl'])} |",
        f"| native `llama-perplexity` | {native['ppl_4']} ± {native['pm']} | "
        f"{', '.join(f'{x:.4f}' for x in native['chunk_ppl'])} |",
        "",
        f"Identical to 4 decimals: **{'yes' if identical else 'NO'}**. Native: `{native['command']}`. "
        f"Command: `{res['config']['command']}`",
        "",
    ])
    print(md)
    write_json(args.json, res)
    write_text(args.md, md)
    if not identical:
        print("PARITY FAILED", file=sys.stderr)
        return 4
    return 0


if __name__ == "__main__":
    sys.exit(main())
