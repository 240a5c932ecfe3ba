#!/usr/bin/env python
"""BatchGenerator with draft-simple: a draft context per slot vs one shared draft context (issue 13).

Arms, interleaved (A B C D, then D C B A per round), one process, C requests at once, 1.5B <- 0.5B,
temperature 0.8, ignore_eos: ``perslot`` (a lambda factory: each slot's drafter decodes alone),
``shared`` (DraftSimpleFactory, the default of ``llama-spec serve``), ``shared-observe`` (the same,
re-decoding each verification batch as llama.cpp's server does) and ``plain`` (no drafter).
Reports aggregate t/s per round, the medians and the acceptance.

    python scripts/bench_shared_draft.py --concurrency 4 --n-tokens 64 --rounds 2
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

from llama_spec.drafters.draft_batch import DraftSimpleFactory
from llama_spec.drafters.draft_model import DraftModelDrafter
from llama_spec.generation.batch import BatchGenerator, GenerationRequest
from llama_spec.llama.model import Model
from llama_spec.llama.sampling import SamplerParams
from llama_spec.models.registry import resolve_model

TOPICS = ("rivers", "bread", "owls", "tea", "maps", "bees", "glass", "chess")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-m", "--model", default="qwen2.5-coder-1.5b")
    ap.add_argument("-md", "--model-draft", default="qwen2.5-coder-0.5b")
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--n-tokens", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--ctx", type=int, default=1024)
    ap.add_argument("-t", "--threads", type=int, default=2)
    a = ap.parse_args(argv)
    tgt, dm = Model(str(resolve_model(a.model))), Model(str(resolve_model(a.model_draft)))
    c, kw = a.concurrency, dict(n_parallel=a.concurrency, n_ctx=a.ctx, n_threads=a.threads)
    shared = DraftSimpleFactory(dm, n_ctx=a.ctx, n_threads=a.threads)
    observing = DraftSimpleFactory(dm, n_ctx=a.ctx, n_threads=a.threads, observe_batches=True)
    gens = {"perslot": BatchGenerator(tgt, lambda: DraftModelDrafter(dm, n_ctx=a.ctx, n_threads=a.threads), **kw),
            "shared": BatchGenerator(tgt, shared, **kw), "shared-observe": BatchGenerator(tgt, observing, **kw),
            "plain": BatchGenerator(tgt, None, **kw)}
    prompts = [f"Write a short paragraph about {TOPICS[i % len(TOPICS)]}." for i in range(c)]
    tps: dict[str, list[float]] = {k: [] for k in gens}
    acc: dict[str, list[int]] = {k: [0, 0] for k in gens}
    for r in range(a.rounds):
        for name in list(gens) if r % 2 == 0 else list(reversed(gens)):
            reqs = [GenerationRequest(p, sampling=SamplerParams(temp=0.8), n_predict=a.n_tokens, seed=7 + i,
                                      ignore_eos=True) for i, p in enumerate(prompts)]
            t0 = time.perf_counter()
            out = gens[name].generate_batch(reqs)
            tps[name].append(sum(len(x.tokens) for x in out) / (time.perf_counter() - t0))
            acc[name][0] += sum(x.stats.accepted for x in out)
            acc[name][1] += sum(x.stats.drafted for x in out)
            print(f"round {r} {name:15s} {tps[name][-1]:6.2f} t/s", file=sys.stderr, flush=True)
    print(f"C={c}, {a.n_tokens} tokens each, {a.rounds} rounds")
    for name, v in tps.items():
        rate = f"{acc[name][0]}/{acc[name][1]} accepted" if acc[name][1] else "no drafts"
        print(f"{name:15s} median {statistics.median(v):6.2f} t/s [{min(v):.2f}-{max(v):.2f}]  {rate}")
    for g in gens.values():
        g.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
