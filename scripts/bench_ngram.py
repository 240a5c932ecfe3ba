#!/usr/bin/env python3
"""N-gram drafters on an edit-style task set: ours vs llama.cpp's tools vs llama-cpp-python.

Protocol (defaults): Qwen2.5-Coder 1.5B (target), 2 threads everywhere, temperature 0, 128
tokens, the prompts of scripts/edit_prompts.json: 6 edit-style prompts whose answer repeats the
input (type hints, a rename, a docstring translation, a bug fix, JSON reformatting, an answer
from a pasted passage) and 2 open-ended ones. Arms, per prompt in one interleaved block, forwards
then backwards (A B .. B A):

* ``plain``: ours without a drafter;
* ``ours:<type>``: ours with --spec-type ngram-simple / ngram-map-k / ngram-mod (llama.cpp's
  default knobs), and the chain ngram-mod,draft-simple (0.5B draft, n-max 3) with its gate
  (the CLI's default) and without it (``@nogate``); the gate learns across the run's prompts;
* ``native:<type>``: `llama-speculative-simple --spec-type <type>` built from the same source;
* ``lcpp:prompt-lookup``: llama-cpp-python 0.3.36's `LlamaPromptLookupDecoding` (num_pred_tokens
  10, its default) in the venv that ``scripts/bench_bindings.py`` creates (``--lcp-venv``, default
  /tmp/lcp-venv; it compiles llama-cpp-python's own llama.cpp, ~7 min), left out when missing;
  its t/s is timed from the first streamed token to the last.

Ours: SpecStats.decode_tps (end of the prompt to the last token); native: its "decoded N tokens"
line. Reported per set: median t/s, acceptance (kept / drafted), and per-prompt ratios to plain
and to the native tool of the same drafter (median [min-max]). Goals (issue 16), on the edit
set: >= 1.5x plain, >= 1.0x native of the same drafter, and the chain not slower than the better
of its parts by more than 5 % (ngram-mod and draft-simple alone; draft-simple is an extra arm).

  python scripts/bench_ngram.py --json /tmp/ngram.json --md /tmp/ngram.md
  python scripts/bench_ngram.py --arms plain ours:ngram-simple native:ngram-simple --n-tokens 32  # quick
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_native import native_bin, run_native, same_text  # noqa: E402
from bench_spec import (  # noqa: E402
    DEFAULT_DRAFTER,
    DEFAULT_TARGET,
    fmt_spread,
    loadavg,
    machine_info,
    resolve,
    summarize,
    write_json,
    write_text,
)

PROMPTS_FILE = Path(__file__).resolve().parent / "edit_prompts.json"
NGRAM_TYPES = ["ngram-simple", "ngram-map-k", "ngram-mod"]
DEFAULT_ARMS = (["plain"] + [f"ours:{t}" for t in NGRAM_TYPES]
                + ["ours:ngram-mod,draft-simple", "ours:ngram-mod,draft-simple@nogate", "ours:draft-simple"]
                + [f"native:{t}" for t in NGRAM_TYPES] + ["lcpp:prompt-lookup"])


class Ours:
    """One generator per arm over shared models (each keeps its drafter's state per request)."""

    def __init__(self, args) -> None:
        from llama_spec import Model

        self.args = args
        self.target = Model(resolve(args.target), repack=args.repack)
        self.draft = None
        self.gens: dict = {}

    def gen(self, arm: str):
        from llama_spec import DraftModelDrafter, Model, SpeculativeGenerator
        from llama_spec.drafters.chain import ChainDrafter
        from llama_spec.drafters.ngram import build_ngram_drafter

        if arm in self.gens:
            return self.gens[arm]
        a = self.args
        # "ours:<types>@nogate": the chain without its gate (CLI --no-spec-chain-gate);
        # "@adaptive": --spec-draft-adaptive (proposals cut to the best expected length)
        spec, _, flag = arm.partition("@")
        types = [] if arm == "plain" else spec.split(":", 1)[1].split(",")
        members = []
        for t in types:
            if t == "draft-simple":
                if self.draft is None:
                    self.draft = Model(resolve(a.drafter), repack=a.repack)
                members.append(DraftModelDrafter(self.draft, n_ctx=a.n_ctx, n_threads=a.threads, n_max=a.n_max))
            else:
                members.append(build_ngram_drafter(t))
        drafter = (None if not members else members[0] if len(members) == 1
                   else ChainDrafter(members, gate=flag != "nogate"))
        adaptive = flag == "adaptive"
        # the generator's cap is the largest member's draft length, as llama.cpp's common_speculative_n_max
        n_max = max([a.n_max] + [64 if t == "ngram-mod" else 48 for t in types if t.startswith("ngram")])
        g = SpeculativeGenerator(self.target, drafter, n_ctx=a.n_ctx, n_threads=a.threads, n_max=n_max,
                                 adaptive_draft=adaptive)
        self.gens[arm] = g
        return g

    def run(self, arm: str, prompt: str) -> dict:
        from llama_spec import SamplerParams

        g = self.gen(arm)
        # ngram-mod's pool outlives a request (by design, as in llama.cpp's server): without a reset
        # the second run of a prompt would draft from the first run's output, which the native tool
        # (a fresh process per run) cannot. Every run starts from the prompt alone.
        for d in getattr(g.drafter, "drafters", [g.drafter]):
            pool = getattr(d, "pool", None)
            if pool is not None:
                pool.reset()
        res = g.generate(prompt, sampling=SamplerParams(temp=self.args.temp), seed=self.args.seed,
                         n_predict=self.args.n_tokens)
        st = res.stats
        return {"tps": st.decode_tps, "emitted": st.emitted, "drafted": st.drafted, "accepted": st.accepted,
                "text": res.text}

    def close(self) -> None:
        for g in self.gens.values():
            g.close()
        self.target.close()
        if self.draft is not None:
            self.draft.close()


_LCP_RUN = r"""
import json, sys, time
from llama_cpp import Llama
from llama_cpp.llama_speculative import LlamaPromptLookupDecoding
a = json.loads(sys.argv[1])
llm = Llama(a["model"], n_ctx=a["n_ctx"], n_threads=a["threads"], n_threads_batch=a["threads"], seed=a["seed"],
            draft_model=LlamaPromptLookupDecoding(num_pred_tokens=10), verbose=False)
t_first, n, parts = None, 0, []
for chunk in llm.create_completion(a["prompt"], max_tokens=a["n"], temperature=a["temp"], stream=True):
    n += 1
    parts.append(chunk["choices"][0]["text"])
    if t_first is None:
        t_first = time.perf_counter()
t_end = time.perf_counter()
tps = (n - 1) / (t_end - t_first) if t_first is not None and n > 1 and t_end > t_first else 0.0
print(json.dumps({"tps": tps, "emitted": n, "text": "".join(parts)}))
"""


class LlamaCppPython:
    """llama-cpp-python 0.3.36's prompt lookup decoding (its only speculation), in the virtual
    environment scripts/bench_bindings.py creates (default /tmp/lcp-venv), one process per run;
    decode t/s from the first streamed token to the last."""

    def __init__(self, args) -> None:
        self.args = args
        self.python = Path(args.lcp_venv) / "bin" / "python"
        ok = self.python.exists() and subprocess.run([str(self.python), "-c", "import llama_cpp"],
                                                     capture_output=True, timeout=120).returncode == 0
        if not ok:
            raise FileNotFoundError(f"no llama-cpp-python venv at {args.lcp_venv} (python scripts/bench_bindings.py "
                                    "--smoke creates it, ~7 min)")

    def run(self, prompt: str) -> dict:
        a = self.args
        req = {"model": str(resolve(a.target)), "n_ctx": a.n_ctx, "threads": a.threads, "seed": a.seed,
               "prompt": prompt, "n": a.n_tokens, "temp": a.temp}
        p = subprocess.run([str(self.python), "-c", _LCP_RUN, json.dumps(req)], capture_output=True, text=True,
                           timeout=900)
        if p.returncode != 0:
            raise RuntimeError(f"llama-cpp-python run failed:\n{p.stderr[-3000:]}")
        r = json.loads(p.stdout.strip().splitlines()[-1])
        r.update(drafted=None, accepted=None)
        return r


def native_cmd(bin_dir: Path, args, spec_type: str, prompt: str) -> list[str]:
    cmd = [str(bin_dir / "llama-speculative-simple"), "-m", str(resolve(args.target)), "-p", prompt,
           "-n", str(args.n_tokens), "--temp", str(args.temp), "--seed", str(args.seed), "-t", str(args.threads),
           "-c", str(args.n_ctx), "--spec-type", spec_type]
    if not args.repack:
        cmd.append("-nr")
    return cmd


def bench(args) -> dict:
    data = json.loads(PROMPTS_FILE.read_text())
    sets = [("edit", i, p) for i, p in enumerate(data["edit"])] + [("open", i, p) for i, p in enumerate(data["open"])]
    if args.n_prompts:
        sets = [s for s in sets if s[1] < args.n_prompts]
    ours = Ours(args)
    lcpp = None
    arms = list(args.arms)
    if "lcpp:prompt-lookup" in arms:
        try:
            lcpp = LlamaCppPython(args)
        except FileNotFoundError as e:
            print(f"# {e}: arm lcpp:prompt-lookup left out", file=sys.stderr)
            arms.remove("lcpp:prompt-lookup")
    bin_dir = None
    if any(a.startswith("native:") for a in arms):
        bin_dir = native_bin()
    for arm in arms:  # warm-up: page faults, numba, every arm's code path
        if arm.startswith("ours:") or arm == "plain":
            ours.gen(arm).generate(sets[0][2], n_predict=4)
    runs = []
    for cls, idx, text in sets:
        for half, order in enumerate((arms, arms[::-1])):
            for arm in order:
                if arm.startswith("native:"):
                    r = run_native(native_cmd(bin_dir, args, arm.split(":", 1)[1], text), text)
                elif arm == "lcpp:prompt-lookup":
                    r = lcpp.run(text)
                else:
                    r = ours.run(arm, text)
                r.update({"set": cls, "prompt": idx, "arm": arm, "half": half})
                r["text"] = r["text"][:600]
                runs.append(r)
                print(f"  {cls} #{idx} {arm:28} {r['tps']:7.2f} t/s  {r['accepted']}/{r['drafted']}", file=sys.stderr)
        print(f"# {cls} #{idx} done ({loadavg()})", file=sys.stderr)
    from llama_spec.drafters.chain import ChainDrafter

    chains = {arm: g.drafter.stats_by_drafter() for arm, g in ours.gens.items()
              if isinstance(g.drafter, ChainDrafter)}
    for arm, st in chains.items():
        print(f"# {arm}: {json.dumps(st)}", file=sys.stderr)
    ours.close()
    return {"arms": arms, "rows": summarize_rows(runs, arms), "runs": runs, "chain_stats": chains}


def summarize_rows(runs: list[dict], arms: list[str]) -> list[dict]:
    rows = []
    for cls in ("edit", "open"):
        sel = [r for r in runs if r["set"] == cls]
        if not sel:
            continue
        med = {}
        for p in {r["prompt"] for r in sel}:
            for arm in arms:
                v = [r["tps"] for r in sel if r["prompt"] == p and r["arm"] == arm]
                if v:
                    med[(p, arm)] = statistics.median(v)
        for arm in arms:
            a = [r for r in sel if r["arm"] == arm]
            dr = sum(r["drafted"] or 0 for r in a)
            ac = sum(r["accepted"] or 0 for r in a)
            vs_plain = [med[(p, arm)] / med[(p, "plain")] for p in {r["prompt"] for r in a}
                        if (p, "plain") in med and med[(p, "plain")] > 0]
            row = {"set": cls, "arm": arm, "tps": summarize([r["tps"] for r in a]), "drafted": dr, "accepted": ac,
                   "acceptance": ac / dr if dr else None, "vs_plain": summarize(vs_plain)}
            kind = arm.split(":", 1)[1].partition("@")[0] if ":" in arm else None
            if arm.startswith("ours:") and f"native:{kind}" in arms:
                vs = [med[(p, arm)] / med[(p, f"native:{kind}")] for p in {r["prompt"] for r in a}
                      if (p, f"native:{kind}") in med and med[(p, f"native:{kind}")] > 0]
                row["vs_native"] = summarize(vs)
            parts = [f"ours:{t}" for t in (kind or "").partition("@")[0].split(",")] if kind and "," in kind else []
            if arm.startswith("ours:") and parts and all(p in arms for p in parts):
                vs = [med[(p, arm)] / max(med[(p, q)] for q in parts) for p in {r["prompt"] for r in a}
                      if all((p, q) in med for q in parts)]
                row["vs_best_part"] = summarize(vs)
            native_same = [same_text(r["text"], n["text"]) for r in a if arm.startswith("ours:")
                           for n in sel if n["arm"] == f"native:{kind}" and n["prompt"] == r["prompt"]
                           and n["half"] == r["half"]]
            if native_same:
                row["same_text_as_native"] = f"{sum(native_same)}/{len(native_same)}"
            rows.append(row)
    return rows


def markdown(res: dict) -> str:
    def spread(s):
        return fmt_spread(s, 2) if s and s.get("n") else "—"

    out = ["| set | arm | t/s median | kept / drafted | ÷ plain (per prompt) | ÷ native same drafter "
           "| chain ÷ better part | text = native |",
           "|---|---|---|---|---|---|---|---|"]
    for r in res["rows"]:
        acc = f"{r['accepted']}/{r['drafted']} ({100 * r['acceptance']:.0f} %)" if r["acceptance"] is not None else "—"
        out.append(f"| {r['set']} | {r['arm']} | {r['tps']['median']:.2f} | {acc} | {spread(r['vs_plain'])} | "
                   f"{spread(r.get('vs_native'))} | {spread(r.get('vs_best_part'))} | "
                   f"{r.get('same_text_as_native', '—')} |")
    return "\n".join(out)


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", default=DEFAULT_TARGET)
    ap.add_argument("--drafter", default=DEFAULT_DRAFTER)
    ap.add_argument("--arms", nargs="+", default=DEFAULT_ARMS)
    ap.add_argument("--n-tokens", type=int, default=128)
    ap.add_argument("--n-prompts", type=int, default=0, help="first N prompts of each set (0: all)")
    ap.add_argument("--n-max", type=int, default=3, help="draft-simple's draft length")
    ap.add_argument("--temp", type=float, default=0.0)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--n-ctx", type=int, default=2048)
    ap.add_argument("--no-repack", dest="repack", action="store_false")
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--lcp-venv", default=os.environ.get("LLAMA_SPEC_LCP_VENV", "/tmp/lcp-venv"))
    ap.add_argument("--json", default=None)
    ap.add_argument("--md", default=None)
    args = ap.parse_args(argv)
    for arm in args.arms:
        if not (arm in ("plain", "lcpp:prompt-lookup") or arm.startswith(("ours:", "native:"))):
            ap.error(f"unknown arm {arm!r}: plain, ours:TYPE[,TYPE][@nogate|@adaptive], native:TYPE or lcpp:prompt-lookup")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    machine = machine_info()
    t0 = time.perf_counter()
    res = bench(args)
    machine["uptime_after"] = loadavg()
    res.update(kind="bench_ngram", machine=machine, wall_s=time.perf_counter() - t0,
               config={k: v for k, v in vars(args).items() if k not in ("json", "md")})
    md = markdown(res)
    print(md)
    write_json(args.json, res)
    write_text(args.md, md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
