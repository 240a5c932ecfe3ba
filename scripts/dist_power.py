#!/usr/bin/env python3
"""Exact power of the distribution test against the broken rule, per prompt, without sampling.

For a prompt, the joint law of the first two emitted tokens (t0, t1) is
    plain:   p0(t0) * p1(t1 | t0)
    broken:  p0(t0) * b1(t1 | t0),   b1 = min(p1, q1) + (1 - sum min(p1, q1)) * p1
(t0 is the target's own sample in both arms; t1 is the first token the verifier decides, with the
0.5B's mirrored q1). This script computes both laws from the models' logits, merges cells the
way tests/test_distribution.py does (expected pooled count < 10 -> "other"), and reports the
chi-square noncentrality lambda = N/2 * sum (b - p)^2 / pooled and the power at alpha = 5e-5.
It is how the suite's prompt and N were chosen.

    python scripts/dist_power.py --n 300 [--prompt "..."]...
"""

from __future__ import annotations

import argparse
import sys

import numpy as np

from llama_spec import Context, Model, SamplerParams
from llama_spec.drafters.mirror import MirrorSampler
from llama_spec.llama.sampling import TargetSampler
from llama_spec.testing.distribution import FirstTwoLaws, broken_rule_power
from llama_spec.testing.models import model_path

PROMPTS = [
    "Q: Name a programming language.\nA:",
    "Q: Name a country.\nA:",
    "Tell me a short story about a cat who",
    "The capital of France is",
    "def fibonacci(n):",
    "Question: What is 17 * 23?\nAnswer:",
    "import numpy as",
    "My favourite colour is",
    "The best programming language is",
    "Once upon a time",
    "1, 2, 3, 4,",
    "Q: Name a fruit.\nA:",
    "for i in range(",
    "The weather today is",
]
SAMPLING = SamplerParams(temp=1.0, top_k=40, top_p=1.0, min_p=0.0)
ALPHA = 5e-5


def laws(target: Model, draft: Model, prompt: str, mass: float = 0.999):
    tctx = Context(target, n_ctx=256, n_threads=2)
    dctx = Context(draft, n_ctx=256, n_threads=2)
    ts = TargetSampler(target, SAMPLING)
    ms = MirrorSampler(draft.n_vocab, draft)
    ms.configure(SAMPLING)
    toks = target.tokenize(prompt)
    row = tctx.prefill(toks)
    dctx.prefill(toks[:-1]) if len(toks) > 1 else None
    ids0, p0 = (a.copy() for a in ts.candidates(row))
    order = np.argsort(-p0)
    keep = order[: int(np.searchsorted(np.cumsum(p0[order]), mass)) + 1]
    laws = FirstTwoLaws()
    laws.p0 = dict(zip(ids0.tolist(), p0.tolist(), strict=True))
    n = len(toks)
    for j in keep:
        t0 = int(ids0[j])
        tctx.rollback(0, n)
        dctx.rollback(0, n - 1)
        r1 = tctx.decode([t0], [n], 0, "last")[0]
        ids1, p1 = (a.copy() for a in ts.candidates(r1))
        drow = dctx.decode([toks[-1], t0], [n - 1, n], 0, "last")[0]
        _tok, qi, qp, _a, _b = ms.sample(drow)
        laws.add(t0, ids1, p1, qi, qp)
    tctx.close()
    dctx.close()
    return laws


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=300, help="samples per arm")
    ap.add_argument("--prompt", action="append", help="prompt(s) to score (default: a built-in list)")
    ns = ap.parse_args()
    target = Model(model_path("qwen2.5-coder-1.5b"))
    draft = Model(model_path("qwen2.5-coder-0.5b"))
    print(f"{'power':>8} {'lambda':>8} {'cells':>5} {'accept':>6}  prompt  (N = {ns.n} per arm)")
    for prompt in ns.prompt or PROMPTS:
        prompt = prompt.encode().decode("unicode_escape")  # let the shell pass "\n"
        law = laws(target, draft, prompt)
        pw, lam, cells = broken_rule_power(law, ns.n, ALPHA)
        print(f"{pw:8.5f} {lam:8.1f} {cells:5d} {law.acceptance():6.3f}  {prompt!r}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
