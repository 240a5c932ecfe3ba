"""numba's first call in a process costs ~0.45 s (its compiler target is set up then; 2-core Intel
VM), so: greedy speculative verification calls no kernel (kernels/token.py, ``p_is_normalized``),
and a generator with a drafter and a fixed configuration sets numba up in a thread when a sampled
request is added, never for a greedy one, nor under the controller (kernels/warmup.py), loading the
very signature the token rule calls. Each check runs in a fresh process."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from conftest import THREADS

_SNIPPET = """
import json, sys
import numba
from llama_spec import DraftModelDrafter, Model, SamplerParams, SpeculativeGenerator
from llama_spec.generation import core
from llama_spec.kernels import block, token, tree, tree_shape, warmup

def compiled():
    return sorted(f"{m.__name__}.{n}" for m in (token, block, tree, tree_shape) for n, d in vars(m).items()
                  if isinstance(d, numba.core.registry.CPUDispatcher) and d.signatures)

if sys.argv[2] == "no-warm-up":
    core.warm_up_in_background = lambda: None
m = Model(sys.argv[1], repack=False)
gen = SpeculativeGenerator(m, DraftModelDrafter(m, n_ctx=256), n_ctx=256, n_max=3, auto=sys.argv[2] == "auto")
out = {"thread_before": warmup._thread is not None}
if sys.argv[2] == "warm-up":
    warmup.warm_up_in_background().join(60)
    out["built"] = [str(s) for s in token.accept_step_kernel.signatures]
for temp in (0.0, 0.8):
    r = gen.generate("The capital of France is", n_predict=12, sampling=SamplerParams(temp=temp), seed=1)
    out[str(temp)] = {"drafted": r.stats.drafted, "compiled": compiled(),
                      "signatures": [str(s) for s in token.accept_step_kernel.signatures],
                      "thread": warmup._thread is not None}
print(json.dumps(out))
"""


def _run(smollm_path, mode: str) -> dict:
    p = subprocess.run([sys.executable, "-c", _SNIPPET, str(smollm_path), mode], capture_output=True, text=True,
                       timeout=300, env={**os.environ, "LLAMA_SPEC_THREADS": str(THREADS)})
    assert p.returncode == 0, p.stderr[-2000:]
    return json.loads(p.stdout.strip().splitlines()[-1])


def test_greedy_speculative_decoding_compiles_no_kernel_and_sampled_decoding_does(smollm_path):
    out = _run(smollm_path, "no-warm-up")
    assert out["0.0"]["drafted"] > 0 and out["0.0"]["compiled"] == [], out
    assert out["0.8"]["drafted"] > 0 and "llama_spec.kernels.token.accept_step_kernel" in out["0.8"]["compiled"], out


def test_the_warm_up_loads_the_signature_the_token_rule_calls(smollm_path):
    out = _run(smollm_path, "warm-up")
    assert len(out["built"]) == 1, out   # loaded before any request
    # the sampled run verified drafts with that signature: no second one compiled or loaded
    assert out["0.8"]["drafted"] > 0 and out["0.8"]["signatures"] == out["built"], out


def test_under_the_controller_nothing_is_warmed_ahead(smollm_path):
    out = _run(smollm_path, "auto")   # (it may never draft: the first sampled verification pays, once)
    assert out["0.0"]["thread"] is False and out["0.8"]["thread"] is False, out
    if out["0.8"]["drafted"]:   # (here it chose plain at temp 0.8: no draft, no kernel)
        assert "llama_spec.kernels.token.accept_step_kernel" in out["0.8"]["compiled"], out
    else:
        assert out["0.8"]["compiled"] == [], out


def test_the_warm_up_starts_with_the_first_sampled_request_only(smollm_path):
    out = _run(smollm_path, "lazy")
    # built and a greedy request run: no thread (a greedy run never needs numba)
    assert out["thread_before"] is False and out["0.0"]["thread"] is False, out
    assert out["0.8"]["thread"] is True and out["0.8"]["drafted"] > 0, out


def test_the_server_warms_up_at_its_start_when_it_speculates(smollm_path, monkeypatch):
    # (in this process, the warm-up and uvicorn's loop replaced: only whether `serve` asks for it)
    uvicorn = pytest.importorskip("uvicorn")
    from test_cli import _ns

    from llama_spec.cli.serve import cmd_serve
    from llama_spec.kernels import warmup

    asked: list[int] = []
    monkeypatch.setattr(warmup, "warm_up_in_background", lambda: asked.append(1))
    monkeypatch.setattr(uvicorn.Server, "run", lambda self: None)
    base = ["serve", "-m", str(smollm_path), "-nr", "-c", "256", "-np", "1", "-t", str(THREADS), "--port", "0"]
    assert cmd_serve(_ns(base)) == 0 and asked == []                     # no drafter: nothing to warm
    assert cmd_serve(_ns([*base, "-md", str(smollm_path)])) == 0 and asked == [1]
