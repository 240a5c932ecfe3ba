"""Benchmark the acceptance kernel (llama_spec.kernels.token): microseconds per call.

For support sizes 8, 64, 1,024 and 151,936 (q's support is min(size, 64), as the drafter's
top-k is clamped to [2, 64]; extra full-vocabulary rows: p's ids in vocabulary order, and q over
the full vocabulary too), on the accepted
path (draft = argmax p, p(x) >= q(x)) and the rejected path (p(x) = 0: rejected, recovered
token drawn from the residual), times:
  wrapper  accept_step(..., scratch, validate=False)  -- Python call + numba dispatch + kernel
  raw      accept_step_kernel(...)                     -- numba dispatch + kernel
  numpy    accept_step_reference(...)                  -- the same rule in plain numpy
each the median over repeats of (loop time / calls). Also the first call in a fresh process,
with an empty numba cache (compile) and with a warm one (cache load).
Block rule (llama_spec.kernels.block), k = 3 positions of such rows, support 64 and 151,936:
accept_block wrapper / raw accept_block_kernel / accept_block_reference, and the token rule's
accept_draft_kernel on the same rows, for drafts all accepted and drafts with p = 1e-3 q (the
block rule then looks at every position and almost always recovers at position 1).

Run from the repository root:  PYTHONPATH=. python scripts/bench_kernel.py [--json FILE]
--smoke runs a handful of calls (for tests/test_bench_kernel_smoke.py).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from llama_spec.kernels import block as B
from llama_spec.kernels import token as A
from llama_spec.kernels import tree as T
from llama_spec.kernels.tree_shape import build_tree
from llama_spec.testing import reference as R

N_VOCAB = 151_936
SIZES = (8, 64, 1_024, N_VOCAB)
REPO = Path(__file__).resolve().parent.parent


def _softmax(x):
    e = np.exp(x - x.max())
    return e / e.sum()


def make_case(n, q_full=False, id_order=False, seed=0):
    """p over n random ids (in random order, the worst case for the residual's gathers; or in
    vocabulary order, as llama.cpp lays out an untruncated candidate array), q over the top
    min(n, 64) of p (all of p when q_full) at temperature 1.5. Returns the arguments of the
    accepted call (draft = argmax p) and of the rejected call (draft with p = 0)."""
    rng = np.random.default_rng(seed)
    p_ids = rng.permutation(N_VOCAB)[:n].astype(np.int32)
    if id_order:
        p_ids.sort()
    p = _softmax(rng.normal(0.0, 2.0, n))
    order = np.argsort(-p)
    top = order if q_full else order[: min(n, 64)]
    q_ids = p_ids[top].copy()
    q = _softmax(np.log(p[top]) / 1.5)
    if n >= 2 and q[0] > p[top[0]]:  # argmax p must have p(x) >= q(x): accepted, no draw
        q[1:] += (q[0] - p[top[0]]) * q[1:] / q[1:].sum()
        q[0] = p[top[0]]
    q = q.astype(np.float32)
    p_acc = _middle(p_ids, p.astype(np.float32), order[0], id_order)
    accepted = (*p_acc, int(p_ids[order[0]]), q_ids, q)
    d = top[1 if n >= 2 else 0]
    p_rej = p.copy()
    p_rej[d] = 0.0  # the draft gets p = 0: always rejected
    if not p_rej.any():
        p_rej[:] = 1.0
    p_rej = _middle(p_ids, (p_rej / p_rej.sum()).astype(np.float32), d, id_order)
    rejected = (*p_rej, int(p_ids[d]), q_ids, q)
    return accepted, rejected


def _middle(ids, probs, i, keep_order):
    """Copies of (ids, probs) with entry i moved to the middle of the support: the kernel scans
    p for the draft, so the draft's position matters (the middle is the random-order average)."""
    ids, probs = ids.copy(), probs.copy()
    if not keep_order:
        m = ids.shape[0] // 2
        ids[[i, m]] = ids[[m, i]]
        probs[[i, m]] = probs[[m, i]]
    return ids, probs


def per_call_us(loop, repeats, min_time):
    """Median over repeats of the per-call time of loop(n_calls), n_calls sized to min_time."""
    n_calls, t = 1, 0.0
    while True:  # grow the batch until one batch takes min_time (also warms up)
        t0 = time.perf_counter()
        loop(n_calls)
        t = time.perf_counter() - t0
        if t >= min_time or n_calls >= 1 << 20:
            break
        n_calls *= 4
    samples = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        loop(n_calls)
        samples.append((time.perf_counter() - t0) / n_calls * 1e6)
    return statistics.median(samples)


