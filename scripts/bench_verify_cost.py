#!/usr/bin/env python3
"""What one verification costs: the target's decode time for a batch of n tokens, n = 1 .. 64.

Why: whether a drafter pays depends on c(n) / c(1) (the cost of verifying n - 1 drafts relative to
plain decoding). On a GPU c(n) is nearly flat; on a CPU it grows about linearly. The adaptive
draft length (llama_spec/draft_length.py) fits this line online; this script measures it offline.

Protocol: prefill --pos tokens of code, then for each n decode n tokens at that position with
every row's logits (as a verification does), roll back, and repeat --reps times, the sizes
interleaved; prints the median ms per size and its ratio to n = 1.

  python scripts/bench_verify_cost.py [--target qwen2.5-coder-1.5b] [--threads 2] [--reps 3]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_spec import DEFAULT_TARGET, machine_info, resolve  # noqa: E402

SIZES = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", default=DEFAULT_TARGET)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--pos", type=int, default=300)
    ap.add_argument("--no-repack", dest="repack", action="store_false")
    a = ap.parse_args(argv)
    from llama_spec import Model
    from llama_spec.llama.context import Context

    model = Model(resolve(a.target), repack=a.repack)
    ctx = Context(model, n_ctx=a.pos + max(SIZES) + 8, n_threads=a.threads, n_threads_batch=a.threads)
    toks = model.tokenize("def f(x):\n    return x * 2\n" * (a.pos // 4 + 40))
    ctx.prefill(toks[: a.pos])
    times: dict[int, list[float]] = {n: [] for n in SIZES}
    for _ in range(a.reps):
        for n in SIZES:
            batch = np.asarray(toks[a.pos : a.pos + n], dtype=np.int32)
            t0 = time.perf_counter()
            ctx.decode(batch, np.arange(a.pos, a.pos + n, dtype=np.int32), 0, "all")
            times[n].append(time.perf_counter() - t0)
            ctx.rollback(0, a.pos)
    print(f"# {machine_info().get('cpu', '')} threads {a.threads} repack {a.repack}")
    base = statistics.median(times[1])
    for n in SIZES:
        med = statistics.median(times[n])
        print(f"n = {n:2d}: {1000 * med:7.1f} ms  ({med / base:5.2f}x n = 1)  [{1000 * min(times[n]):.1f}-"
              f"{1000 * max(times[n]):.1f}]")
    ctx.close()
    model.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
