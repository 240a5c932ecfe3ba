#!/usr/bin/env python
"""Batched plain decoding: llama-spec's BatchGenerator against native ``llama-batched-bench`` (issue 13, 5).

Both decode B sequences of --n-tokens tokens after --n-prompt-token prompts, -t THREADS, for each B in
--seqs; reported: generated tokens / generation wall time (aggregate t/s; native: its S_TG column),
and ours/native. Ours runs generate_batch with ignore_eos (greedy, no drafter); its time excludes
the prefill (SpecStats.t_decode_s of the slowest sequence). Interleaved per B, --rounds times.

    nice -n 10 python scripts/bench_batch.py -m qwen2.5-coder-0.5b --seqs 1,2,4 --n-tokens 64
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def native_tg(binary: Path, model: Path, b: int, a: argparse.Namespace) -> float:
    """llama-batched-bench's S_TG t/s for B parallel sequences."""
    cmd = [str(binary), "-m", str(model), "-t", str(a.threads), "-c", str(b * (a.n_prompt_tokens + a.n_tokens) + 256),
           "-npp", str(a.n_prompt_tokens), "-ntg", str(a.n_tokens), "-npl", str(b), "--no-warmup" if a.no_warmup else ""]
    if a.no_repack:
        cmd.append("-nr")
    out = subprocess.run([c for c in cmd if c], capture_output=True, text=True, check=True, timeout=1800).stdout
    rows = [ln for ln in out.splitlines() if re.match(r"^\|\s*\d+\s*\|", ln)]
    if not rows:
        raise SystemExit(f"no result table in llama-batched-bench output:\n{out[-2000:]}")
    cols = [c.strip() for c in rows[-1].strip("|").split("|")]
    return float(cols[7])  # PP | TG | B | N_KV | T_PP s | S_PP t/s | T_TG s | S_TG t/s | T s | S t/s


def ours_tg(model, b: int, a: argparse.Namespace) -> float:
    from llama_spec import SamplerParams
    from llama_spec.generation.batch import BatchGenerator, GenerationRequest

    prompt = list(range(100, 100 + a.n_prompt_tokens))
    gen = BatchGenerator(model, None, n_parallel=b, n_ctx=a.n_prompt_tokens + a.n_tokens + 16, n_threads=a.threads)
    try:
        reqs = [GenerationRequest(prompt, sampling=SamplerParams(temp=0.0), n_predict=a.n_tokens, ignore_eos=True)
                for _ in range(b)]
        res = gen.generate_batch(reqs)
    finally:
        gen.close()
    return sum(len(r.tokens) - 1 for r in res) / max(r.stats.t_decode_s for r in res)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-m", "--model", default="qwen2.5-coder-0.5b")
    ap.add_argument("--seqs", default="1,2,4")
    ap.add_argument("--n-tokens", type=int, default=64)
    ap.add_argument("--n-prompt-tokens", type=int, default=32)
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--no-repack", action="store_true")
    ap.add_argument("--no-warmup", action="store_true")
    ap.add_argument("--skip-native", action="store_true")
    ap.add_argument("--json", default=None)
    a = ap.parse_args(argv)
    sys.path.insert(0, str(ROOT))
    from llama_spec import Model
    from llama_spec.models.registry import resolve_model

    path = resolve_model(a.model)
    binary = None
    if not a.skip_native:
        import build_llama

        binary = build_llama.build_tools(["llama-batched-bench"]) / "llama-batched-bench"
    model = Model(path, repack=not a.no_repack)
    seqs = [int(x) for x in a.seqs.split(",")]
    res: dict[str, dict[int, list[float]]] = {"ours": {b: [] for b in seqs}, "native": {b: [] for b in seqs}}
    for _ in range(a.rounds):
        for b in seqs:
            res["ours"][b].append(ours_tg(model, b, a))
            if binary is not None:
                res["native"][b].append(native_tg(binary, path, b, a))
    model.close()
    report = {}
    for b in seqs:
        o = statistics.median(res["ours"][b])
        n = statistics.median(res["native"][b]) if res["native"][b] else None
        report[b] = {"ours_tps": o, "native_tps": n, "ratio": (o / n) if n else None}
        print(f"B={b}: ours {o:6.1f} t/s" + (f"   native {n:6.1f} t/s   ours/native {o / n:.2f}" if n else ""))
    if a.json:
        Path(a.json).write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
