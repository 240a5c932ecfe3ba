#!/usr/bin/env python3
"""Block vs token rule: accepted length and throughput per temperature (llama.cpp PR #27694's protocol).

Protocol (defaults): 12 prompts (scripts/prompts.json: 6 code + 6 prose) x 256 tokens, n-max 3,
temperatures 0 and 0.1 ... 1.0 (T = 0 is the control: both rules must emit identical tokens, the
harness exits 2 otherwise), llama.cpp's default sampler knobs otherwise. Configurations: the real
pair Qwen2.5-Coder 1.5B <- 0.5B (draft-simple) and the synthetic qwen35+MTP model (draft-mtp) at
sigma 0.05 and 0.1 (``--configs real mtp:0.05 mtp:0.1``).

Per prompt the two arms run interleaved A B B A (token(s) block(s) block(s+1) token(s+1)): the
same prompts, the same seeds (so the drafter's RNG starts the same and the drafts agree up to the
first emitted difference), the same generator and models. Reported per configuration and
temperature:

* mean accepted length (kept drafts per verification) and tokens per verification (emitted per
  verification, incl. the recovered/bonus token), both rules, and block / token;
* decode t/s (median over runs) and the block / token ratio (median of per-seed pairs, min-max);
* ``paired``: the *expected* accepted length of both rules on exactly the same drafts and the same
  p and q — computed, not sampled, for every verification of an extra, untimed block-arm pass
  (an observer logs p and q; the token rule's expectation is sum_i prod_{j<=i} min(1, p_j/q_j),
  the block rule's comes from its stop probabilities h_i). No accept-decision noise: only the
  drafts vary. Given one draft path the block rule can expect fewer than the token rule; averaged
  over drafts sampled from q it never does (invariant 9). ``--no-paired`` skips the pass.

  python scripts/bench_rules.py                                  # the full protocol (hours on 2 cores)
  python scripts/bench_rules.py --configs mtp:0.05 mtp:0.1 --n-tokens 128 --temps 0 0.4 0.8 1.0
  python scripts/bench_rules.py --smoke                          # tiny: mtp:0.05, 2 prompts, 16 tokens
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_spec import (  # noqa: E402
    DEFAULT_DRAFTER,
    DEFAULT_TARGET,
    SYNTHETIC,
    Pair,
    load_prompts,
    loadavg,
    machine_info,
    sampler,
    summarize,
    tokens_digest,
    write_json,
    write_text,
)

from llama_spec.observe.observers import Observer  # noqa: E402

RULES = ("token", "block")
FULL_TEMPS = [0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0]


def expected_lengths(p_rows, q_rows, drafts) -> tuple[float, float]:
    """Exact E[n_accepted | drafts, p, q] of the token and the block rule (Sun et al. 2025).

    p_rows: k + 1 (ids, probs) supports (row i: p after d_1..d_i), q_rows: k (ids, probs).
    """
    k = len(drafts)
    ratio = np.empty(k)
    for i, d in enumerate(drafts):
        pi, pp = p_rows[i]
        qi, qp = q_rows[i]
        px = float(pp[pi == d].sum())
        qx = float(qp[qi == d].sum())
        ratio[i] = px / qx if qx > 0 else (np.inf if px > 0 else 0.0)
    e_token = float(np.cumprod(np.minimum(ratio, 1.0)).sum())
    r = np.empty(k + 1)
    r[0] = 1.0
    for i in range(k):
        r[i + 1] = min(r[i] * ratio[i], 1.0)
    h = np.zeros(k + 1)
    h[k] = r[k]
    for i in range(1, k):
        if r[i] >= 1.0:
            h[i] = 1.0
        elif r[i] > 0.0:
            pi, pp = p_rows[i]
            qi, qp = q_rows[i]
            qd = dict(zip(qi.tolist(), qp.tolist(), strict=True))
            qat = np.array([qd.get(t, 0.0) for t in pi.tolist()])
            rho = float(np.maximum(r[i] * pp - qat, 0.0).sum())
            h[i] = rho / (rho + 1.0 - r[i])
    e_block, survive = 0.0, 1.0
    for i in range(k, 0, -1):  # tau = the first i, going down from k, whose stop test succeeds
        e_block += i * survive * h[i]
        survive *= 1.0 - h[i]
    return e_token, e_block


class PairedExpectation(Observer):
    """For every block-rule verification: both rules' expected accepted length on its drafts."""

    wants_pq = True

    def __init__(self) -> None:
        self.n = 0
        self.e_token = 0.0
        self.e_block = 0.0
        self.block_below_token = 0  # verifications where block < token given these drafts (allowed)

    def on_verify(self, v) -> None:
        k = len(v.proposal)
        if k == 0 or v.rule != "block" or v.pq is None:
            return
        rows = {idx - v.emitted_index: (ids, probs) for idx, ids, probs, _, _ in v.pq}
        if len(rows) < k + 1 or v.proposal.q_ids is None or v.proposal.q_probs is None:
            return
        q_rows = list(zip(v.proposal.q_ids, v.proposal.q_probs, strict=True))
        et, eb = expected_lengths([rows[i] for i in range(k + 1)], q_rows, v.proposal.tokens)
        self.n += 1
        self.e_token += et
        self.e_block += eb
        self.block_below_token += int(eb < et - 1e-6)


