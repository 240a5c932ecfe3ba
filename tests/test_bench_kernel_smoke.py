"""scripts/bench_kernel.py --smoke runs and writes the JSON the README table is made from."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_bench_kernel_smoke(tmp_path):
    out = tmp_path / "bench.json"
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    subprocess.run([sys.executable, str(ROOT / "scripts" / "bench_kernel.py"), "--smoke", "--json",
                    str(out)], cwd=ROOT, env=env, check=True, capture_output=True, text=True,
                   timeout=300)
    res = json.loads(out.read_text())
    assert res["smoke"] is True
    assert {"machine", "python", "numpy", "numba", "rows", "first_call"} <= res.keys()
    seen = set()
    for row in res["rows"]:
        assert {"support", "q_support", "path", "wrapper_us", "raw_us", "numpy_us"} <= row.keys()
        assert row["path"] in ("accepted", "rejected")
        for key in ("wrapper_us", "raw_us", "numpy_us"):
            assert row[key] > 0, (row, key)
        seen.add((row["support"], row["path"]))
    assert {(n, path) for n in (8, 64, 1024, 151_936) for path in ("accepted", "rejected")} <= seen
    first = res["first_call"]
    for key in ("compile_import_s", "compile_first_call_s", "cache_load_import_s",
                "cache_load_first_call_s"):
        assert first[key] > 0, key
