"""The cost-model cache between CLI runs (generation/cost_cache.py): keyed by the setup, written
after a run, read by the next one, and never a reason for a run to fail."""

from __future__ import annotations

import json

from conftest import THREADS

from llama_spec.generation.controller import SpecController
from llama_spec.generation.cost_cache import (
    ENV_COST_CACHE,
    cache_path,
    cost_cache_dir,
    load_cached,
    save_cached,
)

_GEN = ["generate", "-m", "smollm2-135m", "-md", "smollm2-135m", "-c", "256", "-p", "The capital of France is",
        "-n", "12", "--temp", "0", "--spec-auto"]


def _ctl_with_costs() -> SpecController:
    ctl = SpecController()
    for n, s in ((1, 0.010), (2, 0.016), (4, 0.028), (1, 0.011)):
        ctl.decoded(n, 1, s)
    return ctl


def test_the_cache_folder_follows_the_environment(monkeypatch, tmp_path):
    for off in ("0", " Off ", "false", "NO"):   # (env.py's words for off, any case)
        monkeypatch.setenv(ENV_COST_CACHE, off)
        assert cost_cache_dir() is None and cache_path(["x"]) is None
    monkeypatch.setenv(ENV_COST_CACHE, str(tmp_path))
    assert cost_cache_dir() == tmp_path
    a, b = cache_path(["model", 2]), cache_path(["model", 4])
    assert a is not None and b is not None and a.parent == tmp_path and a != b and a == cache_path(["model", 2])
    monkeypatch.delenv(ENV_COST_CACHE)
    assert cost_cache_dir() is not None and cost_cache_dir().parts[-2:] == ("llama-spec", "cost-models")


def test_a_saved_model_loads_back_and_a_damaged_or_unwritable_one_is_only_a_warning(tmp_path):
    ctl = _ctl_with_costs()
    path = tmp_path / "sub" / "m.json"
    assert save_cached(ctl, path) is None and path.exists()
    assert not [p for p in path.parent.iterdir() if p.name.endswith(".tmp")]   # renamed into place
    data, why = load_cached(path)
    assert why is None and data is not None
    back = SpecController(cost_model=data)
    assert back.cost.to_dict() == ctl.cost.to_dict()
    assert load_cached(tmp_path / "absent.json") == (None, None)
    for bad in ("{not json", json.dumps({"cost": {"cells": "nonsense"}}), json.dumps([1, 2])):
        path.write_text(bad)
        data, why = load_cached(path)
        assert data is None and why is not None and "starting cold" in why
    blocker = tmp_path / "file"
    blocker.write_text("")
    why = save_cached(ctl, blocker / "m.json")   # its folder is a file
    assert why is not None and "not written" in why


def test_cache_file_names_the_setup(smollm_path, monkeypatch, tmp_path):
    from llama_spec.cli import build_parser
    from llama_spec.cli.build import cost_cache_file

    monkeypatch.setenv(ENV_COST_CACHE, str(tmp_path))

    def file(*more: str):
        return cost_cache_file(build_parser().parse_args([*_GEN, *more]))

    base = file("-t", "2")
    assert base is not None and base == file("-t", "2") and base.parent == tmp_path
    assert len({base, file("-t", "1"), file("-t", "2", "--spec-draft-n-max", "5"), file("-t", "2", "-nr")}) == 4
    assert cost_cache_file(build_parser().parse_args(["generate", "-m", "smollm2-135m", "-p", "x"])) is None


def test_a_second_cli_run_starts_from_the_first_runs_costs(smollm_path, monkeypatch, tmp_path, capsys):
    from llama_spec.cli import main

    cache = tmp_path / "cache"
    monkeypatch.setenv(ENV_COST_CACHE, str(cache))
    args = [*_GEN, "-t", str(THREADS)]
    at_start: list[tuple[bool, bool, list]] = []   # per run: (given a model, knows the draft cost, survival)
    init = SpecController.__init__

    def spy(self, *a, **kw):
        init(self, *a, **kw)
        at_start.append((kw.get("cost_model") is not None, "draft-simple" in self.cost.draft_lines,
                         [row[0] for row in self.accept.export()]))

    monkeypatch.setattr(SpecController, "__init__", spy)

    def run(tag: str) -> tuple[dict, str]:
        stats = tmp_path / f"{tag}.json"
        assert main([*args, "--stats-json", str(stats)]) == 0
        return json.loads(stats.read_text()), capsys.readouterr().err

    first, err = run("first")
    assert "auto starts from" not in err and at_start[0] == (False, False, [])
    # cold: the draft model's first turns draft at full length whatever they would pay
    assert first["drafted"] >= 2, err
    assert len(list(cache.glob("*.json"))) == 1
    second, err = run("second")
    assert "auto starts from the costs earlier runs measured" in err, err
    # the second controller knows the draft model's cost and its kept drafts before its first step, so it
    # owes the model no cold turns (what it then chooses is timed: not asserted)
    given, knows_cost, survival = at_start[1]
    assert given and knows_cost and ["draft-simple", "greedy", False] in survival, at_start
    assert second["tokens"] == first["tokens"]   # greedy: the same text whatever was chosen


def test_no_cache_is_read_or_written_when_it_is_off(smollm_path, monkeypatch, tmp_path, capsys):
    from llama_spec.cli import main

    monkeypatch.setenv(ENV_COST_CACHE, "off")
    monkeypatch.setenv("HOME", str(tmp_path))   # (where the default folder would be)
    assert main([*_GEN, "-t", str(THREADS)]) == 0
    assert "auto starts from" not in capsys.readouterr().err
    assert not list(tmp_path.rglob("*.json"))


def test_a_model_file_gone_after_the_run_is_a_warning_not_a_crash(monkeypatch, tmp_path, capsys):
    from types import SimpleNamespace

    from llama_spec.cli import build_parser
    from llama_spec.cli.build import save_cost_cache

    monkeypatch.setenv(ENV_COST_CACHE, str(tmp_path / "cache"))
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF")
    ns = build_parser().parse_args(["generate", "-m", str(model), "-md", str(model), "-p", "x"])
    ctl = _ctl_with_costs()
    ctl.choices["plain"] = 3
    model.unlink()   # (deleted while the run went on)
    save_cost_cache(ns, SimpleNamespace(controller=ctl))
    assert "warning: cost-model cache not written" in capsys.readouterr().err
    assert not (tmp_path / "cache").exists()
