"""The controller's diagnosis scripts run in smoke size (SmolLM2-135M drafting for itself, a few
tokens): the structure of what they print, not the speed (tests/test_bench_smoke.py's rules)."""

from __future__ import annotations

import json
import re
import sys
from types import SimpleNamespace

import pytest
from conftest import THREADS
from test_bench_smoke import SCRIPTS, _run


def test_controller_overhead_splits_each_arms_time_by_context():
    p = _run([sys.executable, str(SCRIPTS / "controller_overhead.py"), "--runs", "2", "-n", "16", "-t", str(THREADS)])
    rows = {m.group(1): m for m in re.finditer(
        r"^  (plain|auto|auto ngram)\s*: total\s+([\d.]+) .*?target\s+([\d.]+) .*?draft\s+([\d.]+) .*?rest\s+(-?[\d.]+)",
        p.stdout, re.M)}
    assert rows.keys() == {"plain", "auto", "auto ngram"}, p.stdout
    for arm, m in rows.items():
        assert float(m.group(2)) > 0 and float(m.group(3)) > 0, (arm, p.stdout)
    # the draft model's decodes are counted apart: plain and the n-gram-only arm have none
    assert float(rows["plain"].group(4)) == 0.0 and float(rows["auto ngram"].group(4)) == 0.0, p.stdout
    assert re.search(r"auto ngram.*steps \d+", p.stdout), p.stdout


def test_auto_requests_prints_each_requests_choices_in_order():
    p = _run([sys.executable, str(SCRIPTS / "auto_requests.py"), "--target", "smollm2-135m", "--drafter",
              "smollm2-135m", "-n", "12", "-t", str(THREADS), "--request-prior", "2"])
    lines = [x for x in p.stdout.splitlines() if "auto chose" in x]
    assert [x[:8].strip() for x in lines] == (
        ["code 1"] * 2 + ["prose 1"] * 3 + ["code 2"] * 2 + ["prose 2"] * 3), p.stdout
    assert "# request prior 2," in p.stdout
    for x in lines:   # every request decided its steps: plain steps and/or drafted ones, with lengths
        assert re.search(r"auto chose (plain \d+|\S+ \d+).*; k .*; kept \d+/\d+$", x), x


def test_auto_requests_sequence_names_bench_autos_prompts_and_refuses_unknown_ones(monkeypatch):
    monkeypatch.syspath_prepend(str(SCRIPTS))
    import auto_requests
    import bench_auto
    ps = bench_auto.prompts(2)
    got = auto_requests.sequence("edit2, code1@0.8,prose2", 0.3)
    assert [n for n, _, _ in got] == ["edit 2", "code 1", "prose 2"]
    assert [t for _, t, _ in got] == [ps[5][1], ps[0][1], ps[4][1]]
    assert [temp for _, _, temp in got] == [0.3, 0.8, 0.3]   # an item's @T, else the default
    for bad in ("code3", "poem1", "edit0", "code", "", "code1@", "code1@x"):
        with pytest.raises(SystemExit, match="--sequence"):
            auto_requests.sequence(bad)


def test_sync_check_runs_its_three_arms_interleaved_on_new_long_prompts():
    p = _run([sys.executable, str(SCRIPTS / "sync_check.py"), "--target", "smollm2-135m", "--drafter",
              "smollm2-135m", "--chars", "1200", "-n", "8", "--reps", "1", "-t", str(THREADS)])
    runs = re.findall(r"^rep 0 (plain|auto blind|auto)\s+prompt (\d+) tokens: +[\d.]+ t/s", p.stdout, re.M)
    assert [r[0] for r in runs] == ["plain", "auto", "auto blind", "auto blind", "auto", "plain"], p.stdout
    assert all(int(n) > 200 for _, n in runs), runs   # long prompts (1,200 characters of source)
    assert len({n for _, n in runs}) > 1, runs        # ... each one new
    summary = re.findall(r"^(plain|auto blind|auto)\s+[\d.]+ .*\)\s+([\d.]+)$", p.stdout, re.M)
    assert [s[0] for s in summary] == ["plain", "auto", "auto blind"] and summary[0][1] == "1.000", p.stdout


def test_bench_auto_ab_runs_a_p_min_variant_beside_auto_and_reports_their_ratio(tmp_path):
    out = tmp_path / "ab.json"
    p = _run([sys.executable, str(SCRIPTS / "bench_auto.py"), "--quick", "--reps", "2", "--fixed", "", "--native", "off",
              "--temps", "0.8", "--classes", "prose", "--per-class", "1", "-n", "12", "-t", str(THREADS),
              "--auto-ab", "p_min=0.5", "--json", str(out)])
    rec = json.loads(out.read_text())["prompts"][0]
    assert sorted(rec["runs"]) == ["auto", "auto p_min=0.5", "plain"], p.stdout
    assert all(len(v) == 2 for v in rec["runs"].values())
    assert abs(rec["auto_ab p_min=0.5"] - rec["tps"]["auto"] / rec["tps"]["auto p_min=0.5"]) < 1e-9
    assert "auto / auto p_min=0.5: median" in p.stdout


