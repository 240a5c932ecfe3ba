"""The benchmark scripts run in smoke size and write the JSON the performance tables come from.

Each script runs as a subprocess, as a user runs it. Sizes are tiny (the synthetic MTP model,
SmolLM2-135M, 16-32 tokens), so the numbers are noisy: the checks are on structure and sanity
(positive rates, counters that add up, the temperature-0 control), not on speed.
The llama-cpp-python comparison needs its own venv (building it compiles llama.cpp for minutes):
it runs only when that venv exists, and is marked slow.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import THREADS

ROOT = Path(__file__).resolve().parent.parent
SCRIPTS = ROOT / "scripts"


_THREADED = ("bench_spec.py", "bench_rules.py", "bench_native.py", "ppl_parity.py", "profile_spec.py",
             "bench_bindings.py", "bench_chat_turns.py")


def _run(args: list[str], timeout: int = 600) -> subprocess.CompletedProcess:
    if len(args) > 1 and Path(args[1]).name in _THREADED:
        args = [*args, "--threads", str(THREADS)]  # the test process's share of the cores (conftest)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    p = subprocess.run(args, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    assert p.returncode == 0, f"{args} exited {p.returncode}\nstdout:\n{p.stdout[-3000:]}\nstderr:\n{p.stderr[-5000:]}"
    return p


def _machine_ok(m: dict) -> None:
    assert {"date", "cpu", "cores", "uptime", "python"} <= m.keys()
    assert "load average" in m["uptime"]


def test_bench_spec_smoke(tmp_path):
    out, png = tmp_path / "spec.json", tmp_path / "spec.png"
    p = _run([sys.executable, str(SCRIPTS / "bench_spec.py"), "--smoke", "--json", str(out), "--png", str(png)])
    assert "| class | temp |" in p.stdout
    res = json.loads(out.read_text())
    assert res["kind"] == "bench_spec" and res["smoke"] is True
    _machine_ok(res["machine"])
    assert res["control_identical"] is True and res["control_mismatches"] == []
    assert res["config"]["mtp"] is True and res["config"]["temps"] == [0.0, 0.8]
    rows = {(r["class"], r["temp"]): r for r in res["rows"]}
    assert set(rows) == {("code", 0.0), ("code", 0.8), ("prose", 0.0), ("prose", 0.8)}
    for (_cls, temp), r in rows.items():
        for arm in ("exact", "rejection"):
            a = r[arm]
            assert a["tps"]["n"] == 2 and a["tps"]["min"] > 0
            assert 0.0 <= a["acceptance_rate"] <= 1.0
            assert 0.0 <= a["mean_accepted_length"] <= res["config"]["n_max"]
            assert a["accepted"] <= a["drafted"]
            assert a["emitted"] == 2 * res["config"]["n_tokens"]
        assert r["exact"]["extra_accepted"] == 0  # exact match never keeps a token the target did not sample
        assert r["ratio"]["median"] > 0
        if temp == 0:
            assert r["verdict"] == "control"
            assert r["rejection"]["extra_accepted"] == 0
            # greedy: both arms make the same drafts and keep the same ones
            assert r["exact"]["accepted"] == r["rejection"]["accepted"]
        else:
            assert r["verdict"] in ("gain", "loss", "within noise")
            assert len(r["noise_band"]) == 2
    # sigma-0 synthetic head: q ~ p, the rejection rule keeps (nearly) every draft at T 0.8
    assert rows[("prose", 0.8)]["rejection"]["acceptance_rate"] >= rows[("prose", 0.8)]["exact"]["acceptance_rate"]
    for run in res["runs"]:
        assert run["emitted"] == res["config"]["n_tokens"]
        assert run["accepted"] + run["recovered"] <= run["drafted"] + run["verifications"]
    assert png.stat().st_size > 10_000


def test_bench_rules_smoke(tmp_path):
    out = tmp_path / "rules.json"
    p = _run([sys.executable, str(SCRIPTS / "bench_rules.py"), "--smoke", "--json", str(out)])
    assert "mean accepted length token → block" in p.stdout
    res = json.loads(out.read_text())
    assert res["kind"] == "bench_rules" and res["smoke"] is True
    _machine_ok(res["machine"])
    assert res["control_identical"] is True
    (c,) = res["configs"]
    assert c["config"] == "mtp:0.05" and c["control"] == []
    rows = {r["temp"]: r for r in c["rows"]}
    assert set(rows) == {0.0, 0.8}
    for temp, r in rows.items():
        for rule in ("token", "block"):
            a = r[rule]
            assert a["verifications"] > 0 and a["tps"]["n"] == 2 * 2 and a["tps"]["min"] > 0  # 2 prompts x 2 seeds
            assert 0.0 <= a["mean_accepted_length"] <= res["config"]["n_max"]
            # tokens per verification = kept + recovered/bonus: at most one more than the kept drafts
            assert a["mean_accepted_length"] <= a["tokens_per_verification"] <= a["mean_accepted_length"] + 1
        if temp == 0:
            assert r["token"]["accepted"] == r["block"]["accepted"]  # greedy: the same decisions
            assert r["paired"]["verifications"] == 0  # no paired pass at T = 0
        else:
            pe = r["paired"]
            assert pe["verifications"] > 0 and 0 <= pe["e_token"] <= 3 and 0 <= pe["e_block"] <= 3
    for run in c["runs"]:
        assert run["emitted"] == res["config"]["n_tokens"]


def test_bench_native_smoke(tmp_path):
    out = tmp_path / "native.json"
    p = _run([sys.executable, str(SCRIPTS / "bench_native.py"), "--smoke", "--json", str(out)])
    assert "exact ÷ native" in p.stdout
    res = json.loads(out.read_text())
    assert res["kind"] == "bench_native" and res["smoke"] is True
    _machine_ok(res["machine"])
    (s,) = res["settings"]
    assert s["repack"] is False and "--spec-type draft-mtp" in s["native_command"] and "-nr" in s["native_command"]
    assert res["greedy_identity"]["checked"] >= 1 and res["greedy_identity"]["mismatches"] == []
    for rec in s["prompts"]:
        assert len(rec["native"]) == len(rec["exact"]) == len(rec["rejection"]) == 2
        for slot in ("native", "exact", "rejection"):
            for r in rec[slot]:
                assert r["tps"] > 0 and r["emitted"] >= 1
        assert rec["native_deterministic"] is True or rec["temp"] > 0
        if rec["temp"] == 0:
            assert rec["exact_same_text"] and rec["rejection_same_text"]
        assert rec["exact_ratio"] > 0 and rec["rejection_ratio"] > 0
    alls = [r for r in s["rows"] if r["class"] == "all"]
    assert {r["temp"] for r in alls} == {0.0, 0.8}
    for r in alls:
        assert r["exact_ratio"]["median"] > 0


def test_bench_chat_turns_smoke(tmp_path):
    """Ours only (native llama-server takes minutes to build): 1 client and 2 sharing a system prompt."""
    pytest.importorskip("openai")
    pytest.importorskip("uvicorn")
    out = tmp_path / "chat.json"
    p = _run([sys.executable, str(SCRIPTS / "bench_chat_turns.py"), "--quick", "--skip-native", "--turns", "2",
              "--clients", "1,2", "--system-tokens", "150", "--max-tokens", "8", "--json", str(out)], timeout=300)
    assert "| turn | prompt tokens | TTFT |" in p.stdout and "shared prefix" in p.stdout
    res = json.loads(out.read_text())
    assert res["kind"] == "bench_chat_turns" and res["quick"] is True
    _machine_ok(res["machine"])
    assert 100 <= res["config"]["system_prompt_tokens"] <= 150
    assert [(r["server"], r["clients"]) for r in res["runs"]] == [("ours", 1), ("ours", 2)]
    for run in res["runs"]:
        assert len(run["conversations"]) == run["clients"]
        for conv in run["conversations"]:
            assert [t["turn"] for t in conv] == [1, 2]
            assert conv[0]["prompt_tokens"] > res["config"]["system_prompt_tokens"]
            assert conv[1]["prompt_tokens"] > conv[0]["prompt_tokens"]  # turn 2 carries turn 1 and its answer
            for t in conv:
                assert 0 < t["ttft_s"] <= t["total_s"] and 1 <= t["completion_tokens"] <= 8 and t["answer"]
    assert res["runs"][0]["conversations"][0][0]["prompt_tokens"] == res["config"]["turn1_prompt_tokens_rendered"]
    assert res["summary"]["per_server"]["ours"]["ttft_turn1"] > 0
    (m,) = res["multi"]
    assert m["shared_prefix_tokens"] >= res["config"]["system_prompt_tokens"]
    assert m["decoded_turn1"] <= m["prompt_tokens_turn1"]


def test_ppl_parity_smoke(tmp_path):
    out = tmp_path / "ppl.json"
    _run([sys.executable, str(SCRIPTS / "ppl_parity.py"), "--smoke", "--json", str(out)])
    res = json.loads(out.read_text())
    assert res["kind"] == "ppl_parity" and res["identical"] is True
    assert res["on"]["spec_draft_sample"] is True and res["off"]["spec_draft_sample"] is False
    assert res["on"]["ppl_4"] == res["off"]["ppl_4"] == res["native"]["ppl_4"]
    assert res["on"]["n_chunks"] == 2 and len(res["native"]["chunk_ppl"]) == 2
    assert 1.0 < res["on"]["ppl"] < 1000.0
    assert res["on"]["drafted"] > 0


def test_profile_spec_smoke(tmp_path):
    out = tmp_path / "prof.json"
    p = _run([sys.executable, str(SCRIPTS / "profile_spec.py"), "--smoke", "--json", str(out)])
    assert "Python glue" in p.stdout
    res = json.loads(out.read_text())
    assert res["kind"] == "profile_spec"
    assert 0 < res["wrapper_overhead_us"] < 50
    assert [(c["temp"], c["arm"]) for c in res["configs"]] == [(0.8, "exact"), (0.8, "rejection")]
    for c in res["configs"]:
        assert c["steps"] > 0 and c["step_us"] > 0
        cats = c["categories"]
        assert {"target: llama.cpp decode", "drafter: llama.cpp decode", "sampler chain", "kernel",
                "Python glue"} <= cats.keys()
        total = sum(v["pct"] for v in cats.values())
        assert 95.0 <= total <= 100.5, total  # self times + glue account for the whole loop
        assert cats["target: llama.cpp decode"]["us_per_step"] > 0
        assert cats["target: llama.cpp decode"]["calls_per_step"] == pytest.approx(1.0, abs=0.01)
        assert c["cprofile_top"] and "function" in c["cprofile_top"][0]
    assert res["configs"][1]["categories"]["kernel"]["calls_per_step"] > 0  # the rejection arm runs the kernel


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_gpu_check_dry_run(tmp_path):
    out = tmp_path / "gpu"
    _run(["bash", str(SCRIPTS / "gpu_check.sh"), str(out), "--dry-run"], timeout=900)
    res = json.loads((out / "gpu_check.json").read_text())
    assert res["kind"] == "gpu_check" and res["dry_run"] is True and res["ok"] is True
    st = {s["step"]: s["status"] for s in res["steps"]}
    for step in ("prepare", "wheels", "source", "models-f16", "models-q4km", "load-check"):
        assert st[step] == "ok", (step, res["steps"])
    for step in ("build", "pytest", "split", "bench-native-pair", "bench-native-mtp", "profile-pair"):
        assert st[step] == "skipped"
    log = (out / "gpu_check.log").read_text()
    # the dry run prints build_llama's CUDA findings: the cmake line, or (no nvidia-cublas wheel in
    # this Python, as in CI) the clear message naming what to install
    assert ("-DGGML_CUDA=ON" in log and "-DCMAKE_CUDA_ARCHITECTURES=90" in log) or \
        ("cuBLAS for CUDA 13 not found" in log and "pip install 'nvidia-cublas" in log)
    assert "mtp accept" in log


LCP_VENV = Path(os.environ.get("LLAMA_SPEC_LCP_VENV", "/tmp/lcp-venv"))


def _lcp_ready() -> bool:
    """The venv exists AND llama-cpp-python imports in it (a half-built venv must skip, not fail)."""
    py = LCP_VENV / "bin" / "python"
    return py.exists() and subprocess.run([str(py), "-c", "import llama_cpp"], capture_output=True,
                                          timeout=120).returncode == 0


@pytest.mark.slow
@pytest.mark.skipif(not _lcp_ready(),
                    reason=f"no llama-cpp-python venv at {LCP_VENV} (scripts/bench_bindings.py creates it, ~7 min)")
@pytest.mark.parametrize("fresh", [False, True], ids=["one-process", "fresh-process"])
def test_bench_bindings_smoke(tmp_path, fresh):
    out = tmp_path / "bind.json"
    _run([sys.executable, str(SCRIPTS / "bench_bindings.py"), "--smoke", "--no-build-venv", "--venv", str(LCP_VENV),
          "--json", str(out), *(["--fresh-process"] if fresh else [])])
    res = json.loads(out.read_text())
    assert res["config"]["fresh_process"] is fresh
    (m,) = res["models"]
    assert m["llama_cpp_python"] == "0.3.36"
    assert m["ours_tps"]["min"] > 0 and m["theirs_tps"]["min"] > 0 and m["ratio"]["median"] > 0
    assert m["same_tokens"] == m["n_prompts"]


def test_bench_topk_overhead_smoke(tmp_path):
    out = tmp_path / "topk.json"
    p = _run([sys.executable, str(SCRIPTS / "bench_topk_overhead.py"), "--rounds", "2", "--tokens", "16",
              "--json", str(out)])
    assert "| none |" in p.stdout and "on vs none: per-round ratio median" in p.stdout
    res = json.loads(out.read_text())
    assert res["pair"] == "mtp" and res["rounds"] == 2
    assert set(res["median_tps"]) == {"none", "noop", "on"} and min(res["median_tps"].values()) > 0
    for key in ("paired_noop_vs_none", "paired_on_vs_none"):
        v = res[key]
        assert v["min_max_pct"][0] <= v["median_pct"] <= v["min_max_pct"][1]


def test_bench_abort_callback_smoke():
    p = _run([sys.executable, str(SCRIPTS / "bench_abort_callback.py"), "--blocks", "2", "--per-block", "3",
              "-t", str(THREADS)])
    rows = {line.split(":")[0].strip(): line for line in p.stdout.splitlines() if "ms/decode" in line}
    assert set(rows) == {"every node", "every 2 ms", "flag only"}, p.stdout
    assert all(float(r.split("median")[1].split()[0]) > 0 for r in rows.values())
    assert "- flag only: median" in rows["every node"] and "- flag only" not in rows["flag only"]


def test_bench_gguf_check_smoke():
    p = _run([sys.executable, str(SCRIPTS / "bench_gguf_check.py"), "-m", "smollm2-135m", "--runs", "2"])
    line = next(x for x in p.stdout.splitlines() if x.startswith("SmolLM2-135M"))
    walked, remembered = (float(line.split(f"{arm} median ")[1].split()[0]) for arm in ("walked", "remembered"))
    assert 0 < remembered and 0 < walked, line


@pytest.mark.parametrize("concurrency", [1, 2])
def test_bench_server_pairs_smoke(tmp_path, concurrency):
    """Two fresh server pairs (the auto pair and its control) in smoke size: every server's rates land in the
    JSON, in its role; the ratios are those rates' medians divided (SmolLM2-135M drafting for itself)."""
    out = tmp_path / "pairs.json"
    _run([sys.executable, str(SCRIPTS / "bench_server_pairs.py"), "-m", "smollm2-135m", "-md", "smollm2-135m",
          "--pairs", "1", "--rounds", "2", "--requests", "1", "-n", "8", "--parallel", "2", "--ctx", "256",
          "-C", str(concurrency), "--control", "-t", str(THREADS), "--json", str(out)])
    js = json.loads(out.read_text())
    assert js["concurrency"] == concurrency and set(js["ratios"]) == {"auto", "control"}
    for kind in ("auto", "control"):
        (res,) = js["raw"][kind]
        assert set(res) == {"auto", "plain"}
        for rates in res.values():   # one rate per round (a burst at C > 1) or per request
            assert len(rates) == 2 and all(r > 0 for r in rates)
        (ratio,) = js["ratios"][kind]
        med = {n: statistics.median(v) for n, v in res.items()}
        assert ratio == pytest.approx(med["auto"] / med["plain"], rel=1e-12)
    # plain servers draft nothing: the control's two, and the auto pair's plain one
    assert js["drafted"]["control"][0] == {"auto": 0, "plain": 0} and js["drafted"]["auto"][0]["plain"] == 0


@pytest.mark.parametrize("gens", [False, True])
def test_context_ab_smoke(tmp_path, gens):
    """Two contexts' single-token decodes, alternating (bare, or bench_auto's plain and auto arms'): every
    decode timed in the JSON, the ratio their medians divided, the paired estimate inside its interval."""
    out = tmp_path / "ctx.json"
    _run([sys.executable, str(SCRIPTS / "context_ab.py"), "--quick", "-t", str(THREADS), "--json", str(out),
          *(["--gens"] if gens else [])])
    js = json.loads(out.read_text())
    labels = ["plain", "auto"] if gens else ["A", "B"]
    assert list(js["times_s"]) == labels and all(len(v) == 8 and min(v) > 0 for v in js["times_s"].values())
    med = {k: statistics.median(v) for k, v in js["times_s"].items()}
    assert js["ratio"] == pytest.approx(med[labels[1]] / med[labels[0]], rel=1e-12)
    lo_hi = js["paired"][1:]
    assert lo_hi[0] <= js["paired"][0] <= lo_hi[1]
