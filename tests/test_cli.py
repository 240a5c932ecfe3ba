"""The `llama-spec` command: stdout carries only the generated text; stats go to stderr."""

from __future__ import annotations

import json
import subprocess
import sys

from conftest import THREADS


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
    assert "rule=token draft-mtp" in r.stderr and "accepted=" in r.stderr
    d = json.loads(stats.read_text())
    assert d["rule"] == "token" and d["verifications"] > 0 and len(d["tokens"]) == 32
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


# -- llama.cpp's flags (issue 15): each asserts what the flag does, not only that it parses ------------

def _main(capsys, args):
    from llama_spec.cli import main

    code = main(args)
    cap = capsys.readouterr()
    return code, cap.out, cap.err


def _ns(args):
    from llama_spec.cli import build_parser

    return build_parser().parse_args(args)


_GEN = ["generate", "-m", "smollm2-135m", "-c", "256", "-t", str(THREADS), "-p", "The capital of France is"]


def test_reverse_prompt_stops_before_the_string(smollm_path, capsys):
    code, full, _ = _main(capsys, [*_GEN, "-n", "24", "--temp", "0"])
    assert code == 0 and "population" in full, full
    code, cut, err = _main(capsys, [*_GEN, "-n", "24", "--temp", "0", "-r", "population", "-r", "never-there"])
    assert code == 0 and "stop=stop" in err
    assert cut.rstrip("\n") == full[: full.index("population")]  # streamed text ends right before it


def test_s_is_seed(smollm_path, capsys):
    a = _main(capsys, [*_GEN, "-n", "16", "--temp", "1.0", "-s", "11"])
    b = _main(capsys, [*_GEN, "-n", "16", "--temp", "1.0", "--seed", "11"])
    assert a[0] == b[0] == 0 and a[1] == b[1] and a[1].strip()
    assert _ns([*_GEN, "-s", "5"]).seed == 5


def test_no_repack_and_load_mode_reach_the_model(smollm_path):
    from llama_spec.cli.build import load_model

    assert _ns(_GEN).no_repack is False and _ns([*_GEN, "-nr"]).no_repack is True
    assert _ns([*_GEN, "--no-mmap"]).load_mode == "none" and _ns([*_GEN, "--mlock"]).load_mode == "mmap+mlock"
    m_on, m_off = load_model(_ns(_GEN)), load_model(_ns([*_GEN, "-nr", "--no-mmap"]))
    try:
        assert m_on.repack and not m_off.repack
        # the same weights either way: greedy text of a short prompt agrees
        from llama_spec import SamplerParams, SpeculativeGenerator
        texts = []
        for m in (m_on, m_off):
            g = SpeculativeGenerator(m, None, n_ctx=128, n_threads=THREADS)
            texts.append(g.generate("Paris is", sampling=SamplerParams(temp=0), n_predict=4).tokens)
            g.close()
        assert len(texts[0]) == len(texts[1]) == 4
    finally:
        m_on.close()
        m_off.close()


def test_kv_cache_types_and_ubatch_reach_the_context(smollm_path):
    from llama_spec.cli.args import KV_CACHE_TYPE_NAMES
    from llama_spec.cli.build import build_generator
    from llama_spec.llama.context import KV_CACHE_TYPES

    assert set(KV_CACHE_TYPE_NAMES) == set(KV_CACHE_TYPES)
    sizes = {}
    for ct in ("f16", "q8_0", "q4_0"):
        gen, _ = build_generator(_ns([*_GEN, "-ctk", ct, "-ctv", ct, "-ub", "64", "-fa", "on"]))
        assert gen.ctx.n_ubatch == 64
        gen.ctx.prefill(gen.model.tokenize("hello world, " * 8))
        sizes[ct] = len(gen.ctx.save_state())  # the KV cells are stored in the cache's type
        gen.close()
        gen.model.close()
    assert sizes["f16"] > sizes["q8_0"] > sizes["q4_0"], sizes


