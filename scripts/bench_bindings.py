"""Plain greedy decoding through two bindings of the same llama.cpp: llama-spec vs llama-cpp-python.

llama-cpp-python 0.3.36 vendors the very llama.cpp commit we pin (0c1e57098). It is installed in
its own virtual environment (default /tmp/lcp-venv) and driven there as a subprocess that keeps
its model loaded and answers one request per stdin line; llama-spec runs in this process. Per
model and prompt the runs are interleaved ours, theirs, theirs, ours; both sides: same GGUF,
same threads, n_ctx 2048, n_batch 512, flash attention on (ours: "auto", which resolves to on on
CPU), weight repacking on (both libraries' default), temperature 0, repeat penalty off, EOS not
stopping. Decode t/s = (n - 1) / (time of the n-th token - time of the first token), the first
token being the one sampled from the prompt's logits, so prompt processing is excluded the same
way on both sides. The greedy tokens of both are compared (reported, not required).

The venv is created when missing (slow path: it compiles llama.cpp once more, ~7 min on 2 cores):
  python -m venv /tmp/lcp-venv
  CFLAGS/CXXFLAGS="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16" \
  CMAKE_ARGS="-DGGML_NATIVE=ON -DLLAVA_BUILD=OFF ..." /tmp/lcp-venv/bin/pip install llama-cpp-python==0.3.36
(AMX off as in our own build: this llama.cpp's AMX kernels crash on this CPU; the flags go
through CFLAGS/CXXFLAGS because scikit-build-core splits CMAKE_ARGS on spaces.) The sdist
comes from the package's cache when build_llama already fetched it (same sha256), else PyPI.

  python scripts/bench_bindings.py                      # 0.5B and 1.5B, 128 tokens, 2 prompts per class
  python scripts/bench_bindings.py --smoke              # SmolLM2-135M, 1 prompt, 32 tokens (needs the venv)
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_spec import (  # noqa: E402
    fmt_spread,
    load_prompts,
    loadavg,
    machine_info,
    resolve,
    summarize,
    write_json,
    write_text,
)

LCP_VERSION = "0.3.36"
DEFAULT_VENV = Path(os.environ.get("LLAMA_SPEC_LCP_VENV", "/tmp/lcp-venv"))
NO_AMX = "-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
LCP_CMAKE_ARGS = ("-DGGML_NATIVE=ON -DLLAVA_BUILD=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF "
                  "-DLLAMA_BUILD_TOOLS=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_APP=OFF")

# Runs inside the llama-cpp-python venv: one JSON request per stdin line, one JSON reply per line.
WORKER = r'''
import json, sys, time
import llama_cpp
from llama_cpp import Llama
cfg = json.loads(sys.argv[1])
llm = Llama(model_path=cfg["model"], n_ctx=cfg["n_ctx"], n_batch=512, n_threads=cfg["threads"],
            n_threads_batch=cfg["threads"], n_gpu_layers=cfg["n_gpu_layers"], flash_attn=True, verbose=False)
print(json.dumps({"ready": True, "version": llama_cpp.__version__}), flush=True)
for line in sys.stdin:
    req = json.loads(line)
    toks = llm.tokenize(req["prompt"].encode(), add_bos=True, special=False)
    out, times = [], []
    for tok in llm.generate(toks, temp=0.0, top_k=1, repeat_penalty=1.0, reset=True):
        times.append(time.perf_counter())
        out.append(int(tok))
        if len(out) >= req["n"]:
            break
    tps = (len(out) - 1) / (times[-1] - times[0]) if len(out) > 1 else 0.0
    print(json.dumps({"tps": tps, "tokens": out}), flush=True)
'''


# The same request loop over llama-spec, for --fresh-process (both sides in their own process).
OURS_WORKER = r'''
import json, sys
sys.path.insert(0, sys.argv[2])
from bench_bindings import ours_run
from llama_spec import Model, SpeculativeGenerator
cfg = json.loads(sys.argv[1])
model = Model(cfg["model"], n_gpu_layers=cfg["n_gpu_layers"])
gen = SpeculativeGenerator(model, None, n_ctx=cfg["n_ctx"], n_threads=cfg["threads"])
print(json.dumps({"ready": True, "version": "llama-spec"}), flush=True)
for line in sys.stdin:
    req = json.loads(line)
    print(json.dumps(ours_run(gen, req["prompt"], req["n"])), flush=True)
'''


def venv_python(venv: Path) -> Path:
    return venv / "bin" / "python"


def venv_ok(venv: Path) -> str | None:
    py = venv_python(venv)
    if not py.exists():
        return None
    r = subprocess.run([str(py), "-c", "import llama_cpp; print(llama_cpp.__version__)"], capture_output=True,
                       text=True, timeout=120)
    v = r.stdout.strip()
    return v if r.returncode == 0 and v == LCP_VERSION else None


def ensure_venv(venv: Path, *, build: bool = True) -> str:
    """Create the venv with llama-cpp-python==0.3.36 if it is not there (minutes: compiles llama.cpp)."""
    v = venv_ok(venv)
    if v:
        return v
    if not build:
        raise SystemExit(f"{venv}: no llama-cpp-python {LCP_VERSION} (run without --no-build-venv to create it)")
    print(f"creating {venv} with llama-cpp-python {LCP_VERSION}: compiles llama.cpp (~7 min on 2 cores)",
          file=sys.stderr)
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    src = f"llama-cpp-python=={LCP_VERSION}"
    try:  # the same sdist build_llama fetched, sha256-checked (no second 77 MB download)
        import build_llama

        cached = build_llama.cache_root().parent / "sdist" / build_llama.SDIST_FILE
        if cached.exists() and build_llama._sha256(cached) == build_llama.SDIST_SHA256:
            src = str(cached)
    except Exception:  # noqa: BLE001 - fall back to PyPI
        pass
    env = dict(os.environ, CFLAGS=NO_AMX, CXXFLAGS=NO_AMX, CMAKE_ARGS=LCP_CMAKE_ARGS,
               CMAKE_BUILD_PARALLEL_LEVEL=str(os.cpu_count() or 2))
    t0 = time.perf_counter()
    subprocess.run([str(venv_python(venv)), "-m", "pip", "install", "--no-cache-dir", src], check=True, env=env)
    print(f"built llama-cpp-python in {time.perf_counter() - t0:.0f} s", file=sys.stderr)
    v = venv_ok(venv)
    if not v:
        raise SystemExit(f"{venv}: llama-cpp-python did not import after the install")
    return v


class LcpWorker:
    """A request loop in its own process: llama-cpp-python in its venv, or (ours=True) llama-spec."""

    def __init__(self, venv: Path, model: Path, threads: int, n_ctx: int, n_gpu_layers: int, *,
                 ours: bool = False) -> None:
        cfg = json.dumps({"model": str(model), "threads": threads, "n_ctx": n_ctx,
                          "n_gpu_layers": n_gpu_layers if n_gpu_layers >= 0 else -1})
        cmd = ([sys.executable, "-c", OURS_WORKER, cfg, str(Path(__file__).resolve().parent)] if ours
               else [str(venv_python(venv)), "-c", WORKER, cfg])
        self.p = subprocess.Popen(cmd, stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        hello = self._read()
        self.version = hello["version"]

    def _read(self) -> dict:
        line = self.p.stdout.readline()
        if not line:
            raise RuntimeError(f"worker died (exit {self.p.wait()})")
        return json.loads(line)

    def run(self, prompt: str, n: int) -> dict:
        self.p.stdin.write(json.dumps({"prompt": prompt, "n": n}) + "\n")
        self.p.stdin.flush()
        return self._read()

    def close(self) -> None:
        self.p.stdin.close()
        self.p.wait(timeout=60)


def ours_run(gen, prompt: str, n: int) -> dict:
    from llama_spec import SamplerParams

    times, toks = [], []
    for ev in gen.stream(prompt, sampling=SamplerParams(temp=0.0), n_predict=n, ignore_eos=True,
                         spec_draft_sample=False):
        times.append(time.perf_counter())
        toks.append(int(ev.token))
    return {"tps": (len(toks) - 1) / (times[-1] - times[0]) if len(toks) > 1 else 0.0, "tokens": toks}


def fresh_run(args, path: Path, text: str, *, ours: bool) -> dict:
    """One measured request in a process of its own (warmed up on the same prompt first)."""
    w = LcpWorker(args.venv, path, args.threads, args.n_ctx, args.n_gpu_layers, ours=ours)
    try:
        w.run(text, 8)
        return w.run(text, args.n_tokens)
    finally:
        w.close()


def bench_model(name: str, args, prompts) -> dict:
    from llama_spec import Model, SpeculativeGenerator

    path = resolve(name)
    if not args.fresh_process:
        model = Model(path, n_gpu_layers=args.n_gpu_layers)  # repack on: llama.cpp's default, as theirs
        gen = SpeculativeGenerator(model, None, n_ctx=args.n_ctx, n_threads=args.threads)
        lcp = LcpWorker(args.venv, path, args.threads, args.n_ctx, args.n_gpu_layers)
        ours_run(gen, prompts[0][2], 8)  # warm-up both
        lcp.run(prompts[0][2], 8)
    per = []
    for cls, idx, text in prompts:
        rec = {"class": cls, "prompt": idx, "ours": [], "theirs": []}
        for side in ("ours", "theirs", "theirs", "ours"):
            if args.fresh_process:
                r = fresh_run(args, path, text, ours=side == "ours")
            else:
                r = ours_run(gen, text, args.n_tokens) if side == "ours" else lcp.run(text, args.n_tokens)
            rec[side].append(r)
            print(f"  {path.name} {cls} #{idx} {side:6}: {r['tps']:6.2f} t/s", file=sys.stderr)
        rec["ratio"] = statistics.median(r["tps"] for r in rec["ours"]) / statistics.median(
            r["tps"] for r in rec["theirs"])
        rec["same_tokens"] = rec["ours"][0]["tokens"] == rec["theirs"][0]["tokens"]
        for side in ("ours", "theirs"):
            for r in rec[side]:
                r["n_tokens"] = len(r.pop("tokens"))
        per.append(rec)
    if args.fresh_process:
        version = venv_ok(args.venv)
    else:
        version = lcp.version
        lcp.close()
        gen.close()
        model.close()
    return {"model": path.name, "llama_cpp_python": version, "prompts": per,
            "ours_tps": summarize([r["tps"] for p in per for r in p["ours"]]),
            "theirs_tps": summarize([r["tps"] for p in per for r in p["theirs"]]),
            "ratio": summarize([p["ratio"] for p in per]),
            "same_tokens": sum(p["same_tokens"] for p in per), "n_prompts": len(per)}


def markdown(res: dict) -> str:
    m, c = res["machine"], res["config"]
    fresh = ", a fresh process per measured request on both sides" if c.get("fresh_process") else ""
    out = [f"Plain greedy decode, {c['n_tokens']} tokens, threads {c['threads']}{fresh}, llama-spec vs llama-cpp-python "
           f"{res['models'][0]['llama_cpp_python'] if res['models'] else '?'} (same llama.cpp commit); {m['cpu']} "
           f"({m['cores']} cores), {m['date']}; load `{m['uptime']}` → `{m.get('uptime_after', '')}`", "",
           "| model | prompts | llama-spec t/s (median [min–max]) | llama-cpp-python t/s | ours ÷ theirs (median over "
           "prompts [min–max]) | same greedy tokens |", "|---|---|---|---|---|---|"]
    for r in res["models"]:
        out.append(f"| {r['model']} | {r['n_prompts']} | {fmt_spread(r['ours_tps'])} | {fmt_spread(r['theirs_tps'])} | "
                   f"**{fmt_spread(r['ratio'], 3)}** | {r['same_tokens']}/{r['n_prompts']} |")
    out += ["", f"Command: `{c['command']}`", ""]
    return "\n".join(out)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("--models", nargs="+", default=["qwen2.5-coder-0.5b", "qwen2.5-coder-1.5b"])
    ap.add_argument("--n-prompts", type=int, default=2, help="prompts per class (code, prose)")
    ap.add_argument("--n-tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=min(os.cpu_count() or 2, 8))
    ap.add_argument("--n-ctx", type=int, default=2048)
    ap.add_argument("--n-gpu-layers", type=int, default=-1)
    ap.add_argument("--venv", type=Path, default=DEFAULT_VENV)
    ap.add_argument("--no-build-venv", action="store_true", help="fail instead of creating a missing venv")
    ap.add_argument("--json", default=None)
    ap.add_argument("--md", default=None)
    ap.add_argument("--smoke", action="store_true", help="SmolLM2-135M, 1 prompt, 32 tokens")
    ap.add_argument("--fresh-process", action="store_true",
                    help="run every measured request in a new process on both sides (ours too), so "
                         "per-process effects (memory placement of the weights) average out")
    args = ap.parse_args(argv)
    if args.smoke:
        args.models, args.n_prompts, args.n_tokens = ["smollm2-135m"], 1, 32
    ensure_venv(args.venv, build=not args.no_build_venv)
    prompts = load_prompts(["code", "prose"], args.n_prompts)
    if args.smoke:
        prompts = prompts[:1]
    machine = machine_info()
    t0 = time.perf_counter()
    models = [bench_model(m, args, prompts) for m in args.models]
    machine["uptime_after"] = loadavg()
    res = {"kind": "bench_bindings", "smoke": bool(args.smoke), "machine": machine,
           "wall_s": time.perf_counter() - t0, "models": models,
           "config": {"models": args.models, "n_tokens": args.n_tokens, "threads": args.threads, "n_ctx": args.n_ctx,
                      "n_prompts": len(prompts), "venv": str(args.venv),
                      "fresh_process": bool(args.fresh_process),
                      "command": " ".join([Path(sys.executable).name, *sys.argv])}}
    md = markdown(res)
    print(md)
    write_json(args.json, res)
    write_text(args.md, md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