def make_pair(config: str, args) -> Pair:
    if config == "real":
        return Pair(args.target, args.drafter, mtp=False, n_ctx=args.n_ctx, n_threads=args.threads,
                    n_max=args.n_max, repack=args.repack)
    sigma = config.split(":", 1)[1] if ":" in config else "0.05"
    return Pair(f"{SYNTHETIC}:{sigma}", None, mtp=True, n_ctx=args.n_ctx, n_threads=args.threads,
                n_max=args.n_max, repack=args.repack)


def run(pair: Pair, text: str, *, temp: float, rule: str, n: int, seed: int, observers=()):
    return pair.gen.generate(text, sampling=sampler(temp), n_predict=n, seed=seed, verify=rule,
                             n_max=pair.n_max, ignore_eos=True, observers=observers)


def bench_config(config: str, args, prompts) -> dict:
    pair = make_pair(config, args)
    label = pair.label
    for rule in RULES:  # warm-up: numba cache load, page faults, both rules' code paths
        run(pair, prompts[0][2], temp=0.8, rule=rule, n=min(8, args.n_tokens), seed=1)
    runs, paired = [], {}
    for temp in args.temps:
        pe = PairedExpectation()
        for cls, idx, text in prompts:
            for rnd in range(args.rounds):
                s = args.seed + 2 * rnd
                for slot, (rule, seed) in enumerate([("token", s), ("block", s), ("block", s + 1), ("token", s + 1)]):
                    res = run(pair, text, temp=temp, rule=rule, n=args.n_tokens, seed=seed)
                    st = res.stats
                    runs.append({"class": cls, "prompt": idx, "temp": temp, "rule": rule, "seed": seed, "slot": slot,
                                 "tps": st.decode_tps, "emitted": st.emitted, "verifications": st.verifications,
                                 "drafted": st.drafted, "accepted": st.accepted, "recovered": st.recovered,
                                 "bonus": st.bonus, "tokens_sha1": tokens_digest(res.tokens)})
                if args.paired and temp > 0:
                    run(pair, text, temp=temp, rule="block", n=args.n_tokens, seed=s, observers=[pe])
        paired[temp] = {"verifications": pe.n, "e_token": pe.e_token / pe.n if pe.n else None,
                        "e_block": pe.e_block / pe.n if pe.n else None, "block_below_token": pe.block_below_token}
        print(f"  {config} T={temp}: done ({loadavg()})", file=sys.stderr)
    pair.close()
    return {"config": config, "pair": label, "rows": summarize_rows(runs, args.temps, paired),
            "control": control(runs), "runs": runs}


def control(runs: list[dict]) -> list[dict]:
    """T = 0 runs whose two rules emitted different tokens (must be empty)."""
    by = {(r["prompt"], r["class"], r["seed"], r["rule"]): r["tokens_sha1"] for r in runs if r["temp"] == 0}
    return [{"class": c, "prompt": p, "seed": s} for (p, c, s, rule), h in by.items()
            if rule == "token" and by.get((p, c, s, "block")) != h]


def summarize_rows(runs: list[dict], temps: list[float], paired: dict) -> list[dict]:
    rows = []
    for temp in temps:
        row: dict = {"temp": temp, "paired": paired.get(temp)}
        for rule in RULES:
            a = [r for r in runs if r["temp"] == temp and r["rule"] == rule]
            ver = sum(r["verifications"] for r in a)
            acc = sum(r["accepted"] for r in a)
            out = acc + sum(r["recovered"] + r["bonus"] for r in a)
            row[rule] = {"mean_accepted_length": acc / ver if ver else 0.0,
                         "tokens_per_verification": out / ver if ver else 0.0,
                         "tps": summarize([r["tps"] for r in a]), "accepted": acc, "verifications": ver}
        tok = {(r["class"], r["prompt"], r["seed"]): r["tps"] for r in runs if r["temp"] == temp and r["rule"] == "token"}
        ratios = [r["tps"] / tok[(r["class"], r["prompt"], r["seed"])] for r in runs
                  if r["temp"] == temp and r["rule"] == "block" and tok.get((r["class"], r["prompt"], r["seed"]))]
        row["tps_ratio"] = summarize(ratios)
        t_len = row["token"]["mean_accepted_length"]
        row["length_ratio"] = row["block"]["mean_accepted_length"] / t_len if t_len else None
        rows.append(row)
    return rows


