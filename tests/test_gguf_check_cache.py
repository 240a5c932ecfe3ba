"""GGUF checks remembered between runs (models/gguf_check.py): a file that passed is not walked
again while the bytes the check reads hash the same; a file changed in place is, even with the same
size and modification time (what a cache keyed by size and mtime would miss); a failure is never
remembered; the cache switched off or unwritable changes nothing but the time."""

from __future__ import annotations

import json
import os

import pytest
from test_hostile import _script

from llama_spec.models import gguf_check
from llama_spec.models.gguf_check import ENV_GGUF_CHECK_CACHE, check_gguf


@pytest.fixture
def walks(monkeypatch):
    calls: list[int] = []
    real = gguf_check._walk

    def counted(buf):
        calls.append(1)
        return real(buf)

    monkeypatch.setattr(gguf_check, "_walk", counted)
    return calls


@pytest.fixture
def tiny(tmp_path):
    return _script("fuzz_gguf").write_tiny_llama(tmp_path / "ok.gguf")


def test_a_file_that_passed_is_not_walked_again(tmp_path, monkeypatch, walks, tiny):
    cache = tmp_path / "seen.json"
    monkeypatch.setenv(ENV_GGUF_CHECK_CACHE, str(cache))
    check_gguf(tiny)
    check_gguf(tiny)
    assert len(walks) == 1
    size, end, digest = json.loads(cache.read_text())[str(tiny.resolve())]
    assert size == tiny.stat().st_size and 24 < end < size and len(digest) == 40


def test_a_file_changed_in_place_is_checked_again(tmp_path, monkeypatch, walks, tiny):
    monkeypatch.setenv(ENV_GGUF_CHECK_CACHE, str(tmp_path / "seen.json"))
    check_gguf(tiny)
    st = tiny.stat()
    bad = tiny.read_bytes().replace(b"<0x0D>", b"<0x0C>", 1)   # a repeated token: llama.cpp would abort
    tiny.write_bytes(bad)
    os.utime(tiny, ns=(st.st_atime_ns, st.st_mtime_ns))        # same size, same mtime
    assert tiny.stat().st_size == st.st_size and tiny.stat().st_mtime_ns == st.st_mtime_ns
    with pytest.raises(ValueError, match="appears more than once"):
        check_gguf(tiny)
    with pytest.raises(ValueError, match="appears more than once"):   # a failure is not remembered
        check_gguf(tiny)
    assert len(walks) == 3


def test_off_or_unwritable_checks_every_time(tmp_path, monkeypatch, walks, tiny):
    monkeypatch.setenv(ENV_GGUF_CHECK_CACHE, "0")
    check_gguf(tiny)
    check_gguf(tiny)
    assert len(walks) == 2
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    monkeypatch.setenv(ENV_GGUF_CHECK_CACHE, str(blocker / "seen.json"))   # cannot be written
    check_gguf(tiny)
    check_gguf(tiny)
    assert len(walks) == 4
    cache = tmp_path / "garbage.json"
    cache.write_text("{not json")                                        # cannot be read: rewritten
    monkeypatch.setenv(ENV_GGUF_CHECK_CACHE, str(cache))
    check_gguf(tiny)
    check_gguf(tiny)
    assert len(walks) == 5 and str(tiny.resolve()) in json.loads(cache.read_text())


def test_the_oldest_file_is_forgotten_first(tmp_path, monkeypatch, walks):
    cache = tmp_path / "seen.json"
    monkeypatch.setenv(ENV_GGUF_CHECK_CACHE, str(cache))
    monkeypatch.setattr(gguf_check, "_MAX_REMEMBERED", 2)
    fz = _script("fuzz_gguf")
    files = [fz.write_tiny_llama(tmp_path / f"m{i}.gguf") for i in range(3)]
    for f in files:
        check_gguf(f)
    assert list(json.loads(cache.read_text())) == [str(f.resolve()) for f in files[1:]]
    check_gguf(files[0])   # walked again
    assert len(walks) == 4
