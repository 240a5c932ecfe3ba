"""The CLI loads the draft model in a thread beside the target where both stay in host memory
(cli/build.py ``load_models``): which thread loads what, and errors from either load."""

from __future__ import annotations

import threading

import pytest
from conftest import THREADS
from test_cli import _ns

_ARGS = ["generate", "-m", "smollm2-135m", "-c", "256", "-t", str(THREADS), "-p", "Hi"]


class _Recorder:
    """Wraps cli.build.Model: records (file name, loading thread) and which models were closed."""

    def __init__(self, monkeypatch):
        from llama_spec.cli import build

        self.loads: list[tuple[str, str]] = []
        self.closed: list[tuple[str, str]] = []   # (path, loading thread) of each close() call
        self.kept: list = []   # every model loaded, held so that no garbage collection closes one
        real = build.Model

        def model(path, **kw):
            who = (str(path), threading.current_thread().name)
            self.loads.append(who)
            m = real(path, **kw)
            close = m.close

            def closing():
                self.closed.append(who)
                close()
            m.close = closing
            self.kept.append(m)
            return m
        monkeypatch.setattr(build, "Model", model)


def test_the_draft_model_loads_in_a_thread_beside_the_target(smollm_path, monkeypatch):
    from llama_spec.cli.build import load_models

    rec = _Recorder(monkeypatch)
    target, draft = load_models(_ns([*_ARGS, "-md", "smollm2-135m"]), ["draft-simple"])
    try:
        assert draft is not None and draft.n_vocab == target.n_vocab > 0
        assert sorted(rec.loads) == sorted([(str(smollm_path), threading.current_thread().name),
                                            (str(smollm_path), "llama-spec-draft-load_0")]), rec.loads
    finally:
        draft.close()
        target.close()


def test_one_after_the_other_when_switched_off_and_no_draft_model_without_draft_simple(smollm_path, monkeypatch):
    from llama_spec.cli.build import ENV_LOAD_BESIDE, load_models

    rec = _Recorder(monkeypatch)
    monkeypatch.setenv(ENV_LOAD_BESIDE, "0")
    target, draft = load_models(_ns([*_ARGS, "-md", "smollm2-135m"]), ["draft-simple"])
    assert draft is not None
    draft.close()
    target.close()
    assert [t for _, t in rec.loads] == [threading.current_thread().name] * 2, rec.loads
    target, draft = load_models(_ns([*_ARGS, "-md", "smollm2-135m"]), ["ngram-simple"])
    target.close()
    assert draft is None and len(rec.loads) == 3


def test_a_draft_model_that_fails_to_load_fails_the_run_and_a_failed_target_frees_the_draft(
        smollm_path, tmp_path, monkeypatch):
    from llama_spec.cli.build import load_models
    from llama_spec.errors import ModelLoadError

    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF" + b"\0" * 60)   # a GGUF header and nothing else
    rec = _Recorder(monkeypatch)
    with pytest.raises((ModelLoadError, ValueError)):
        load_models(_ns([*_ARGS, "-md", str(bad)]), ["draft-simple"])
    with pytest.raises((ModelLoadError, ValueError)):
        load_models(_ns([*_ARGS, "-m", str(bad), "-md", "smollm2-135m"]), ["draft-simple"])
    # the first run's target (its draft failed) and the second's draft (its target failed) were closed
    assert (str(bad), "llama-spec-draft-load_0") in rec.loads, rec.loads
    assert (str(smollm_path), "llama-spec-draft-load_0") in rec.loads, rec.loads
    main = threading.current_thread().name
    assert rec.closed == [(str(smollm_path), main), (str(smollm_path), "llama-spec-draft-load_0")], rec.closed
