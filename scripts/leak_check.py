"""Resource check: create/free cycles of Model + Context + generator (with and without a
drafter) -> RSS growth and open file descriptors.

    python scripts/leak_check.py --cycles 1000 [--model PATH] [--warmup 10]

Each cycle loads the model, builds a generator (every other cycle with a draft-simple drafter on
its own context), generates a few tokens and frees everything. RSS is read from
/proc/self/status after ``--warmup`` cycles (allocator pools settle) and at the end; descriptors
from /proc/self/fd. Pass: RSS growth < 10 MB per 1000 cycles, descriptors back to baseline.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import time
from pathlib import Path


def rss_bytes() -> int:
    """RSS after glibc's malloc_trim(0): memory still in use, not what the allocator keeps cached
    (glibc's dynamic mmap threshold parks freed large buffers in the heap, which looks like growth)."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS")


def n_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def one_cycle(path: Path, with_drafter: bool) -> int:
    from llama_spec import Model, SamplerParams, SpeculativeGenerator
    from llama_spec.drafters.draft_model import DraftModelDrafter

    m = Model(path)
    d = None
    dm = Model(path) if with_drafter else None
    if dm is not None:
        d = DraftModelDrafter(dm, n_ctx=128, n_threads=1)
    g = SpeculativeGenerator(m, d, n_ctx=128, n_threads=1)
    n = len(g.generate("Hello", sampling=SamplerParams(temp=0), n_predict=3).tokens)
    g.close()
    if dm is not None:
        dm.close()
    m.close()
    return n


def check(cycles: int, path: Path, warmup: int = 10, log=print) -> dict:
    """Run warmup + cycles; returns RSS / fd figures."""
    for i in range(warmup):
        one_cycle(path, i % 2 == 1)
    gc.collect()
    rss0, fd0 = rss_bytes(), n_fds()
    t0 = time.perf_counter()
    for i in range(cycles):
        one_cycle(path, i % 2 == 1)
        if log and (i + 1) % 100 == 0:
            gc.collect()  # cyclic garbage (generators, streams) would otherwise show as growth here
            log(f"cycle {i + 1}: RSS {(rss_bytes() - rss0) / 2**20:+.2f} MiB, fds {n_fds() - fd0:+d}")
    gc.collect()
    rss1, fd1 = rss_bytes(), n_fds()
    return {"cycles": cycles, "warmup": warmup, "rss_start_mib": round(rss0 / 2**20, 2),
            "rss_growth_mib": round((rss1 - rss0) / 2**20, 3), "fds_start": fd0, "fds_end": fd1,
            "seconds": round(time.perf_counter() - t0, 1)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cycles", type=int, default=1000)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--model", type=Path, default=None, help="GGUF (default: the smollm2-135m test model)")
    ns = ap.parse_args()
    path = ns.model
    if path is None:
        from llama_spec.models.registry import resolve_model

        path = Path(resolve_model("smollm2-135m"))
    r = check(ns.cycles, path, ns.warmup)
    print(json.dumps(r, indent=1))
    ok = r["rss_growth_mib"] < 10 * ns.cycles / 1000 and r["fds_end"] == r["fds_start"]
    print("PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
