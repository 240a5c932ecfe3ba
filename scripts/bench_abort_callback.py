"""What the main thread's abort callback costs a one-token decode: Python at every graph node (the
callback before 2026-12-07), Python at most every 2 ms (lsp_abort_main's throttle, the default), and
the flag alone (what worker threads use; no Ctrl-C). One context, blocks of decodes of one token
interleaved A B C C B A .., the KV rolled back before each block so that every block decodes the same
positions; reported: each arm's median ms per decode and the paired differences against the flag.

  python scripts/bench_abort_callback.py                          # SmolLM2-135M (~8 ms decodes)
  python scripts/bench_abort_callback.py -m qwen2.5-coder-1.5b --blocks 40 --per-block 10
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_spec import loadavg, machine_info, resolve  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-m", "--model", default="smollm2-135m")
    ap.add_argument("--blocks", type=int, default=40, help="blocks per arm")
    ap.add_argument("--per-block", type=int, default=50, help="decodes per block")
    ap.add_argument("-t", "--threads", type=int, default=2)
    a = ap.parse_args(argv)
    from llama_spec import Context, Model
    from llama_spec._ffi import ffi, lib
    from llama_spec.llama import context

    info = machine_info()
    print(f"# {info['cpu']}, {info['cores']} cores; {loadavg()}", file=sys.stderr)
    model = Model(str(resolve(a.model)))
    ctx = Context(model, n_ctx=1024, n_threads=a.threads)
    toks = model.tokenize("def fibonacci(n):\n    ")
    ctx.decode(toks)
    main_abort = ffi.addressof(lib, "lsp_abort_main")
    arms = {"every node": (main_abort, 0), "every 2 ms": (main_abort, 2000), "flag only": (context._FLAG_ABORT, 0)}
    ms: dict[str, list[float]] = {arm: [] for arm in arms}
    order = list(arms)
    try:
        for b in range(a.blocks):
            for arm in order if b % 2 == 0 else order[::-1]:
                callback, period = arms[arm]
                lib.lsp_abort_set_python(context._abort_check, period)
                context._MAIN_ABORT = callback
                ctx._abort_main = None   # re-installed by the next decode
                ctx.seq_rm(0, len(toks), -1)
                t0 = time.perf_counter()
                for i in range(a.per_block):
                    ctx.decode([toks[-1]], [len(toks) + i])
                ms[arm].append(1e3 * (time.perf_counter() - t0) / a.per_block)
    finally:
        lib.lsp_abort_set_python(context._abort_check, context._ABORT_PERIOD_US)
        context._MAIN_ABORT = main_abort
        ctx.close()
    print(f"{Path(resolve(a.model)).name}, {a.threads} threads, {a.blocks} blocks x {a.per_block} decodes per arm")
    for arm, v in ms.items():
        line = f"  {arm:11}: median {statistics.median(v):7.3f} ms/decode"
        if arm != "flag only":
            d = sorted(x - y for x, y in zip(v, ms["flag only"], strict=True))
            q = len(d) // 4
            line += f"   - flag only: median {statistics.median(d):+.3f} ms (quartiles {d[q]:+.3f} .. {d[-q - 1]:+.3f})"
        print(line)
    print(f"# {info['cpu']}, {info['cores']} cores")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