def bench_call(args, scratch, repeats, min_time):
    p_ids, p, draft, q_ids, q = args
    state = A.new_rng_state(0)
    step, kernel, ref = A.accept_step, A.accept_step_kernel, R.accept_step_reference
    expect = kernel(p_ids, p, draft, q_ids, q, state, scratch)[1]

    def wrapper_loop(n):
        for _ in range(n):
            step(p_ids, p, draft, q_ids, q, state, scratch, validate=False)

    def raw_loop(n):
        for _ in range(n):
            kernel(p_ids, p, draft, q_ids, q, state, scratch)

    def numpy_loop(n):
        for _ in range(n):
            ref(p_ids, p, draft, q_ids, q, state, scratch)

    return bool(expect), {
        "wrapper_us": per_call_us(wrapper_loop, repeats, min_time),
        "raw_us": per_call_us(raw_loop, repeats, min_time),
        "numpy_us": per_call_us(numpy_loop, repeats, min_time),
    }


def make_block_case(n, path, k=3):
    """Padded rows for k positions plus the bonus (accept_block's arguments up to rng_state):
    each position as make_case; "rejected" drafts get p = 1e-3 q (0 < r_i << 1)."""
    rows = []
    for i in range(k + 1):
        accepted, rejected = make_case(n, seed=100 + i)
        p_ids, p, d, q_ids, q = accepted if path == "accepted" else rejected
        if path == "rejected":
            p = p.astype(np.float64)
            p[p_ids == d] = 1e-3 * q[q_ids == d][0]
            p = (p / p.sum()).astype(np.float32)
        rows.append((p_ids, p, d, q_ids, q))
    p_ids = np.stack([r[0] for r in rows]).astype(np.int32)
    p_probs = np.stack([r[1] for r in rows]).astype(np.float32)
    q_ids = np.stack([r[3] for r in rows[:k]]).astype(np.int32)
    q_probs = np.stack([r[4] for r in rows[:k]]).astype(np.float32)
    drafts = np.array([r[2] for r in rows[:k]], np.int64)
    p_lens = np.full(k + 1, p_ids.shape[1], np.int64)
    return p_ids, p_probs, p_lens, drafts, q_ids, q_probs, np.full(k, q_ids.shape[1], np.int64)


def _block_calls(args, scratch):
    state, buf = A.new_rng_state(0), np.empty(len(args[3]) + 1, np.int32)
    return {
        "wrapper_us": lambda: B.accept_block(*args, state, scratch, validate=False),
        "raw_us": lambda: B.accept_block_kernel(*args, state, scratch, buf),
        "numpy_us": lambda: R.accept_block_reference(*args, state, scratch),
        "token_rule_raw_us": lambda: B.accept_draft_kernel(*args, state, scratch, buf),
    }


def bench_block(scratch, repeats, min_time):
    """Rows of µs per call for the block rule (and the token rule on the same rows)."""
    out = []
    for n in (64, N_VOCAB):
        for path in ("accepted", "rejected"):
            args = make_block_case(n, path)
            row = {"support": n, "q_support": int(args[6][0]), "k": 3, "path": path}
            for key, call in _block_calls(args, scratch).items():
                row[key] = per_call_us(lambda m, call=call: [call() for _ in range(m)], repeats,
                                       min_time)
            out.append(row)
    return out


def make_tree_case(n, path, shape=(3, 1, 1)):
    """accept_tree's arguments up to rng_state for a full tree of `shape`, every position's p and q
    the rows of make_case(n). "accepted": each position's first child is argmax p with
    p(x) >= q(x) (the walk goes to the leaf and draws the bonus); "rejected": the root's children
    get p = 0, so all are rejected and the recovered token comes from the residual over all of p."""
    lay = build_tree(shape)
    (p_ids, p, d, q_ids, q), _ = make_case(n, seed=200)
    others = [int(t) for t in q_ids if int(t) != d][:2]
    tokens = np.array([[d, *others][i] if lay.parent[i] < 0 else d for i in range(lay.n_nodes)],
                      np.int32)
    if path == "rejected":
        p = p.astype(np.float64)
        p[np.isin(p_ids, tokens[lay.parent < 0])] = 0.0
        p = (p / p.sum()).astype(np.float32)
    rows = lay.n_nodes + 1
    return (tokens, lay.parent, np.tile(p_ids, (rows, 1)), np.tile(p, (rows, 1)),
            np.full(rows, n, np.int64), np.tile(q_ids, (rows, 1)), np.tile(q, (rows, 1)),
            np.full(rows, q_ids.shape[0], np.int64))


def _tree_calls(args, scratch):
    state, out_t, out_p = A.new_rng_state(0), np.empty(10, np.int32), np.empty(9, np.int32)
    return {
        "wrapper_us": lambda: T.accept_tree(*args, state, scratch, validate=False),
        "raw_us": lambda: T.accept_tree_kernel(*args, state, scratch, out_t, out_p),
    }


def bench_tree(scratch, repeats, min_time):
    """Rows of µs per call for the tree rule, shape (3, 1, 1) (9 nodes)."""
    out = []
    for n in (64, N_VOCAB):
        for path in ("accepted", "rejected"):
            args = make_tree_case(n, path)
            n_acc = T.accept_tree(*args, A.new_rng_state(0), scratch, validate=False)[2]
            assert (n_acc == 3) == (path == "accepted"), (n, path, n_acc)
            row = {"support": n, "q_support": int(args[7][0]), "shape": "3,1,1", "path": path}
            for key, call in _tree_calls(args, scratch).items():
                row[key] = per_call_us(lambda m, call=call: [call() for _ in range(m)], repeats,
                                       min_time)
            out.append(row)
    return out


