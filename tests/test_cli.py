"""The `llama-spec` command: stdout carries only the generated text; stats go to stderr."""

from __future__ import annotations

import json
import subprocess
import sys


def _run(args, timeout=600):
    return subprocess.run([sys.executable, "-m", "llama_spec", *args], capture_output=True, text=True, timeout=timeout)


def test_generate_smollm_plain_prints_only_text(smollm_path, tmp_path):
    stats = tmp_path / "s.json"
    r = _run(["generate", "-m", "smollm2-135m", "-p", "The capital of France is", "-n", "12", "--temp", "0",
              "-c", "256", "--stats-json", str(stats)])
    assert r.returncode == 0, r.stderr[-2000:]
    assert "Paris" in r.stdout
    assert "The capital of France is" not in r.stdout  # the prompt is not echoed
    assert "generated=12 tokens" in r.stderr or "stop=eos" in r.stderr
    d = json.loads(stats.read_text())
    assert d["rule"] == "none" and len(d["tokens"]) <= 12


def test_generate_qwen05_coherent(qwen05_path):
    r = _run(["generate", "-m", "qwen2.5-coder-0.5b", "-p", "def add(a, b):\n    return", "-n", "8",
              "--temp", "0", "-c", "256"])
    assert r.returncode == 0, r.stderr[-2000:]
    assert "a + b" in r.stdout


def test_generate_speculative_mtp_reports_acceptance(mtp_path, tmp_path):
    stats = tmp_path / "s.json"
    r = _run(["generate", "-m", str(mtp_path), "--spec-type", "draft-mtp", "-p", "Hello world", "-n", "32",
              "--temp", "0.8", "--seed", "3", "-c", "512", "--ignore-eos", "--stats-json", str(stats)])
    assert r.returncode == 0, r.stderr[-2000:]
    assert "rule=rejection draft-mtp" in r.stderr and "accepted=" in r.stderr
    d = json.loads(stats.read_text())
    assert d["rule"] == "rejection" and d["verifications"] > 0 and len(d["tokens"]) == 32
    r2 = _run(["generate", "-m", str(mtp_path), "--spec-type", "draft-mtp", "-p", "Hello world", "-n", "8",
               "--no-spec-draft-sample", "-c", "512"])
    assert r2.returncode == 0 and "rule=exact-match" in r2.stderr


def test_bad_input_is_a_clear_error(tmp_path):
    bad = tmp_path / "x.gguf"
    bad.write_text("not a model at all, just text" * 3)
    r = _run(["generate", "-m", str(bad), "-p", "hi", "-n", "4"])
    assert r.returncode == 2 and "not a GGUF" in r.stderr and "Traceback" not in r.stderr
    r = _run(["generate", "-m", "smollm2-135m", "-p", "hi", "--spec-draft-n-max", "0", "-md", "smollm2-135m"])
    assert r.returncode == 2 and "n_max" in r.stderr
