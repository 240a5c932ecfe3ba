"""Public-API fuzz with Hypothesis: every call returns or raises ValueError / TypeError / a
LlamaSpecError naming the argument; the process never dies.

    python scripts/fuzz_api.py --n 10000 [--seed 0] [--model PATH]

Cases (SamplerParams, Model / Context / generator arguments, token ids, positions, prompts,
stop, n_predict, n_max, p_min, grammar text) are drawn by Hypothesis in this process and run in
a worker *subprocess* on a tiny llama model (scripts/fuzz_gguf.py writes it; ``--model`` for
another), so an abort (``std::bad_alloc``, ``GGML_ASSERT``) is caught, reported and the worker
restarted. A result other than success or an allowed exception is a finding.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

HERE = Path(__file__).resolve().parent

# -- values -----------------------------------------------------------------------------------
big_ints = st.one_of(st.integers(-3, 70), st.sampled_from([-(2**63), -(2**31), 2**31 - 1, 2**31, 2**32,
                                                           2**63 - 1, 2**64, 10**30]))
odd = st.one_of(st.none(), st.booleans(), st.text(max_size=4), st.floats(allow_nan=True, allow_infinity=True),
                st.lists(st.integers(0, 3), max_size=2))
ints = st.one_of(big_ints, odd)
floats = st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.floats(-2, 2), big_ints, odd)
surrogates = st.sampled_from(["\ud800", "a\udfffb", "\x00", "\x00\x00hello", "\U0010ffff", "\ufeff"])
texts = st.one_of(st.text(max_size=40), surrogates, st.just(""), st.just("x" * 100_000),
                  st.just("héllo wörld " * 3000), st.binary(max_size=20).map(lambda b: b.decode("latin-1")))
token_lists = st.lists(st.one_of(st.integers(-5, 310), big_ints), max_size=12)
prompts = st.one_of(texts, token_lists, odd)
grammars = st.one_of(st.none(), st.text(max_size=60), st.sampled_from([
    'root ::= "a"', 'root ::= [a-z]+', 'root ::= x', 'root ::= "a" | ', 'root ::= (("a")*)*',
    "root ::= [\\x00-\\xff]*", 'root ::= "\ud800"', "x ::= y\ny ::= x", "root ::= root", "root ::= ", "::="]))

SAMPLER_KEYS = {"temp": floats, "top_k": ints, "top_p": floats, "min_p": floats, "typical_p": floats,
                "top_n_sigma": floats, "min_keep": ints, "penalty_last_n": ints, "penalty_repeat": floats,
                "penalty_freq": floats, "penalty_present": floats, "dry_multiplier": floats,
                "dry_allowed_length": ints, "dry_penalty_last_n": ints, "xtc_probability": floats,
                "xtc_threshold": floats, "seed": ints, "grammar": grammars,
                "logit_bias": st.lists(st.tuples(st.integers(-3, 400), floats), max_size=2)}
sampler_kw = st.fixed_dictionaries({}, optional=SAMPLER_KEYS)

context_kw = st.fixed_dictionaries({}, optional={
    "n_ctx": ints, "n_batch": ints, "n_ubatch": ints, "n_threads": ints, "n_threads_batch": ints,
    "n_seq_max": ints, "n_rs_seq": ints, "flash_attn": st.one_of(st.sampled_from(["on", "off", "auto", "yes"]), odd),
    "type_k": st.one_of(st.sampled_from(["f16", "q8_0", "q4_0", "q3_k", "F16"]), odd),
    "type_v": st.one_of(st.sampled_from(["f16", "q8_0", "q4_0"]), odd)})

model_kw = st.fixed_dictionaries({}, optional={
    "n_gpu_layers": ints, "split_mode": st.one_of(st.sampled_from(["none", "layer", "row", "tensor", "bad"]), odd),
    "tensor_split": st.one_of(st.none(), st.lists(floats, max_size=3)), "main_gpu": ints,
    "load_mode": st.one_of(st.sampled_from(["auto", "none", "mmap", "mlock", "zzz"]), odd),
    "devices": st.one_of(st.none(), st.lists(st.text(max_size=5), max_size=2))})

gen_kw = st.fixed_dictionaries({}, optional={"n_ctx": ints, "n_batch": ints, "n_threads": ints, "n_max": ints})
request_kw = st.fixed_dictionaries({}, optional={
    "n_predict": ints, "seed": ints, "n_max": ints, "p_min": floats, "stop": st.one_of(st.lists(texts, max_size=3), odd),
    "verify": st.one_of(st.sampled_from(["token", "block", "exact-match", "tree", "nope"]), odd),
    "ignore_eos": st.one_of(st.booleans(), odd), "spec_draft_sample": st.one_of(st.booleans(), st.none())})

cases = st.one_of(
    st.fixed_dictionaries({"api": st.just("sampler"), "kw": sampler_kw, "prompt": st.just("ab")}),
    st.fixed_dictionaries({"api": st.just("context"), "kw": context_kw}),
    st.fixed_dictionaries({"api": st.just("model"), "kw": model_kw}),
    st.fixed_dictionaries({"api": st.just("generator"), "kw": gen_kw, "draft": st.booleans()}),
    st.fixed_dictionaries({"api": st.just("request"), "kw": request_kw, "prompt": prompts,
                           "sampling": sampler_kw, "draft": st.booleans()}),
    st.fixed_dictionaries({"api": st.just("decode"), "tokens": st.one_of(token_lists, odd),
                           "positions": st.one_of(st.none(), token_lists, odd), "seq_id": ints,
                           "outputs": st.one_of(st.sampled_from(["last", "all", "none"]), st.lists(st.booleans(), max_size=12), odd)}),
    st.fixed_dictionaries({"api": st.just("vocab"), "text": st.one_of(texts, odd), "tokens": st.one_of(token_lists, odd),
                           "token": ints}),
)

WORKER = r"""
import json, sys
import numpy as np
from llama_spec import Model, SamplerParams, SpeculativeGenerator
from llama_spec.llama.context import Context
from llama_spec.drafters.ngram import build_ngram_drafter
from llama_spec.errors import LlamaSpecError
MODEL = sys.argv[1]
model = Model(MODEL)
gen = SpeculativeGenerator(model, None, n_ctx=256, n_threads=1)
ctx = Context(model, n_ctx=64, n_batch=16, n_threads=1)

