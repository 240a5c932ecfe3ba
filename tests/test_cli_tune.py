"""`llama-spec tune` and the --spec-auto flags on the tiny test model (SmolLM2-135M drafting for itself)."""

from __future__ import annotations

import json
import sys

from conftest import THREADS


def _main(capsys, args):
    from llama_spec.cli import main

    code = main(args)
    cap = capsys.readouterr()
    return code, cap.out, cap.err


_TUNE = ["tune", "-m", "smollm2-135m", "-md", "smollm2-135m", "-c", "512", "-t", str(THREADS), "-n", "8",
         "--spec-draft-n-max", "2"]


def test_tune_prints_the_table_and_saves_a_model_generate_starts_from(smollm_path, capsys, tmp_path):
    saved, png = tmp_path / "cost.json", tmp_path / "tune.png"
    code, out, err = _main(capsys, [*_TUNE, "--temps", "0,0.8", "--save", str(saved), "--plot", str(png)])
    assert code == 0, err
    assert "greedy:" in out and "token/t<1:" in out and out.count("the controller would pick:") == 2
    for option in ("plain", "draft-simple"):
        assert option in out
    data = json.loads(saved.read_text())
    assert data["version"] == 1 and data["cost"]["cells"] and data["survival"]
    assert png.stat().st_size > 1000
    code, out, err = _main(capsys, ["generate", "-m", "smollm2-135m", "-md", "smollm2-135m", "-c", "256",
                                    "-t", str(THREADS), "-p", "The capital of France is", "-n", "12", "--temp", "0",
                                    "--spec-auto", "--spec-cost-model", str(saved)])
    assert code == 0, err
    assert "llama-spec: auto chose plain" in err and "llama-spec: auto measured: c(1)=" in err


def test_tune_measures_the_trees_of_spec_draft_tree_at_every_depth(smollm_path, capsys):
    code, out, err = _main(capsys, [*_TUNE, "--temps", "0", "--spec-draft-tree", "2,1"])
    assert code == 0, err
    rows = [line.split() for line in out.splitlines() if line.strip().startswith("draft-simple tree 2,1 ")]
    assert [r[3] for r in rows] == ["1", "2"], out   # depth 1 and 2, each measured: tokens/s a number
    assert all(float(r[4]) >= 1.0 and float(r[-1]) > 0 for r in rows), out


def test_tune_needs_a_drafter_and_the_plot_extra(capsys, monkeypatch):
    code, out, err = _main(capsys, ["tune", "-m", "smollm2-135m"])
    assert code == 2 and "tune needs a drafter" in err and out == ""
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    code, out, err = _main(capsys, [*_TUNE, "--plot", "x.png"])
    assert code == 2 and "pip install 'llama-spec[plot]'" in err and "loading" not in err


def test_spec_auto_flags_reach_the_generator(smollm_path):
    from llama_spec.cli import build_parser
    from llama_spec.cli.build import build_generator

    base = ["generate", "-m", "smollm2-135m", "-c", "256", "-t", str(THREADS), "-p", "x", "--spec-type", "ngram-simple"]
    gen, _ = build_generator(build_parser().parse_args([*base, "--spec-auto"]))
    assert gen.controller is not None
    gen.close()
    gen, _ = build_generator(build_parser().parse_args([*base, "--no-spec-auto"]))
    assert gen.controller is None
    gen.close()
