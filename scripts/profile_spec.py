"""Where the speculative loop's time goes, per step (one target verification batch).

Wraps, with perf_counter accumulators and a call stack (so every figure is *self* time, nothing
is counted twice), the calls the loop makes:

  target: llama.cpp decode      lsp_process on the target context (C, GIL released)
  target: Context.decode (Py)   the binding's Python around it (batch fill, checks, logits view)
  drafter: llama.cpp decode     lsp_process on the drafter's context (draft model / MTP head)
  drafter: Context.decode (Py)  the binding's Python around it
  drafter: mirror sampler       MirrorSampler.sample (llama.cpp truncation + numpy draw of q)
  drafter: draft() Python       the rest of drafter.draft()  (+ observe()/accepted() self time)
  sampler chain                 TargetSampler.candidates_and_sample / sample / accept
  kernel                        accept_step_kernel + p_is_normalized (numba)
  memory rollback               Context.rollback (seq_rm) on the target
  detokenize                    Model.token_to_piece (the loop's emit())
  Python glue                   the rest of SpeculativeGenerator.stream's loop body

Only the decode loop is measured (the prompt prefill and the first token are excluded). The
wrappers cost ~1 µs a call; that estimate (calibrated at start) is subtracted from the glue and
shown on its own line. A second, cProfile pass ranks the Python functions by own time to say
what the glue is made of.

  python scripts/profile_spec.py                 # 1.5B <- 0.5B, temps 0 and 0.8, both arms
  python scripts/profile_spec.py --mtp           # synthetic qwen35 + MTP head
  python scripts/profile_spec.py --smoke         # synthetic MTP, 1 prompt, 32 tokens
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import sys
import time
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_spec import (  # noqa: E402
    DEFAULT_DRAFTER,
    DEFAULT_TARGET,
    SYNTHETIC,
    Pair,
    load_prompts,
    loadavg,
    machine_info,
    write_json,
    write_text,
)

CATEGORIES = [
    "target: llama.cpp decode", "target: Context.decode (Py)",
    "drafter: llama.cpp decode", "drafter: Context.decode (Py)", "drafter: mirror sampler",
    "drafter: draft()/observe()/accepted() Python",
    "sampler chain", "kernel", "memory rollback", "detokenize", "Python glue",
]


class Profiler:
    """Self-time accumulators keyed by category, with a stack to subtract children."""

    def __init__(self) -> None:
        self.self_s: dict[str, float] = defaultdict(float)
        self.calls: dict[str, int] = defaultdict(int)
        self.stack: list[list] = []  # [category, t_start, child_time]
        self.active = False

    def reset(self) -> None:
        self.self_s.clear()
        self.calls.clear()

    def wrap(self, fn, category):
        pc = time.perf_counter
        stack = self.stack

        def wrapper(*a, **kw):
            if not self.active:
                return fn(*a, **kw)
            cat = category(a) if callable(category) else category
            frame = [cat, pc(), 0.0]
            stack.append(frame)
            try:
                return fn(*a, **kw)
            finally:
                dt = pc() - frame[1]
                stack.pop()
                self.self_s[cat] += dt - frame[2]
                self.calls[cat] += 1
                if stack:
                    stack[-1][2] += dt

        wrapper.__wrapped__ = fn
        return wrapper

    def calibrate(self, n: int = 200_000) -> float:
        """Seconds a wrapper adds per call (two nested wrappers minus the bare call)."""
        def noop():
            return None

        w = self.wrap(self.wrap(noop, "cal-inner"), "cal-outer")
        self.active = True
        t0 = time.perf_counter()
        for _ in range(n):
            w()
        t_w = time.perf_counter() - t0
        t0 = time.perf_counter()
        for _ in range(n):
            noop()
        t_b = time.perf_counter() - t0
        self.active = False
        self.reset()
        return max(0.0, (t_w - t_b) / (2 * n))


class _LibProxy:
    """Stands in for llama_spec.llama.context.lib: times lsp_process per context, passes the rest."""

    def __init__(self, real, prof: Profiler, role) -> None:
        object.__setattr__(self, "_real", real)
        object.__setattr__(self, "lsp_process", prof.wrap(real.lsp_process, role))

    def __getattr__(self, name):
        return getattr(self._real, name)


def instrument(pair: Pair, prof: Profiler) -> None:
    from llama_spec.kernels import token as acc
    from llama_spec.llama import context as ctxmod
    from llama_spec.llama import model as modelmod
    from llama_spec.llama import sampling as smod
    from llama_spec.rules import base as rules_base

    target_ctx = pair.gen.ctx

    def is_target(a) -> bool:
        return a[0] is target_ctx

    tgt_ptr = target_ctx.ptr
    ctxmod.lib = _LibProxy(ctxmod.lib, prof,
                           lambda a: "target: llama.cpp decode" if a[0] == tgt_ptr else "drafter: llama.cpp decode")
    C = ctxmod.Context
    C.decode = prof.wrap(C.decode, lambda a: "target: Context.decode (Py)" if is_target(a)
                         else "drafter: Context.decode (Py)")
    C.rollback = prof.wrap(C.rollback, lambda a: "memory rollback" if is_target(a) else
                           "drafter: draft()/observe()/accepted() Python")
    TS = smod.TargetSampler
    for name in ("candidates_and_sample", "sample", "accept", "candidates"):
        setattr(TS, name, prof.wrap(getattr(TS, name), "sampler chain"))
    # the rules' kernels are instance attributes (TokenRule.step_kernel, BlockRule.block_kernel)
    for rule in pair.gen.rules.values():
        for name in ("step_kernel", "block_kernel"):
            if hasattr(rule, name):
                setattr(rule, name, prof.wrap(getattr(rule, name), "kernel"))
    rules_base.p_is_normalized = prof.wrap(acc.p_is_normalized, "kernel")
    modelmod.Model.token_to_piece = prof.wrap(modelmod.Model.token_to_piece, "detokenize")
    d = pair.drafter
    if d is not None:
        d.mirror.sample = prof.wrap(d.mirror.sample, "drafter: mirror sampler")
        for name in ("draft", "observe", "accepted"):
            setattr(d, name, prof.wrap(getattr(d, name), "drafter: draft()/observe()/accepted() Python"))


def measure(pair: Pair, prof: Profiler, prompts, *, temp: float, arm: str, n_tokens: int, seed: int,
            overhead_s: float) -> dict:
    from bench_spec import sampler

    t_loop = 0.0
    steps = emitted = drafted = accepted = ver = 0
    prof.reset()
    for _, _, text in prompts:
        it = pair.gen.stream(text, sampling=sampler(temp), n_predict=n_tokens, seed=seed,
                             spec_draft_sample=(arm == "rejection"), n_max=pair.n_max, ignore_eos=True)
        next(it)  # prefill + first token: not measured
        n_before = prof.calls.get("target: llama.cpp decode", 0)
        prof.active = True
        t0 = time.perf_counter()
        for _ in it:
            pass
        t_loop += time.perf_counter() - t0
        prof.active = False
        steps += prof.calls.get("target: llama.cpp decode", 0) - n_before
        st = it.result.stats
        emitted += st.emitted - 1
        drafted += st.drafted
        accepted += st.accepted
        ver += st.verifications
    n_calls = sum(prof.calls.values())
    measured = sum(prof.self_s.values())
    overhead = n_calls * overhead_s
    cats = dict(prof.self_s)
    cats["Python glue"] = max(0.0, t_loop - measured - overhead)
    rows = {}
    for c in CATEGORIES:
        s = cats.get(c, 0.0)
        rows[c] = {"us_per_step": 1e6 * s / steps if steps else 0.0, "pct": 100 * s / t_loop if t_loop else 0.0,
                   "calls_per_step": prof.calls.get(c, 0) / steps if steps else 0.0}
    rows["(instrumentation, estimated)"] = {"us_per_step": 1e6 * overhead / steps if steps else 0.0,
                                             "pct": 100 * overhead / t_loop if t_loop else 0.0,
                                             "calls_per_step": n_calls / steps if steps else 0.0}
    python_cats = ["target: Context.decode (Py)", "drafter: Context.decode (Py)",
                   "drafter: draft()/observe()/accepted() Python", "detokenize", "Python glue"]
    return {"temp": temp, "arm": arm, "steps": steps, "t_loop_s": t_loop, "tokens": emitted,
            "tps": emitted / t_loop if t_loop else 0.0, "drafted": drafted, "accepted": accepted,
            "verifications": ver, "step_us": 1e6 * t_loop / steps if steps else 0.0, "categories": rows,
            "glue_pct": rows["Python glue"]["pct"],
            "python_pct": sum(rows[c]["pct"] for c in python_cats)}


def cprofile_top(pair: Pair, prompts, *, temp: float, arm: str, n_tokens: int, seed: int, top: int) -> list[dict]:
    from bench_spec import sampler

    pr = cProfile.Profile()
    steps = 0
    for _, _, text in prompts:
        it = pair.gen.stream(text, sampling=sampler(temp), n_predict=n_tokens, seed=seed,
                             spec_draft_sample=(arm == "rejection"), n_max=pair.n_max, ignore_eos=True)
        next(it)
        pr.enable()
        for _ in it:
            pass
        pr.disable()
        st = it.result.stats
        steps += st.verifications + (1 if st.verifications == 0 else 0)
    ps = pstats.Stats(pr)
    rows = []
    for (file, line, fn), (_cc, nc, tt, ct, _callers) in ps.stats.items():
        name = f"{Path(file).name}:{line}({fn})" if file != "~" else fn
        rows.append({"function": name, "calls_per_step": nc / steps, "own_us_per_step": 1e6 * tt / steps,
                     "cum_us_per_step": 1e6 * ct / steps})
    rows.sort(key=lambda r: -r["own_us_per_step"])
    return rows[:top]


def markdown(res: dict) -> str:
    m = res["machine"]
    out = [f"**{res['pair']}**, n-max {res['config']['n_max']}, {res['config']['n_tokens']} tokens × "
           f"{res['config']['n_prompts']} prompt(s), threads {res['config']['threads']}; {m['cpu']} ({m['cores']} "
           f"cores), {m['date']}; load `{m['uptime']}`", ""]
    confs = res["configs"]
    head = "| category | " + " | ".join(f"T={c['temp']:g} {c['arm']}: µs/step (%)" for c in confs) + " |"
    out += [head, "|---|" + "---|" * len(confs)]
    for cat in [*CATEGORIES, "(instrumentation, estimated)"]:
        cells = []
        for c in confs:
            r = c["categories"][cat]
            cells.append(f"{r['us_per_step']:,.0f} ({r['pct']:.1f} %)")
        out.append(f"| {cat} | " + " | ".join(cells) + " |")
    out.append("| **step (one verification)** | " + " | ".join(
        f"**{c['step_us']:,.0f}** µs, {c['tps']:.1f} t/s, accept {c['accepted']}/{c['drafted']}" for c in confs) + " |")
    out.append("| all Python (binding wrappers + drafter + detok + glue) | " + " | ".join(
        f"{c['python_pct']:.1f} %" for c in confs) + " |")
    out.append("")
    for c in confs:
        if c.get("cprofile_top"):
            out += [f"cProfile, T={c['temp']:g} {c['arm']}: top functions by own time (µs per step; cProfile "
                    "inflates Python calls, use for ranking only)", "",
                    "| function | calls/step | own µs/step | cum µs/step |", "|---|---|---|---|"]
            for r in c["cprofile_top"]:
                out.append(f"| `{r['function']}` | {r['calls_per_step']:.1f} | {r['own_us_per_step']:,.0f} | "
                           f"{r['cum_us_per_step']:,.0f} |")
            out.append("")
    out.append(f"Command: `{res['config']['command']}`")
    return "\n".join(out) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("--target", default=None, help=f"default {DEFAULT_TARGET} ({SYNTHETIC} with --mtp)")
    ap.add_argument("--drafter", default=DEFAULT_DRAFTER)
    ap.add_argument("--mtp", action="store_true")
    ap.add_argument("--temps", type=float, nargs="+", default=[0.0, 0.8])
    ap.add_argument("--arms", nargs="+", default=["exact", "rejection"])
    ap.add_argument("--n-prompts", type=int, default=1, help="prompts per class (code, prose)")
    ap.add_argument("--n-tokens", type=int, default=128)
    ap.add_argument("--n-max", type=int, default=3)
    ap.add_argument("--threads", type=int, default=min(os.cpu_count() or 2, 8))
    ap.add_argument("--n-gpu-layers", type=int, default=-1)
    ap.add_argument("--no-repack", dest="repack", action="store_false")
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--cprofile-top", type=int, default=12, help="0 = skip the cProfile pass")
    ap.add_argument("--json", default=None)
    ap.add_argument("--md", default=None)
    ap.add_argument("--smoke", action="store_true")
    args = ap.parse_args(argv)
    if args.smoke:
        args.mtp, args.n_tokens, args.temps, args.n_prompts, args.cprofile_top = True, 32, [0.8], 1, 5
    if args.target is None:
        args.target = SYNTHETIC if args.mtp else DEFAULT_TARGET
    classes = ["code", "prose"]
    prompts = load_prompts(classes, args.n_prompts)
    if args.smoke:
        prompts = prompts[:1]
    machine = machine_info()
    pair = Pair(args.target, args.drafter, mtp=args.mtp, n_ctx=2048, n_threads=args.threads, n_max=args.n_max,
                repack=args.repack, n_gpu_layers=args.n_gpu_layers)
    for arm in ("exact", "rejection"):  # warm-up before instrumenting
        pair.run(prompts[0][2], temp=0.8, arm=arm, n_predict=8, seed=1)
    prof = Profiler()
    overhead_s = prof.calibrate()
    configs = []
    for temp in args.temps:
        for arm in args.arms:
            if args.cprofile_top:  # before instrumenting: cProfile sees the plain code
                top = cprofile_top(pair, prompts, temp=temp, arm=arm, n_tokens=args.n_tokens, seed=args.seed,
                                   top=args.cprofile_top)
            configs.append({"temp": temp, "arm": arm, "cprofile_top": top if args.cprofile_top else []})
    instrument(pair, prof)
    for c in configs:
        c.update(measure(pair, prof, prompts, temp=c["temp"], arm=c["arm"], n_tokens=args.n_tokens, seed=args.seed,
                         overhead_s=overhead_s))
        print(f"  T={c['temp']:g} {c['arm']}: step {c['step_us']:,.0f} µs, glue {c['glue_pct']:.1f} %",
              file=sys.stderr)
    label = pair.label
    pair.close()
    machine["uptime_after"] = loadavg()
    res = {"kind": "profile_spec", "smoke": bool(args.smoke), "machine": machine, "pair": label,
           "wrapper_overhead_us": 1e6 * overhead_s,
           "config": {"target": args.target, "drafter": "" if args.mtp else args.drafter, "mtp": args.mtp,
                      "n_max": args.n_max, "n_tokens": args.n_tokens, "n_prompts": len(prompts),
                      "threads": args.threads, "repack": args.repack,
                      "command": " ".join([Path(sys.executable).name, *sys.argv])},
           "configs": configs,
           "max_glue_pct": max(c["glue_pct"] for c in configs)}
    md = markdown(res)
    print(md)
    write_json(args.json, res)
    write_text(args.md, md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