FIRST_CALL = """
import time, json
t0 = time.perf_counter()
import numpy as np
from llama_spec import accept as A
t1 = time.perf_counter()
ids = np.arange(4, dtype=np.int32); p = np.full(4, 0.25, np.float32)
A.accept_step_kernel(ids, p, 1, ids[:2], np.array([0.5, 0.5], np.float32), A.new_rng_state(0),
                     A.new_scratch(8))
t2 = time.perf_counter()
print(json.dumps({"import_s": t1 - t0, "first_call_s": t2 - t1}))
"""


def first_call_times():
    """A fresh interpreter: import time, then the first accept_step_kernel call, once with an
    empty numba cache directory (compile) and once more with it filled (cache load)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    out = {}
    with tempfile.TemporaryDirectory() as cache_dir:
        env["NUMBA_CACHE_DIR"] = cache_dir
        for label in ("compile", "cache_load"):
            res = subprocess.run([sys.executable, "-c", FIRST_CALL], env=env, cwd=REPO,
                                 capture_output=True, text=True, check=True)
            got = json.loads(res.stdout.strip().splitlines()[-1])
            out[f"{label}_import_s"] = got["import_s"]
            out[f"{label}_first_call_s"] = got["first_call_s"]
    return out


def _cpu_model():
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", metavar="FILE", help="also write the results as JSON")
    ap.add_argument("--smoke", action="store_true", help="tiny N, for the smoke test")
    ap.add_argument("--repeats", type=int, default=7)
    opts = ap.parse_args(argv)
    repeats, min_time = (2, 1e-4) if opts.smoke else (opts.repeats, 0.05)

    scratch = A.new_scratch(N_VOCAB)
    rows = []
    # (support, q over all of p, p's ids in vocabulary order)
    cases = [(n, False, False) for n in SIZES] + [(N_VOCAB, False, True), (N_VOCAB, True, False)]
    for n, q_full, id_order in cases:
        accepted, rejected = make_case(n, q_full, id_order)
        q_support = accepted[3].shape[0]
        for path, args in (("accepted", accepted), ("rejected", rejected)):
            if (q_full or id_order) and path == "accepted":
                continue  # ~ the first full-vocabulary row: acceptance reads p and q up to x
            got, times = bench_call(args, scratch, repeats, min_time)
            assert got == (path == "accepted"), (n, path)
            rows.append({"support": n, "q_support": q_support, "path": path,
                         "p_order": "vocab" if id_order else "random", **times})
    block_rows = bench_block(scratch, repeats, min_time)
    tree_rows = bench_tree(scratch, repeats, min_time)
    assert not scratch.any()
    first = first_call_times()

    result = {
        "machine": f"{_cpu_model()}, {os.cpu_count()} CPUs ({platform.machine()})",
        "python": platform.python_version(),
        "numpy": np.__version__,
        "numba": __import__("numba").__version__,
        "smoke": opts.smoke,
        "rows": rows,
        "block_rows": block_rows,
        "tree_rows": tree_rows,
        "first_call": first,
    }
    print(f"machine: {result['machine']}; python {result['python']}, numpy {result['numpy']}, "
          f"numba {result['numba']}; median of {repeats} repeats")
    print()
    print("| p support | p order | q support | path | wrapper (validate=False) µs | raw kernel µs "
          "| numpy reference µs |")
    print("|---:|---|---:|---|---:|---:|---:|")
    for r in rows:
        print(f"| {r['support']:,} | {r['p_order']} | {r['q_support']:,} | {r['path']} "
              f"| {r['wrapper_us']:.2f} | {r['raw_us']:.2f} | {r['numpy_us']:.2f} |")
    print()
    print("| block rule, k = 3: p support | q support | drafts | wrapper µs | raw kernel µs "
          "| numpy reference µs | token rule raw µs |")
    print("|---:|---:|---|---:|---:|---:|---:|")
    for r in block_rows:
        print(f"| {r['support']:,} | {r['q_support']} | {r['path']} | {r['wrapper_us']:.2f} "
              f"| {r['raw_us']:.2f} | {r['numpy_us']:.2f} | {r['token_rule_raw_us']:.2f} |")
    print()
    print("| tree rule (3,1,1): p support | q support | root children | wrapper µs | raw kernel µs |")
    print("|---:|---:|---|---:|---:|")
    for r in tree_rows:
        print(f"| {r['support']:,} | {r['q_support']} | {r['path']} | {r['wrapper_us']:.2f} "
              f"| {r['raw_us']:.2f} |")
    print()
    print(f"first call in a fresh process: import {first['compile_import_s']:.2f} s + compile "
          f"{first['compile_first_call_s']:.2f} s (empty cache); import "
          f"{first['cache_load_import_s']:.2f} s + cache load "
          f"{first['cache_load_first_call_s']:.2f} s (warm cache)")
    if opts.json:
        Path(opts.json).write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
