"""Shared fixtures: test models from the registry (cached), native llama.cpp tools (cached)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # build_llama.py lives at the repository root

# Threads per test process: the cores divided among pytest-xdist's workers (the README's test
# command runs two), so no process oversubscribes the machine. llama.cpp's threads spin while
# they wait, and two 2-thread processes on 2 cores run several times slower than two 1-thread
# ones. Contexts built without n_threads read LLAMA_SPEC_THREADS (subprocesses inherit it).
# The worker count is known only once pytest configures (xdist sets its variables after this
# module is imported), so THREADS is settled in pytest_configure, before any test module imports it.
THREADS = max(1, os.cpu_count() or 1)

# The speculation controller (auto=True, the library's and the CLI's default) decides by measured
# time, so a seeded temp>0 run, a batch = solo comparison or a count of drafts depends on the
# machine's load. The suite runs the fixed configurations (auto off, today's behaviour exactly)
# unless a test asks for auto=True / --spec-auto (tests/test_controller*.py do); subprocesses inherit it.
os.environ.setdefault("LLAMA_SPEC_AUTO", "0")
# ... and a CLI run under --spec-auto starts cold: no cost model saved by another test (or by the
# user's own runs in ~/.cache) decides for it (tests/test_cost_cache.py turns the cache on).
os.environ.setdefault("LLAMA_SPEC_COST_CACHE", "0")
# ... and every GGUF is walked (no list of checked files in ~/.cache; tests/test_gguf_check_cache.py).
os.environ.setdefault("LLAMA_SPEC_GGUF_CHECK_CACHE", "0")


def pytest_configure(config: pytest.Config) -> None:
    global THREADS
    if getattr(config.option, "numprocesses", None) and not hasattr(config, "workerinput"):
        return  # the controller of an xdist run: its workers settle their own share
    workers = int(getattr(config, "workerinput", {}).get("workercount", 1))
    os.environ.setdefault("LLAMA_SPEC_THREADS", str(max(1, (os.cpu_count() or 1) // max(workers, 1))))
    THREADS = int(os.environ["LLAMA_SPEC_THREADS"])


def _model_path(name: str) -> Path:
    from llama_spec.testing.models import model_path

    return model_path(name, progress=False)


@pytest.fixture(scope="session")
def smollm_path() -> Path:
    return _model_path("smollm2-135m")


@pytest.fixture(scope="session")
def qwen05_path() -> Path:
    return _model_path("qwen2.5-coder-0.5b")


@pytest.fixture(scope="session")
def qwen15_path() -> Path:
    return _model_path("qwen2.5-coder-1.5b")


# Test models load with repack=False (llama.cpp's --no-repack): the repacked CPU kernels round
# a batch of k+1 tokens differently from k+1 single-token decodes, which would make greedy
# speculative output differ from plain decoding at near-ties for reasons outside the verifier.
# The native tools in the cross-checks run with -nr to match.
NO_REPACK = {"repack": False}


@pytest.fixture(scope="session")
def smollm(smollm_path):
    from llama_spec import Model

    m = Model(smollm_path, **NO_REPACK)
    yield m
    m.close()


@pytest.fixture(scope="session")
def qwen05(qwen05_path):
    from llama_spec import Model

    m = Model(qwen05_path, **NO_REPACK)
    yield m
    m.close()


@pytest.fixture(scope="session")
def qwen15(qwen15_path):
    from llama_spec import Model

    m = Model(qwen15_path, **NO_REPACK)
    yield m
    m.close()


@pytest.fixture(scope="session")
def mtp_path() -> Path:
    from llama_spec.testing.synthetic_mtp import synthetic_mtp_path

    return synthetic_mtp_path(sigma=0.0, seed=0)


@pytest.fixture(scope="session")
def mtp_model(mtp_path):
    from llama_spec import Model

    m = Model(mtp_path, load_mtp=True, **NO_REPACK)
    yield m
    m.close()


@pytest.fixture(scope="session")
def native_bin() -> Path:
    """llama.cpp's own tools, built once from the same source and flags as the package."""
    import build_llama

    tools = ["llama-completion", "llama-perplexity", "llama-speculative-simple"]
    return build_llama.build_tools(tools)


def run_native(native_bin: Path, tool: str, args: list[str], timeout: int = 900) -> subprocess.CompletedProcess:
    env = dict(os.environ, LLAMA_LOG_COLORS="0")
    return subprocess.run([str(native_bin / tool), *args], capture_output=True, text=True, timeout=timeout,
                          env=env, errors="replace")


def same_or_near_tie(model, ref, text: str, tol: float, **context_options) -> bool:
    """`text` is the greedy result `ref`'s text, or leaves it where ref's own top two tokens (one
    decode of prompt + ref's tokens so far, under `context_options`) are within `tol` logits and
    `text` goes on with the runner-up. For runs that decode in other batch shapes than `ref`
    (a concurrent server): a 1-row and a batched decode of the same tokens round apart (up to
    0.68 logits with flash attention off, 1.3 with it on: scripts/batch_shape_rounding.py), while
    a sequence given another's cells leaves its reference far from any tie."""
    from llama_spec.llama.context import Context

    if text == ref.text:
        return True
    j = 0
    while j < len(ref.tokens) and text.startswith(model.detokenize(ref.tokens[: j + 1])):
        j += 1
    if j == len(ref.tokens):
        return False
    toks = np.asarray([*ref.prompt_tokens, *ref.tokens[:j]], dtype=np.int32)
    with Context(model, n_ctx=max(512, len(toks) + 1), n_threads=2, **context_options) as ctx:
        logits = np.array(ctx.decode(toks, np.arange(len(toks), dtype=np.int32), 0, "last")[0])
    a = ref.tokens[j]
    b = int(next(t for t in np.argsort(logits)[::-1] if t != a))
    rest = text[len(model.detokenize(ref.tokens[:j])):]
    return bool(abs(logits[a] - logits[b]) < tol) and rest.startswith(model.detokenize([b]))


@pytest.fixture
def gpu_like_costs(monkeypatch):
    """The speculation controller's prices as on a GPU (extra rows and drafts nearly free): it
    drafts on most steps and chooses the tree or the chain by their measured acceptance, exploring
    the others (on a CPU, with the draft model as large as the target, it decodes plainly: 4 tree
    steps of 731 in tests/test_engine_distribution.py). Decoding and the rules are untouched."""
    from llama_spec.generation.controller import SpecController
    from llama_spec.generation.cost_model import CostModel

    monkeypatch.setattr(SpecController, "step_cost", lambda self, k_cap, n_seqs: 0.01 + 1e-4 * np.arange(k_cap + 1))
    monkeypatch.setattr(CostModel, "draft_cost", lambda self, name, k, gap=1: 1e-4 * (np.asarray(k, float) + 1.0))
    # (every drafter priced from the start, and its lazy sync free: the same prices by every accessor)
    monkeypatch.setattr(CostModel, "has_draft_cost", lambda self, name: True)
    monkeypatch.setattr(CostModel, "sync_cost", lambda self, name, gap: 0.0)