def small(kw, key, cap):
    v = kw.get(key)
    return v

def run(c):
    api = c["api"]
    if api == "sampler":
        sp = SamplerParams(**c["kw"])
        gen.generate("ab", sampling=sp, n_predict=3)
    elif api == "context":
        Context(model, **c["kw"]).close()
    elif api == "model":
        Model(MODEL, **c["kw"]).close()
    elif api == "generator":
        d = build_ngram_drafter("ngram-simple", size_n=1) if c["draft"] else None
        SpeculativeGenerator(model, d, **c["kw"]).close()
    elif api == "request":
        kw = dict(c["kw"])
        if isinstance(kw.get("n_predict"), int) and kw["n_predict"] > 16:
            kw["n_predict"] = 16   # keep the run short: large values are checked by the small ones' code path
        sp = SamplerParams(**c["sampling"])
        g = SpeculativeGenerator(model, build_ngram_drafter("ngram-simple", size_n=1), n_ctx=256, n_threads=1) if c["draft"] else gen
        try:
            g.generate(c["prompt"], sampling=sp, **kw)
        finally:
            if g is not gen:
                g.close()
    elif api == "decode":
        ctx.clear()
        ctx.decode(c["tokens"], c["positions"], c["seq_id"], c["outputs"])
    elif api == "vocab":
        model.tokenize(c["text"])
        model.detokenize(c["tokens"])
        model.token_to_piece(c["token"])

for line in sys.stdin:
    c = json.loads(line)
    try:
        run(c)
        res = "ok"
    except (ValueError, TypeError, LlamaSpecError) as e:
        res = "allowed:" + type(e).__name__ + ":" + str(e)[:300]
    except Exception as e:
        res = "other:" + type(e).__name__ + ":" + str(e)[:300]
    print("@@RES " + json.dumps(res), flush=True)
"""


class Worker:
    """The subprocess running cases; restarted after a crash or a hang."""

    def __init__(self, model: Path, timeout: float) -> None:
        self.model, self.timeout, self.p = model, timeout, None

    def run(self, case: dict) -> str:
        import selectors

        if self.p is None or self.p.poll() is not None:
            self.p = subprocess.Popen([sys.executable, "-c", WORKER, str(self.model)], stdin=subprocess.PIPE,
                                      stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        p = self.p
        try:
            p.stdin.write(json.dumps(case) + "\n")
            p.stdin.flush()
        except BrokenPipeError:
            self.p = None
            return "crash"
        sel = selectors.DefaultSelector()
        sel.register(p.stdout, selectors.EVENT_READ)
        deadline = time.monotonic() + self.timeout
        while True:
            if not sel.select(max(0.0, deadline - time.monotonic())):
                p.kill()
                p.wait()
                self.p = None
                return "hang"
            line = p.stdout.readline()
            if not line:
                rc = p.wait()
                self.p = None
                return f"crash(rc={rc})"
            if line.startswith("@@RES "):
                return json.loads(line[6:])

    def close(self) -> None:
        if self.p is not None:
            self.p.kill()
            self.p.wait()


def fuzz(n: int, seed: int = 0, model: Path | None = None, timeout: float = 60.0, log=print) -> dict:
    """Run n Hypothesis cases; returns counts and findings (crash, hang, other exceptions)."""
    with tempfile.TemporaryDirectory() as td:
        if model is None:
            sys.path.insert(0, str(HERE))
            from fuzz_gguf import write_tiny_llama

            model = write_tiny_llama(Path(td) / "tiny.gguf")
        w = Worker(model, timeout)
        counts: dict[str, int] = {}
        bad: list[dict] = []

        @settings(max_examples=n, database=None, deadline=None, derandomize=False, print_blob=False,
                  suppress_health_check=list(HealthCheck))
        @given(cases)
        def one(case: dict) -> None:
            res = w.run(case)
            key = res.split(":", 1)[0] if not res.startswith("crash") else "crash"
            counts[key] = counts.get(key, 0) + 1
            if key in ("crash", "hang", "other"):
                bad.append({"case": case, "result": res})
                log(f"{res}: {json.dumps(case)[:400]}")

        t0 = time.perf_counter()
        try:
            import random

            random.seed(seed)
            one()
        finally:
            w.close()
        return {"cases": sum(counts.values()), "counts": counts, "failures": bad,
                "seconds": round(time.perf_counter() - t0, 1)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=10000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--model", type=Path, default=None)
    ap.add_argument("--timeout", type=float, default=60.0)
    ns = ap.parse_args()
    os.environ.setdefault("LLAMA_SPEC_LOG", "0")
    r = fuzz(ns.n, ns.seed, ns.model, ns.timeout)
    print(json.dumps({k: v for k, v in r.items() if k != "failures"}, indent=1))
    c = r["counts"]
    print(f"cases {r['cases']}: crashes {c.get('crash', 0)}, hangs {c.get('hang', 0)}, other exceptions {c.get('other', 0)}")
    return 0 if not r["failures"] else 1


if __name__ == "__main__":
    sys.exit(main())
