"""One-shot CLI runs, each a fresh process: what a user of ``llama-spec generate -md`` gets (issue 25).

Every ``llama-spec generate`` run starts a new controller. Without anything saved it is cold: it
gives the draft model its cold turns and learns the costs again before it can choose. This script
runs the CLI in fresh processes, interleaved A B .. Z Z .. B A per prompt and temperature (same
seed, ``--ignore-eos``, the same ``-t``), and reports decode t/s per arm (median of its runs),
each arm over plain, and each arm's wall seconds per process (loading and prefill included):

* plain: ``-m T`` (no drafter);
* fixed: ``-m T -md D --no-spec-auto`` (the fixed configuration, n-max 3);
* auto cold: ``-m T -md D`` with the cost-model cache off (``LLAMA_SPEC_COST_CACHE=0``): a
  controller that knows nothing;
* auto: ``-m T -md D`` as a user runs it, with the cache on (``--cache-dir``, emptied at the start
  and warmed by one short run first): the controller starts from what the runs before it measured.

``--variant NAME:VAR=VALUE[,VAR=VALUE..]`` adds an arm NAME: the auto arm with those environment
variables set (an A/B of a switch in fresh processes, e.g. ``serial:LLAMA_SPEC_LOAD_DRAFT_BESIDE=0``,
or of another checkout: ``old:PYTHONPATH=/path/to/checkout`` with its built extension in place).

    python scripts/cold_start.py                          # 1.5B <- 0.5B, code and prose, temps 0 and 0.8
    python scripts/cold_start.py --arms plain,auto --runs 2 --per-class 1 -n 64
    python scripts/cold_start.py --arms plain,auto --variant serial:LLAMA_SPEC_LOAD_DRAFT_BESIDE=0
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from bench_spec import DEFAULT_DRAFTER, DEFAULT_TARGET, loadavg, machine_info, resolve, write_json  # noqa: E402

ARMS = ("plain", "fixed", "auto cold", "auto")


def parse_variant(spec: str) -> tuple[str, dict[str, str]]:
    """'NAME:VAR=VALUE,VAR=VALUE' -> (NAME, {VAR: VALUE}); ValueError on a malformed one."""
    name, sep, rest = spec.partition(":")
    pairs = [x.partition("=") for x in rest.split(",") if x]
    if not sep or not name or name in ARMS or not pairs or any(not k or not eq for k, eq, _ in pairs):
        raise ValueError(f"--variant {spec!r}: expected NAME:VAR=VALUE[,VAR=VALUE..], NAME not one of {ARMS}")
    return name, {k: v for k, _, v in pairs}


def arm_args(arm: str, target: Path, draft: Path) -> list[str]:
    if arm == "plain":
        return ["-m", str(target)]
    more = ["--no-spec-auto"] if arm == "fixed" else ["--spec-auto"]   # (whatever LLAMA_SPEC_AUTO says)
    return ["-m", str(target), "-md", str(draft), *more]


def run_cli(arm: str, a: argparse.Namespace, target: Path, draft: Path, prompt: str, temp: float, seed: int,
            cache_dir: Path, n: int | None = None) -> dict:
    """One fresh `llama-spec generate` process; its --stats-json record, with "warm": whether its
    controller started from the cache."""
    with tempfile.TemporaryDirectory() as tmp:
        stats = Path(tmp) / "stats.json"
        cmd = [sys.executable, "-m", "llama_spec", "generate", *arm_args(arm, target, draft), "-p", prompt,
               "-n", str(n or a.n_tokens), "--temp", str(temp), "--seed", str(seed), "-t", str(a.threads),
               "--ignore-eos", "--stats-json", str(stats)]
        env = {**os.environ, "LLAMA_SPEC_COST_CACHE": "0" if arm == "auto cold" else str(cache_dir),
               **a.variant_env.get(arm, {})}   # (--variant: the environment it adds to auto's)
        t0 = time.perf_counter()
        p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
        wall = time.perf_counter() - t0
        if p.returncode != 0:
            raise SystemExit(f"{arm}: exit {p.returncode}\n{p.stderr[-2000:]}")
        rec = json.loads(stats.read_text())
        rec["warm"] = "auto starts from the costs earlier runs measured" in p.stderr
        rec["wall_s"] = wall   # the whole process, as the user waits for it: loading, prefill, decode
        return rec


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", default=DEFAULT_TARGET)
    ap.add_argument("--drafter", default=DEFAULT_DRAFTER)
    ap.add_argument("--arms", default=",".join(ARMS), help=f"of {', '.join(ARMS)}")
    ap.add_argument("--classes", default="code,prose")
    ap.add_argument("--per-class", type=int, default=2)
    ap.add_argument("--temps", default="0,0.8")
    ap.add_argument("-n", "--n-tokens", type=int, default=128)
    ap.add_argument("--runs", type=int, default=4, help="runs per arm and prompt (even: A B B A)")
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--cache-dir", default=None,
                    help="the auto arm's cost-model cache, empty or absent; kept (default: a temporary one)")
    ap.add_argument("--variant", action="append", default=[], metavar="NAME:VAR=VALUE[,..]",
                    help="one more arm: auto with these environment variables (repeatable)")
    ap.add_argument("--json", default=None, metavar="FILE")
    a = ap.parse_args(argv)
    arms = [x for x in a.arms.split(",") if x]
    if not arms or any(x not in ARMS for x in arms):
        ap.error(f"--arms: of {', '.join(ARMS)}")
    try:
        a.variant_env = dict(parse_variant(v) for v in a.variant)
    except ValueError as e:
        ap.error(str(e))
    arms += list(a.variant_env)
    if a.runs < 2 or a.runs % 2:
        ap.error("--runs: an even number >= 2")
    target, draft = resolve(a.target), resolve(a.drafter)
    base = json.loads((HERE / "prompts.json").read_text())
    prompts = [(c, i, base[c][i]) for i in range(a.per_class) for c in a.classes.split(",")]
    info = machine_info()
    print(f"# {info['cpu']}, {info['cores']} cores; {loadavg()}", file=sys.stderr)
    print(f"# {target.name} <- {draft.name}; arms: {', '.join(arms)}; {a.n_tokens} tokens, -t {a.threads}, "
          f"a fresh process per run", file=sys.stderr)
    # (a folder of the user's is never emptied: it must be empty or absent, as the measurement needs)
    cache_dir = Path(a.cache_dir) if a.cache_dir else Path(tempfile.mkdtemp(prefix="llama-spec-cost-"))
    cache_dir.mkdir(parents=True, exist_ok=True)
    if any(cache_dir.iterdir()):
        ap.error(f"--cache-dir {cache_dir}: not empty (the auto arm must start from its own runs only)")
    if "auto" in arms or a.variant_env:   # one short run writes the cache the auto arm's first run starts from
        run_cli("auto", a, target, draft, "def f(x):", 0.0, 1, cache_dir, n=16)
    recs = []
    for temp in (float(x) for x in a.temps.split(",")):
        for cls, i, text in prompts:
            runs: dict[str, list[float]] = {k: [] for k in arms}
            walls: dict[str, list[float]] = {k: [] for k in arms}
            chosen: dict[str, str] = {}
            warm: dict[str, list[bool]] = {k: [] for k in arms}
            for arm in (arms + arms[::-1]) * (a.runs // 2):
                rec = run_cli(arm, a, target, draft, text, temp, a.seed + i, cache_dir)
                runs[arm].append(float(rec["decode_tps"]))
                walls[arm].append(float(rec["wall_s"]))
                warm[arm].append(bool(rec["warm"]))
                if "auto" in rec:
                    chosen[arm] = str(rec["auto"].get("chosen", ""))
            tps = {k: statistics.median(v) for k, v in runs.items()}
            wall = {k: statistics.median(v) for k, v in walls.items()}
            ratios = {k: tps[k] / tps["plain"] for k in arms if k != "plain"} if "plain" in tps else {}
            recs.append({"class": cls, "prompt": i, "temp": temp, "runs": runs, "tps": tps, "over_plain": ratios,
                         "chosen": chosen, "warm": warm, "wall_s": walls, "wall_median_s": wall})
            print(f"T={temp:<4} {cls:5} {i + 1}: " + "  ".join(f"{k} {tps[k]:5.1f}" for k in arms)
                  + ("   " + "  ".join(f"{k}/plain {r:.3f}" for k, r in ratios.items()) if ratios else ""),
                  flush=True)
            print("         wall s (the process): " + "  ".join(f"{k} {wall[k]:5.2f}" for k in arms), flush=True)
    if recs and recs[0]["over_plain"]:
        print("\nmedian / min over the prompts, ÷ plain:")
        for k in recs[0]["over_plain"]:
            vals = [r["over_plain"][k] for r in recs]
            print(f"  {k}: median {statistics.median(vals):.3f}, min {min(vals):.3f}")
    write_json(a.json, {"machine": info, "args": vars(a), "prompts": recs})
    if not a.cache_dir:
        shutil.rmtree(cache_dir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
