"""A long prompt and a short answer: does the controller pay the draft model's sync of the whole
prompt where the answer's saving cannot repay it? (issue 25, ``Plan._repays_sync``)

Every request is a prompt never seen by either model: a slice of about --chars characters of this
package's Python source ("continue this file"), asking for -n tokens, greedy. Arms, in the order
A B C C B A per rep: plain (no drafter), auto (the controller over draft-simple) and "auto blind"
(the same controller with the sync not weighed against the request's saving: the rule before it).
One code request first warms the controller (the model pays on code). Reported per arm: decode
t/s (first token to last: a draft model's sync of the prompt falls in it), the median and every
run, the prompt's length, and what the controller chose.

  python scripts/sync_check.py                     # 1.5B <- 0.5B, ~1,500-token prompts, 32 tokens, 3 reps
  python scripts/sync_check.py -n 512 --reps 1     # a long answer: the sync repays, the model is used
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_auto  # noqa: E402
from bench_spec import loadavg, machine_info  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent


def slices(chars: int, n: int) -> list[str]:
    """n distinct prompts of about `chars` characters of source code each."""
    text = "".join(p.read_text() for p in sorted((ROOT / "llama_spec").rglob("*.py")))
    step = max(chars, (len(text) - chars) // max(n, 1))
    out = [text[i * step: i * step + chars] for i in range(n)]
    if len(out[-1]) < chars:
        raise SystemExit(f"not enough source for {n} prompts of {chars} characters")
    return [f"Continue this Python file.\n```python\n{s}" for s in out]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", default=bench_auto.DEFAULT_TARGET)
    ap.add_argument("--drafter", default=bench_auto.DEFAULT_DRAFTER)
    ap.add_argument("--chars", type=int, default=5000)
    ap.add_argument("-n", "--n-tokens", type=int, default=32)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("-t", "--threads", type=int, default=2)
    a = ap.parse_args(argv)
    from llama_spec.generation import controller

    b = bench_auto.parse_args(["--fixed", "", "--native", "off", "--auto-spec", "draft-simple", "--target", a.target,
                               "--drafter", a.drafter, "-t", str(a.threads), "--n-ctx", "4096"])
    info = machine_info()
    print(f"# {info['cpu']}, {info['cores']} cores; {loadavg()}", file=sys.stderr)
    arms = bench_auto.Arms(b)
    rule = controller.Plan._repays_sync
    order = ["plain", "auto", "auto blind"]
    prompts = iter(slices(a.chars, 2 * len(order) * a.reps))
    runs: dict[str, list[float]] = {k: [] for k in order}
    try:
        warm = bench_auto.prompts(1)[0][1]
        r = arms.gens["auto"].generate(warm, sampling=bench_auto.sampler(0.0), n_predict=96)
        print(f"warm-up (code): {r.stats.decode_tps:.1f} t/s, auto chose {r.stats.auto_summary()}", flush=True)
        for rep in range(a.reps):
            for arm in order + order[::-1]:
                controller.Plan._repays_sync = (lambda self, m, best: True) if arm == "auto blind" else rule
                gen = arms.gens["plain" if arm == "plain" else "auto"]
                r = gen.generate(next(prompts), sampling=bench_auto.sampler(0.0), n_predict=a.n_tokens)
                runs[arm].append(r.stats.decode_tps)
                chose = "" if arm == "plain" else f", auto chose {r.stats.auto_summary()}"
                print(f"rep {rep} {arm:10} prompt {len(r.prompt_tokens)} tokens: {r.stats.decode_tps:5.2f} t/s{chose}",
                      flush=True)
    finally:
        controller.Plan._repays_sync = rule
        arms.close()
    plain = statistics.median(runs["plain"])
    print(f"\n# {a.n_tokens} tokens per request; median decode t/s (runs) and ÷ plain")
    for arm in order:
        med = statistics.median(runs[arm])
        print(f"{arm:10} {med:6.2f}  ({', '.join(f'{x:.2f}' for x in runs[arm])})  {med / plain:.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