def test_flag_values_are_checked():
    import pytest

    from llama_spec.cli.args import flash_attn_value

    assert [flash_attn_value(v) for v in ("on", "OFF", "auto", "1", "false")] == ["on", "off", "auto", "on", "off"]
    for bad in (["-fa", "sometimes"], ["-ctk", "q3_k"]):
        with pytest.raises(SystemExit):
            _ns([*_GEN, *bad])


def test_spec_type_chain_and_ngram_n_max(smollm_path):
    from llama_spec.cli.build import build_generator
    from llama_spec.drafters.chain import ChainDrafter

    gen, _ = build_generator(_ns([*_GEN, "--spec-type", "ngram-mod"]))
    assert gen.drafter.name == "ngram-mod" and gen.n_max == 64  # llama.cpp: the member's own n_max
    gen.close()
    gen, _ = build_generator(_ns([*_GEN, "--spec-type", "draft-simple,ngram-simple", "-md", "smollm2-135m",
                                  "--spec-ngram-simple-size-m", "20", "--spec-draft-n-max", "2"]))
    d = gen.drafter
    assert isinstance(d, ChainDrafter) and d.name == "ngram-simple,draft-simple"  # llama.cpp's order
    assert gen.n_max == 20 and d.drafters[0].size_m == 20 and d.drafters[1].n_max_cap == 2
    assert list(d.gates) == [1]   # the chain's gate (default on) covers the model drafter only
    from llama_spec import SamplerParams

    d.drafters[1].configure(SamplerParams(temp=0), 0)
    prop = d.drafters[1].draft(gen.model.tokenize("one two three"), 20, 0.0)
    assert len(prop.tokens) == 2  # draft-simple keeps --spec-draft-n-max inside the chain
    gen.close()
    gen, _ = build_generator(_ns([*_GEN, "--spec-type", "ngram-mod,draft-simple", "-md", "smollm2-135m",
                                  "--no-spec-chain-gate"]))
    assert isinstance(gen.drafter, ChainDrafter) and gen.drafter.gates == {}
    gen.close()


def test_plot_without_matplotlib_fails_before_generating(capsys, monkeypatch):
    import sys

    # hidden as a missing install looks to an import (the check imports it, so a broken install fails too)
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    code, out, err = _main(capsys, [*_GEN, "--spec-type", "ngram-simple", "--spec-topk-stats",
                                    "--spec-topk-stats-plot", "x.png"])
    assert code == 2 and "matplotlib" in err and "pip install 'llama-spec[plot]'" in err and out == "" and "loading" not in err


def test_reverse_prompt_of_one_character_never_reaches_stdout(smollm_path, capsys):
    # the token completing a stop string is emitted before the cut: stdout must hold it back
    code, full, _ = _main(capsys, [*_GEN, "-n", "24", "--temp", "0"])
    ch = next(c for c in full[4:] if not c.isspace())
    code, cut, err = _main(capsys, [*_GEN, "-n", "24", "--temp", "0", "-r", ch])
    assert code == 0 and "stop=stop" in err
    assert ch not in cut and cut.rstrip("\n") == full[: full.index(ch)]


def test_spec_verify_selects_the_rule(smollm_path, capsys, tmp_path):
    stats = {}
    for rule in ("block", "token", "exact-match"):
        f = tmp_path / f"{rule}.json"
        code, out, err = _main(capsys, [*_GEN, "-md", "smollm2-135m", "-n", "24", "--temp", "0.8", "-s", "3",
                                        "--spec-verify", rule, "--stats-json", str(f)])
        assert code == 0 and f"rule={rule}" in err and "tokens_per_verification=" in err
        stats[rule] = json.loads(f.read_text())
        assert stats[rule]["rule"] == rule and stats[rule]["drafted"] > 0
    # the exact-match rule keeps a draft only when the target's own sample equals it
    assert stats["exact-match"]["extra_accepted"] == 0
    code, _, err = _main(capsys, [*_GEN, "-md", "smollm2-135m", "-n", "8", "--spec-verify", "block",
                                  "--no-spec-draft-sample"])
    assert code == 0 and "rule=exact-match" in err
