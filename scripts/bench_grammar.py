"""JSON-schema-constrained generation: the rejection rule under a grammar vs the exact-match fallback.

Per schema (>= 4, each turned into GBNF by llama.cpp's own json-schema-to-grammar) and seed, four
arms run interleaved on one target/draft pair (default Qwen2.5-Coder 1.5B <- 0.5B, draft-simple,
temperature 0.8):

  rejection     q masked with a clone of the target's grammar state, the token rule decides
  fallback      q not masked (the drafter ignores the grammar), sampled drafts: the rule falls
                back to exact-match (what llama-spec did before; docs/design.md invariant 3)
  exact-argmax  spec_draft_sample=False, unmasked argmax drafts, exact-match (llama.cpp's rule)
  plain         no drafter (the t/s reference)

It reports acceptance (kept / drafted), tokens per verification, decode t/s, whether the text
parses as JSON when the request ended, and the rejection/fallback t/s ratio; `uptime` before and
after. Run from the repository root (nice it on a shared machine):

  nice -n 10 python scripts/bench_grammar.py                         # 4 schemas x 1 seed x 64 tokens
  nice -n 10 python scripts/bench_grammar.py --seeds 3 --tokens 128  # the fuller run
  python scripts/bench_grammar.py --smoke                            # SmolLM2 for both, 16 tokens
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from llama_spec import DraftModelDrafter, Model, SamplerParams, SpeculativeGenerator  # noqa: E402
from llama_spec.llama.grammar import json_schema_to_grammar  # noqa: E402
from llama_spec.testing.models import model_path  # noqa: E402

SCHEMAS: dict[str, tuple[dict, str]] = {
    "person": ({"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"},
                                                 "city": {"type": "string"}}, "required": ["name", "age", "city"]},
               "Give a fictional person (name, age, city) as JSON."),
    "todo-list": ({"type": "array", "minItems": 3, "maxItems": 5,
                   "items": {"type": "object", "properties": {"task": {"type": "string"}, "done": {"type": "boolean"}},
                             "required": ["task", "done"]}},
                  "A JSON list of 3 to 5 todo items for a software project, each with task and done."),
    "product": ({"type": "object", "properties": {
        "sku": {"type": "string"}, "price": {"type": "number"},
        "colour": {"enum": ["red", "green", "blue", "black", "white"]},
        "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 4}},
        "required": ["sku", "price", "colour", "tags"]},
        "Describe a product from an online shop as JSON (sku, price, colour, tags)."),
    "function-call": ({"type": "object", "properties": {
        "name": {"enum": ["get_weather", "search", "send_email"]},
        "arguments": {"type": "object", "properties": {"query": {"type": "string"}, "city": {"type": "string"},
                                                       "to": {"type": "string"}}}},
        "required": ["name", "arguments"]},
        "Call a tool to find out the weather in Paris. Answer with the JSON function call only."),
}
ARMS = ("rejection", "fallback", "exact-argmax", "plain")


class UnmaskedDrafter(DraftModelDrafter):
    """draft-simple that ignores the grammar (its proposals are not grammar-masked)."""

    def bind_grammar(self, source) -> None:  # type: ignore[no-untyped-def]
        self.grammar_source = None


def chat(prompt: str) -> str:
    return f"<|im_start|>user\n{prompt}<|im_end|>\n<|im_start|>assistant\n"


def uptime() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()


def run_arm(gens: dict, arm: str, prompt: str, sp: SamplerParams, seed: int, n: int) -> dict:
    gen = gens[arm]
    r = gen.generate(prompt, sampling=sp, seed=seed, n_predict=n, spec_draft_sample=arm != "exact-argmax")
    st = r.stats
    ok = None
    if r.stop_reason == "eos":
        try:
            json.loads(r.text)
            ok = True
        except ValueError:
            ok = False
    return {"arm": arm, "tokens": len(r.tokens), "drafted": st.drafted, "accepted": st.accepted,
            "verifications": st.verifications, "exact_match_verifications": st.exact_match_verifications,
            "t_decode_s": st.t_decode_s, "tps": len(r.tokens) / max(st.t_decode_s, 1e-9),
            "stop": r.stop_reason, "json_ok": ok, "text": r.text}


def summarize(rows: list[dict]) -> list[str]:
    lines = ["| schema | arm | acceptance | tokens/verification | decode t/s | JSON ok |", "|---|---|---|---|---|---|"]
    for schema in SCHEMAS:
        for arm in ARMS:
            rs = [r for r in rows if r["schema"] == schema and r["arm"] == arm]
            if not rs:
                continue
            d, a = sum(r["drafted"] for r in rs), sum(r["accepted"] for r in rs)
            v, t = sum(r["verifications"] for r in rs), sum(r["tokens"] for r in rs)
            acc = f"{a / d:.2f} ({a}/{d})" if d else "-"
            tpv = f"{t / v:.2f}" if v and arm != "plain" else "-"
            ok = [r["json_ok"] for r in rs if r["json_ok"] is not None]
            lines.append(f"| {schema} | {arm} | {acc} | {tpv} | {statistics.median(r['tps'] for r in rs):.2f} | "
                         f"{sum(ok)}/{len(ok)} ended |")
    for arm in ARMS[:3]:
        rs = [r for r in rows if r["arm"] == arm]
        d, a = sum(r["drafted"] for r in rs), sum(r["accepted"] for r in rs)
        lines.append(f"| all | {arm} | {a / max(d, 1):.2f} ({a}/{d}) | | "
                     f"{statistics.median(r['tps'] for r in rs):.2f} | |")
    ratios = []
    for r in rows:
        if r["arm"] == "rejection":
            f = [x for x in rows if x["arm"] == "fallback" and x["schema"] == r["schema"] and x["seed"] == r["seed"]]
            if f:
                ratios.append(r["tps"] / f[0]["tps"])
    if ratios:
        lines.append(f"\nrejection / fallback decode t/s: median {statistics.median(ratios):.2f} "
                     f"(min {min(ratios):.2f}, max {max(ratios):.2f}, {len(ratios)} pairs)")
    return lines


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", default="qwen2.5-coder-1.5b")
    ap.add_argument("--draft", default="qwen2.5-coder-0.5b")
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--seeds", type=int, default=1)
    ap.add_argument("--temp", type=float, default=0.8)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--n-max", type=int, default=3)
    ap.add_argument("--json", default=None, metavar="FILE")
    ap.add_argument("--smoke", action="store_true", help="SmolLM2 as target and draft, 16 tokens")
    ns = ap.parse_args()
    if ns.smoke:
        ns.target = ns.draft = "smollm2-135m"
        ns.tokens = 16
    print("before:", uptime(), flush=True)
    target = Model(model_path(ns.target, progress=False), repack=False)
    draft = target if ns.draft == ns.target else Model(model_path(ns.draft, progress=False), repack=False)
    kw = dict(n_ctx=1024, n_threads=ns.threads)
    gens = {"rejection": SpeculativeGenerator(target, DraftModelDrafter(draft, **kw), n_max=ns.n_max, **kw),
            "fallback": SpeculativeGenerator(target, UnmaskedDrafter(draft, **kw), n_max=ns.n_max, **kw),
            "plain": SpeculativeGenerator(target, None, **kw)}
    gens["exact-argmax"] = gens["fallback"]
    grammars = {k: json_schema_to_grammar(s) for k, (s, _) in SCHEMAS.items()}
    warm = SamplerParams(temp=ns.temp, grammar=grammars["person"])
    for g in ("rejection", "fallback", "plain"):
        gens[g].generate(chat("hi"), sampling=warm, seed=0, n_predict=4)  # numba compile, caches
    rows = []
    t0 = time.time()
    for seed in range(1, ns.seeds + 1):
        for i, (schema, (_, prompt)) in enumerate(SCHEMAS.items()):
            sp = SamplerParams(temp=ns.temp, grammar=grammars[schema])
            order = ARMS if (i + seed) % 2 == 0 else tuple(reversed(ARMS))  # interleave against drift
            for arm in order:
                row = run_arm(gens, arm, chat(prompt), sp, seed, ns.tokens)
                row.update(schema=schema, seed=seed)
                rows.append(row)
                print(f"{schema:14s} seed {seed} {arm:12s} acc {row['accepted']}/{row['drafted']} "
                      f"{row['tps']:.2f} t/s stop {row['stop']} json {row['json_ok']}", flush=True)
    after = uptime()
    lines = summarize(rows)
    print("\n".join(lines))
    print(f"\n{len(rows)} runs in {time.time() - t0:.0f} s; target {ns.target}, draft {ns.draft}, temp {ns.temp}, "
          f"{ns.tokens} tokens, n_max {ns.n_max}, {ns.threads} thread(s), repack off")
    print("after:", after)
    if ns.json:
        Path(ns.json).write_text(json.dumps({"args": vars(ns), "rows": rows, "uptime_after": after}, indent=2))
    for g in ("rejection", "fallback", "plain"):
        gens[g].close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