def markdown(res: dict) -> str:
    out = []
    for c in res["configs"]:
        out += [f"### {c['pair']} ({c['config']})", "",
                "| temp | mean accepted length token → block (÷) | tokens/verification token → block "
                "| t/s token → block | t/s block ÷ token, median [min–max] | paired E[accepted] token → block |",
                "|---|---|---|---|---|---|"]
        for r in c["rows"]:
            t, b, rt = r["token"], r["block"], r["tps_ratio"]
            lr = f"{r['length_ratio']:.3f}" if r["length_ratio"] else "n/a"
            p = r["paired"] or {}
            pe = (f"{p['e_token']:.3f} → {p['e_block']:.3f} ({p['verifications']} verif.)"
                  if p.get("e_token") is not None else "—")
            ratio = f"{rt['median']:.3f} [{rt['min']:.3f}–{rt['max']:.3f}]" if rt["n"] else "n/a"
            out.append(f"| {r['temp']:.1f} | {t['mean_accepted_length']:.3f} → {b['mean_accepted_length']:.3f} ({lr}) | "
                       f"{t['tokens_per_verification']:.3f} → {b['tokens_per_verification']:.3f} | "
                       f"{t['tps']['median']:.1f} → {b['tps']['median']:.1f} | {ratio} | {pe} |")
        out.append("")
    return "\n".join(out)


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--configs", nargs="+", default=["real", "mtp:0.05", "mtp:0.1"],
                    help="real (target <- drafter, draft-simple) and/or mtp:SIGMA (synthetic, draft-mtp)")
    ap.add_argument("--target", default=DEFAULT_TARGET)
    ap.add_argument("--drafter", default=DEFAULT_DRAFTER)
    ap.add_argument("--temps", type=float, nargs="+", default=FULL_TEMPS)
    ap.add_argument("--classes", nargs="+", default=["code", "prose"])
    ap.add_argument("--n-prompts", type=int, default=6, help="prompts per class (6 + 6 = the protocol's 12)")
    ap.add_argument("--n-tokens", type=int, default=256)
    ap.add_argument("--rounds", type=int, default=1, help="A B B A blocks per prompt and temperature")
    ap.add_argument("--n-max", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--n-ctx", type=int, default=2048)
    ap.add_argument("--no-repack", dest="repack", action="store_false")
    ap.add_argument("--no-paired", dest="paired", action="store_false", help="skip the untimed paired pass")
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--json", default=None)
    ap.add_argument("--md", default=None)
    ap.add_argument("--smoke", action="store_true", help="tiny: mtp:0.05, 1 prompt per class, 16 tokens, T 0 and 0.8")
    args = ap.parse_args(argv)
    if args.smoke:
        args.configs, args.n_prompts, args.n_tokens, args.temps, args.rounds = ["mtp:0.05"], 1, 16, [0.0, 0.8], 1
    if 0.0 not in args.temps:
        args.temps = [0.0, *args.temps]  # the control is not optional
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    prompts = load_prompts(args.classes, args.n_prompts)
    machine = machine_info()
    t0 = time.perf_counter()
    configs = [bench_config(c, args, prompts) for c in args.configs]
    machine["uptime_after"] = loadavg()
    res = {"kind": "bench_rules", "smoke": bool(args.smoke), "machine": machine, "wall_s": time.perf_counter() - t0,
           "config": {"configs": args.configs, "temps": args.temps, "n_prompts": len(prompts),
                      "n_tokens": args.n_tokens, "n_max": args.n_max, "rounds": args.rounds, "threads": args.threads,
                      "repack": args.repack, "seed": args.seed, "paired": args.paired,
                      "command": " ".join([Path(sys.executable).name, *sys.argv])},
           "configs": configs, "control_identical": all(not c["control"] for c in configs)}
    md = markdown(res)
    print(md)
    write_json(args.json, res)
    write_text(args.md, md)
    if not res["control_identical"]:
        print("CONTROL FAILED: at T = 0 the rules emitted different tokens: "
              + json.dumps([c["control"] for c in configs]), file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
