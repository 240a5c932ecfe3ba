"""SIGINT during a long decode: the API raises KeyboardInterrupt promptly and the same generator
then serves a new request correctly; the CLI exits 130 after flushing the text so far.

    python scripts/interrupt_check.py [--model qwen2.5-coder-1.5b] [--prompt-tokens 1500] [--repeats 3]

The API check runs a child process that prefills a long prompt (n_batch chunks; each chunk is
one llama.cpp decode, stopped between graph nodes by the abort callback) and reports the time
from the parent's SIGINT to the KeyboardInterrupt it caught.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time

CHILD = r"""
import json, sys, time
from llama_spec import Model, SamplerParams, SpeculativeGenerator
from llama_spec.models.registry import resolve_model
path, n_prompt = resolve_model(sys.argv[1]), int(sys.argv[2])
m = Model(path)
gen = SpeculativeGenerator(m, None, n_ctx=n_prompt + 256, n_batch=512, n_threads=2)
sp = SamplerParams(temp=0)
long_prompt = list(m.tokenize("The history of the world, " * (n_prompt // 5)))[:n_prompt]
print("READY", flush=True)
t_caught = None
try:
    gen.generate(long_prompt, sampling=sp, n_predict=200, ignore_eos=True)
    print("FINISHED", flush=True)
except KeyboardInterrupt:
    t_caught = time.time()
after = gen.generate("The capital of France is", sampling=sp, n_predict=8).tokens
ref_gen = SpeculativeGenerator(m, None, n_ctx=256, n_threads=2)
ref = ref_gen.generate("The capital of France is", sampling=sp, n_predict=8).tokens
print("RESULT " + json.dumps({"t_caught": t_caught, "same_after": after == ref}), flush=True)
"""


def _default_sigint() -> None:
    # A child inherits an ignored SIGINT (Python then installs no KeyboardInterrupt handler): some
    # parents ignore it, e.g. a pytest-xdist worker after some test in the suite (seen in CI).
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def api_check(model: str, n_prompt: int, delay: float = 1.0, timeout: float = 600) -> dict:
    """One child run: seconds from SIGINT to KeyboardInterrupt, and whether the next request is right."""
    p = subprocess.Popen([sys.executable, "-c", CHILD, model, str(n_prompt)], stdout=subprocess.PIPE,
                         stderr=subprocess.DEVNULL, text=True, preexec_fn=_default_sigint)
    assert p.stdout is not None
    deadline = time.monotonic() + timeout
    for line in p.stdout:
        if line.startswith("READY"):
            break
    time.sleep(delay)   # inside the prefill by now
    t_sent = time.time()
    p.send_signal(signal.SIGINT)
    res: dict = {"finished_before_signal": False}
    for line in p.stdout:
        if line.startswith("FINISHED"):
            res["finished_before_signal"] = True
        if line.startswith("RESULT "):
            r = json.loads(line[7:])
            res["latency_s"] = None if r["t_caught"] is None else round(r["t_caught"] - t_sent, 3)
            res["same_after"] = r["same_after"]
        if time.monotonic() > deadline:
            break
    p.wait(timeout=max(1.0, deadline - time.monotonic()))
    res["rc"] = p.returncode
    return res


def cli_check(model: str, timeout: float = 600) -> dict:
    """`llama-spec generate` interrupted after its first output: exit code and stdout's UTF-8."""
    p = subprocess.Popen([sys.executable, "-m", "llama_spec", "generate", "-m", model, "-c", "2048", "-t", "2",
                          "-p", "Écris une très longue histoire en français, avec des accents: ", "-n", "1500",
                          "--ignore-eos", "--temp", "0.8", "-s", "1"],
                         stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, preexec_fn=_default_sigint)
    assert p.stdout is not None
    os.set_blocking(p.stdout.fileno(), True)
    got = p.stdout.read1(64) if hasattr(p.stdout, "read1") else p.stdout.read(64)
    time.sleep(0.5)
    p.send_signal(signal.SIGINT)
    rest = p.stdout.read()
    rc = p.wait(timeout=timeout)
    data = got + rest
    try:
        data.decode("utf-8")
        utf8 = True
    except UnicodeDecodeError:
        utf8 = False
    return {"rc": rc, "bytes": len(data), "utf8_ok": utf8}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="qwen2.5-coder-1.5b")
    ap.add_argument("--prompt-tokens", type=int, default=1500)
    ap.add_argument("--repeats", type=int, default=3)
    ns = ap.parse_args()
    runs = [api_check(ns.model, ns.prompt_tokens) for _ in range(ns.repeats)]
    cli = cli_check(ns.model)
    print(json.dumps({"api": runs, "cli": cli}, indent=1))
    ok = all(r.get("latency_s") is not None and r["latency_s"] < 1.0 and r["same_after"] for r in runs)
    ok = ok and cli["rc"] == 130 and cli["utf8_ok"]
    print("PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
