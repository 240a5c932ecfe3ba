"""What the Python GGUF check (models/gguf_check.py) costs a fresh process, walked and remembered:
each run is a new interpreter that checks one model once (as `llama-spec run` does at load),
interleaved A B B A .., with the cache off (``LLAMA_SPEC_GGUF_CHECK_CACHE=0``: the walk) and on (a
cache file in a temporary folder, filled before the first timed run: a hash of the bytes checked).
Reported: each arm's median ms and the median paired difference.

  python scripts/bench_gguf_check.py                                   # the README's two Qwen models
  python scripts/bench_gguf_check.py -m smollm2-135m --runs 6
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_spec import loadavg, machine_info, resolve  # noqa: E402

_CHILD = ("import sys, time; from pathlib import Path; from llama_spec.models.gguf_check import check_gguf; "
          "p = Path(sys.argv[1]); t = time.perf_counter(); check_gguf(p); print(time.perf_counter() - t)")


def _once(path: Path, cache: str) -> float:
    env = dict(os.environ, LLAMA_SPEC_GGUF_CHECK_CACHE=cache)
    out = subprocess.run([sys.executable, "-c", _CHILD, str(path)], env=env, check=True,
                         capture_output=True, text=True).stdout
    return float(out.strip().splitlines()[-1]) * 1e3


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-m", "--model", action="append", help="model name or path (repeatable)")
    ap.add_argument("--runs", type=int, default=10, help="fresh processes per arm and model")
    a = ap.parse_args(argv)
    info = machine_info()
    print(f"# {info['cpu']}, {info['cores']} cores; {loadavg()}", file=sys.stderr)
    with tempfile.TemporaryDirectory() as tmp:
        cache = str(Path(tmp) / "gguf-checked.json")
        for name in a.model or ["qwen2.5-coder-1.5b", "qwen2.5-coder-0.5b"]:
            path = resolve(name)
            _once(path, cache)                       # remembered before the first timed run
            runs: dict[str, list[float]] = {"walked": [], "remembered": []}
            for i in range(a.runs):
                order = ("walked", "remembered") if i % 2 == 0 else ("remembered", "walked")
                for arm in order:
                    runs[arm].append(_once(path, "0" if arm == "walked" else cache))
            w, r = runs["walked"], runs["remembered"]
            diff = statistics.median(x - y for x, y in zip(w, r, strict=True))
            print(f"{path.name}: walked median {statistics.median(w):.1f} ms [{min(w):.1f} .. {max(w):.1f}], "
                  f"remembered median {statistics.median(r):.1f} ms [{min(r):.1f} .. {max(r):.1f}], "
                  f"saved (paired median) {diff:.1f} ms per process")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