def test_an_ab_setting_goes_to_the_requests_where_generate_takes_it_else_to_the_controller(monkeypatch):
    monkeypatch.syspath_prepend(str(SCRIPTS))
    import bench_auto

    from llama_spec import SpeculativeGenerator
    from llama_spec.generation.controller import SpecController

    class Gen:   # the real generator's request keywords, a real controller
        stream = SpeculativeGenerator.stream
        controller = SpecController()

    g = Gen()
    assert bench_auto.ab_setting(g, "p_min", "0.75") == {"p_min": 0.75}
    assert bench_auto.ab_setting(g, "explore_budget", "0.02") == {}
    assert g.controller.explore_budget == 0.02
    assert bench_auto.ab_setting(g, "borrow_bands", "0") == {} and g.controller.borrow_bands is False   # not bool("0")
    with pytest.raises(SystemExit, match="borrow_bands"):
        bench_auto.ab_setting(g, "borrow_bands", "maybe")
    with pytest.raises(AttributeError):
        bench_auto.ab_setting(g, "no_such_setting", "1")


def test_bench_auto_prints_each_prompts_ratio_to_native(monkeypatch, capsys):
    monkeypatch.syspath_prepend(str(SCRIPTS))
    import bench_auto

    class FakeArms:   # fixed speeds: plain 10, auto 12, one fixed arm 11; native 8
        gens = {"plain": None, "auto": None, "ngram-simple": None}

        def run(self, arm, text, temp, n, seed):
            return {"plain": 10.0, "auto": 12.0, "ngram-simple": 11.0}[arm]

        last_stats = SimpleNamespace(auto_summary=lambda: "plain 93, draft-simple 1", accepted=2, drafted=3)

        target_path = draft_path = SCRIPTS

    monkeypatch.setattr(bench_auto, "run_native", lambda cmd, text: {"tps": 8.0})
    a = bench_auto.parse_args(["--reps", "2", "--fixed", "ngram-simple"])
    rec = bench_auto.run_prompt(FakeArms(), SCRIPTS / "llama-speculative-simple", a, "code", "def f():", 0.0, 1)
    assert rec["auto_native"] == 1.5 and rec["auto_plain"] == 1.2 and rec["oracle"] == "ngram-simple"
    assert rec["runs"]["native"] == [8.0, 8.0]
    assert rec["chose"] == {"auto": ["12.0 t/s: plain 93, draft-simple 1; kept 2/3"] * 2}   # per auto run
    line = capsys.readouterr().out
    assert "auto/plain 1.20" in line and "/oracle 1.09" in line and "/native 1.50" in line, line


def test_cold_start_runs_fresh_cli_processes_with_the_auto_arm_warm_and_the_cold_arm_cold(tmp_path):
    out = tmp_path / "cold.json"
    p = _run([sys.executable, str(SCRIPTS / "cold_start.py"), "--target", "smollm2-135m", "--drafter", "smollm2-135m",
              "--arms", "plain,auto cold,auto", "--classes", "code", "--per-class", "1", "--temps", "0",
              "--runs", "2", "-n", "8", "-t", str(THREADS), "--cache-dir", str(tmp_path / "cache"),
              "--variant", "uncached:LLAMA_SPEC_COST_CACHE=0", "--json", str(out)])
    rec = json.loads(out.read_text())["prompts"][0]
    assert {k: len(v) for k, v in rec["runs"].items()} == {"plain": 2, "auto cold": 2, "auto": 2, "uncached": 2}
    # the variant is the auto arm with its environment: the cache switched off reaches its processes
    assert rec["warm"] == {"plain": [False, False], "auto cold": [False, False], "auto": [True, True],
                           "uncached": [False, False]}
    assert set(rec["over_plain"]) == {"auto cold", "auto", "uncached"} and "auto/plain" in p.stdout
    # each process's wall time: at least its decode (n tokens at the decode rate it reported)
    for arm, walls in rec["wall_s"].items():
        assert len(walls) == 2 and all(w > 8 / tps for w, tps in zip(walls, rec["runs"][arm], strict=True)), rec
    assert list((tmp_path / "cache").glob("*.json"))   # the auto arm's cache, kept with --cache-dir
