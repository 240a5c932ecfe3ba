"""What the speculation controller costs per step where plain decoding wins: plain vs auto on one
prompt, interleaved (A B B A ..), each step split into the time inside native decodes (target and
draft contexts) and the rest (Python: the plan, the n-gram members' lookups, the cost model).

The auto arm's extra "rest" per token is the controller's overhead; its extra "in decode" is what
exploration spent (a model member's drafts and syncs, longer verifications). Defaults: SmolLM2-135M
drafting for itself (a fast model: the overhead is a larger share of its step), a prose prompt from
scripts/prompts.json, temp 0.8 (both draft modes of the model member are arms).

  python scripts/controller_overhead.py                       # 135M, 8 runs per arm
  python scripts/controller_overhead.py --target qwen2.5-coder-1.5b --drafter qwen2.5-coder-0.5b
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


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", default="smollm2-135m")
    ap.add_argument("--drafter", default=None, help="default: the target")
    ap.add_argument("--temp", type=float, default=0.8)
    ap.add_argument("-n", "--n-tokens", type=int, default=128)
    ap.add_argument("--runs", type=int, default=8, help="runs per arm (interleaved)")
    ap.add_argument("-t", "--threads", type=int, default=2)
    a = ap.parse_args(argv)
    from llama_spec.llama import context

    spent = [0.0]
    decode = context.Context.decode

    def timed_decode(self: context.Context, *args: object, **kw: object) -> object:
        t0 = time.perf_counter()
        try:
            return decode(self, *args, **kw)   # type: ignore[arg-type]
        finally:
            spent[0] += time.perf_counter() - t0

    context.Context.decode = timed_decode   # type: ignore[method-assign]
    b = bench_auto.parse_args(["--fixed", "", "--native", "off", "--target", a.target,
                               "--drafter", a.drafter or a.target, "-t", str(a.threads)])
    info = machine_info()
    print(f"# {info['cpu']}, {info['cores']} cores; {loadavg()}", file=sys.stderr)
    arms = bench_auto.Arms(b)
    arms.run("auto", "def f(x):", 0.0, 8, 1)   # warm-up
    text = bench_auto.prompts(1)[1][1]
    out: dict[str, list[tuple[float, float, float]]] = {"plain": [], "auto": []}
    try:
        for i in range(a.runs):
            for arm in (("plain", "auto") if i % 2 == 0 else ("auto", "plain")):
                for pool in arms.pools[arm]:
                    pool.reset()
                spent[0] = 0.0
                r = arms.gens[arm].generate(text, sampling=bench_auto.sampler(a.temp), n_predict=a.n_tokens, seed=1)
                n = max(r.stats.emitted, 1)
                plain = r.stats.auto_plain / r.stats.auto_steps if r.stats.auto_steps else 1.0
                out[arm].append((1e3 * r.stats.t_decode_s / n, 1e3 * spent[0] / n, plain))
    finally:
        arms.close()
    print(f"{arms.target_path.name}, temp {a.temp}, {a.n_tokens} tokens, {a.runs} runs per arm; ms per token, median:")
    med = {arm: [statistics.median(x[j] for x in v) for j in range(3)] for arm, v in out.items()}
    for arm, (tot, dec, plain) in med.items():
        print(f"  {arm:6}: total {tot:7.3f}  in decodes {dec:7.3f}  rest {tot - dec:6.3f}   plain steps {100 * plain:5.1f} %")
    rest = [x[0] - x[1] for x in out["auto"]], [x[0] - x[1] for x in out["plain"]]
    print(f"  auto's extra rest (controller): {statistics.median(rest[0]) - statistics.median(rest[1]):.3f} ms/token; "
          f"auto / plain total {med['auto'][0] / med['plain'][0]:.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
