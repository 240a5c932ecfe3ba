"""Build llama.cpp and the cffi binding over it.

Three steps, each usable on its own (``python build_llama.py --help``):

1. **source** - unpack the pinned llama.cpp tree from the ``llama-cpp-python==0.3.36`` sdist on
   PyPI (sha256 checked) once into the cache (``<cache>/src/<sha256[:16]>/llama.cpp``), or use
   ``LLAMA_CPP_DIR``. Keyed by content, so every clone and sdist install shares one build.
2. **cmake** - configure and build only the libraries the package needs (libllama, ggml with
   its CPU/CUDA/HIP and RPC backends, llama-common for the reasoning budget, and the RPC server)
   in a cached build folder keyed by source, backend and flags, so a second install reuses it.
3. **cffi** - the ``FFI`` object: declarations from ``llama_spec/_cdef/*.h`` plus the small
   ``extern "C"`` shim in ``llama_spec/_shim.cpp``; setup.py compiles it as an extension.

Environment:
  LLAMA_SPEC_BACKEND      cpu (default) | cuda | hip
  CMAKE_CUDA_ARCHITECTURES  cuda only; default "native" when a GPU is visible, else "90"
  AMDGPU_TARGETS          hip only; default gfx906 (MI50)
  CMAKE_ARGS              extra cmake arguments, passed through (as llama-cpp-python does)
  LLAMA_CPP_DIR           use this llama.cpp tree instead of the pinned one
  LLAMA_SPEC_BUILD_CACHE  where cached builds live (default ~/.cache/llama-spec/build)
  LLAMA_SPEC_AMX          1 = keep Intel AMX kernels (off by default: they crash in this llama.cpp)
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shlex
import shutil
import subprocess
import sys
import tarfile
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent
PKG = ROOT / "llama_spec"

SDIST_PROJECT = "llama-cpp-python"
SDIST_VERSION = "0.3.36"
SDIST_FILE = "llama_cpp_python-0.3.36.tar.gz"
SDIST_SHA256 = "832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e"
SDIST_PREFIX = "llama_cpp_python-0.3.36/vendor/llama.cpp/"
LLAMA_CPP_COMMIT = "0c1e57098"

# Targets the package needs at run time; tests add tools (llama-completion, ...) on demand.
LIB_TARGETS = ["llama", "ggml", "llama-common", "ggml-rpc-server"]
BACKENDS = ("cpu", "cuda", "hip")


class BuildError(RuntimeError):
    """A build step failed; the message carries the tool's own error text."""


def log(msg: str) -> None:
    print(f"[llama-spec build] {msg}", file=sys.stderr, flush=True)


def cache_root() -> Path:
    env = os.environ.get("LLAMA_SPEC_BUILD_CACHE")
    if env:
        return Path(env).expanduser()
    base = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"))
    return base / "llama-spec" / "build"


# ---------------------------------------------------------------------------------------------
# 1. source
# ---------------------------------------------------------------------------------------------

def _sdist_url() -> tuple[str, str]:
    """Find the pinned sdist on PyPI through the simple JSON API (PEP 691)."""
    index = os.environ.get("LLAMA_SPEC_PYPI_SIMPLE", "https://pypi.org/simple")
    req = urllib.request.Request(
        f"{index.rstrip('/')}/{SDIST_PROJECT}/",
        headers={"Accept": "application/vnd.pypi.simple.v1+json"},
    )
    with urllib.request.urlopen(req, timeout=60) as resp:
        data = json.load(resp)
    for f in data["files"]:
        if f["filename"] == SDIST_FILE:
            return f["url"], f["hashes"].get("sha256", "")
    raise BuildError(f"{SDIST_FILE} not found on {index}")


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def fetch_sdist() -> Path:
    """Download the pinned sdist once into the cache; verify its sha256 every time it is used."""
    dest = cache_root().parent / "sdist" / SDIST_FILE
    if dest.exists() and _sha256(dest) == SDIST_SHA256:
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    url, listed = _sdist_url()
    if listed and listed != SDIST_SHA256:
        raise BuildError(f"PyPI lists sha256 {listed} for {SDIST_FILE}, expected {SDIST_SHA256}")
    log(f"downloading {url}")
    tmp = dest.with_suffix(".part")
    with urllib.request.urlopen(url, timeout=120) as resp, open(tmp, "wb") as out:
        shutil.copyfileobj(resp, out, 1 << 20)
    got = _sha256(tmp)
    if got != SDIST_SHA256:
        tmp.unlink()
        raise BuildError(f"sha256 mismatch for {SDIST_FILE}: got {got}, expected {SDIST_SHA256}")
    tmp.replace(dest)
    return dest


def _skip_member(rel: str) -> bool:
    # vocab GGUFs, docs and media are 110 MB we never build from.
    return rel.endswith(".gguf") or rel.startswith(("docs/", "media/"))


def pinned_source_dir() -> Path:
    """Where the pinned tree is unpacked: inside the cache, keyed by the sdist's sha256, so every
    clone and every sdist install on this machine shares one source folder and one build."""
    return cache_root().parent / "src" / SDIST_SHA256[:16] / "llama.cpp"


def llama_source() -> tuple[Path, str]:
    """Return (source dir, source id). The id keys the build cache."""
    user = os.environ.get("LLAMA_CPP_DIR")
    if user:
        src = Path(user).expanduser().resolve()
        if not (src / "CMakeLists.txt").exists() or not (src / "include" / "llama.h").exists():
            raise BuildError(f"LLAMA_CPP_DIR={src} is not a llama.cpp tree (no CMakeLists.txt/include/llama.h)")
        return src, f"user:{src}"
    dest = pinned_source_dir()
    marker = dest / ".llama-spec-source"
    if marker.exists() and marker.read_text().strip() == SDIST_SHA256:
        return dest, f"sdist:{SDIST_SHA256}"
    sdist = fetch_sdist()
    log(f"unpacking llama.cpp {LLAMA_CPP_COMMIT} into {dest}")
    # Unpack next to the destination and rename, so an interrupted unpack never looks complete.
    tmp = dest.with_name(dest.name + ".part")
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    with tarfile.open(sdist) as tar:
        for m in tar.getmembers():
            if not m.name.startswith(SDIST_PREFIX):
                continue
            rel = m.name[len(SDIST_PREFIX):]
            if not rel or _skip_member(rel):
                continue
            m.name = rel
            tar.extract(m, tmp, filter="data")
    (tmp / ".llama-spec-source").write_text(SDIST_SHA256 + "\n")
    if dest.exists():
        shutil.rmtree(dest)
    tmp.rename(dest)
    return dest, f"sdist:{SDIST_SHA256}"


# ---------------------------------------------------------------------------------------------
# 2. cmake
# ---------------------------------------------------------------------------------------------

def backend() -> str:
    b = os.environ.get("LLAMA_SPEC_BACKEND", "cpu").strip().lower()
    if b not in BACKENDS:
        raise BuildError(f"LLAMA_SPEC_BACKEND={b!r}: expected one of {', '.join(BACKENDS)}")
    return b


def _is_x86() -> bool:
    import platform

    return platform.machine().lower() in ("x86_64", "amd64")


def _cuda_arch() -> str:
    arch = os.environ.get("CMAKE_CUDA_ARCHITECTURES")
    if arch:
        return arch
    # "native" needs a visible GPU at build time; otherwise build for Hopper (H100/H200).
    try:
        ok = subprocess.run(["nvidia-smi", "-L"], capture_output=True, timeout=20).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        ok = False
    return "native" if ok else "90"


def cmake_args(src: Path, bdir: Path) -> list[str]:
    b = backend()
    args = [
        "cmake", "-S", str(src), "-B", str(bdir), "-G", "Ninja",
        "-DCMAKE_BUILD_TYPE=Release",
        "-DBUILD_SHARED_LIBS=ON",
        # Libraries and tools sit side by side in bin/ and find each other through $ORIGIN,
        # so the copies inside the installed package work from any directory.
        "-DCMAKE_BUILD_WITH_INSTALL_RPATH=ON",
        "-DCMAKE_INSTALL_RPATH=$ORIGIN",
        "-DGGML_RPC=ON",
        "-DLLAMA_BUILD_COMMON=ON",
        "-DLLAMA_BUILD_TESTS=OFF",
        "-DLLAMA_BUILD_SERVER=OFF",
        "-DLLAMA_BUILD_APP=OFF",
        "-DLLAMA_BUILD_TOOLS=ON",      # configured, but only built on demand (tests, benchmarks)
        "-DLLAMA_BUILD_EXAMPLES=ON",
        "-DLLAMA_OPENSSL=OFF",
    ]
    if os.environ.get("LLAMA_SPEC_AMX", "0") != "1" and _is_x86():
        # llama.cpp 0c1e57098's AMX int8 matmul segfaults on Sapphire Rapids-class CPUs (its own
        # llama-completion crashes the same way; `--no-repack` avoids it). Build without AMX
        # unless asked: the AVX-512/VNNI kernels are used instead.
        no_amx = "-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
        args += [f"-DCMAKE_C_FLAGS={no_amx}", f"-DCMAKE_CXX_FLAGS={no_amx}"]
    if b == "cuda":
        args += ["-DGGML_CUDA=ON", f"-DCMAKE_CUDA_ARCHITECTURES={_cuda_arch()}"]
    elif b == "hip":
        targets = os.environ.get("AMDGPU_TARGETS", "gfx906")
        args += ["-DGGML_HIP=ON", f"-DAMDGPU_TARGETS={targets}", f"-DGPU_TARGETS={targets}"]
    args += shlex.split(os.environ.get("CMAKE_ARGS", ""))
    return args


def build_dir(src_id: str, src: Path, args_wo_paths: list[str]) -> Path:
    # The source path is part of the key: a CMake build folder is tied to one source folder.
    key = hashlib.sha256(json.dumps([src_id, str(src), args_wo_paths]).encode()).hexdigest()[:16]
    return cache_root() / f"{backend()}-{key}"


def _run_logged(cmd: list[str], logfile: Path, what: str) -> None:
    """Run a build command; on failure show the error lines, not a Python traceback."""
    with open(logfile, "a") as fh:
        fh.write(f"\n$ {shlex.join(cmd)}\n")
        fh.flush()
        proc = subprocess.run(cmd, stdout=fh, stderr=subprocess.STDOUT)
    if proc.returncode != 0:
        lines = logfile.read_text(errors="replace").splitlines()
        err = [ln for ln in lines if "error" in ln.lower() or "CMake Error" in ln]
        tail = "\n".join(err[-25:] if err else lines[-40:])
        raise BuildError(f"{what} failed (exit {proc.returncode}); full log: {logfile}\n{tail}")


def _configure(args: list[str], logfile: Path) -> None:
    """(Re)configure: cheap on a configured folder, and it points the cache at the cmake and
    ninja of *this* process (pip's isolated build environments vanish after each install)."""
    ninja = shutil.which("ninja")
    if ninja:
        args = [*args, f"-DCMAKE_MAKE_PROGRAM={ninja}"]
    _run_logged(args, logfile, "cmake configure")


def cmake_build(targets: list[str] | None = None) -> Path:
    """Configure (once) and build `targets` in the cached build folder; return its bin/ dir."""
    src, src_id = llama_source()
    probe = cmake_args(src, Path("<build>"))
    bdir = build_dir(src_id, src, [a for a in probe if a not in (str(src), "<build>")])
    args = cmake_args(src, bdir)
    bdir.mkdir(parents=True, exist_ok=True)
    logfile = bdir / "llama-spec-build.log"
    log(f"backend: {backend()}")
    log(f"cmake line: {shlex.join(args)}")
    log(f"build cache: {bdir}  (delete it, or all of {cache_root()}, to force a rebuild)")
    _configure(args, logfile)
    jobs = os.environ.get("CMAKE_BUILD_PARALLEL_LEVEL") or str(os.cpu_count() or 2)
    targets = targets or LIB_TARGETS
    if backend() == "cuda":
        targets = [*targets, "ggml-cuda"]
    elif backend() == "hip":
        targets = [*targets, "ggml-hip"]
    log(f"building {' '.join(targets)} with -j{jobs} (the first build takes minutes; later ones are cached)")
    _run_logged(["cmake", "--build", str(bdir), "-j", jobs, "--target", *targets], logfile, "cmake build")
    info = {
        "backend": backend(),
        "source_dir": str(src),
        "source_id": src_id,
        "llama_cpp_commit": LLAMA_CPP_COMMIT if src_id.startswith("sdist:") else None,
        "build_dir": str(bdir),
        "bin_dir": str(bdir / "bin"),
        "cmake_args": args,
    }
    (bdir / "llama-spec-build.json").write_text(json.dumps(info, indent=2))
    return bdir / "bin"


def build_info() -> dict:
    """The cached build the installed package came from (tests use it to build native tools)."""
    path = PKG / "_build_info.json"
    if path.exists():
        return json.loads(path.read_text())
    bin_dir = cmake_build()
    return json.loads((bin_dir.parent / "llama-spec-build.json").read_text())


def build_tools(tools: list[str]) -> Path:
    """Build llama.cpp's own tools (llama-completion, llama-perplexity, ...) in the same cache."""
    info = build_info()
    bdir = Path(info["build_dir"])
    missing = [t for t in tools if not (bdir / "bin" / t).exists()]
    if missing:
        jobs = os.environ.get("CMAKE_BUILD_PARALLEL_LEVEL") or str(os.cpu_count() or 2)
        log(f"building native tools {' '.join(missing)} in {bdir}")
        _configure(info["cmake_args"], bdir / "llama-spec-build.log")
        _run_logged(["cmake", "--build", str(bdir), "-j", jobs, "--target", *missing],
                    bdir / "llama-spec-build.log", "cmake build (tools)")
    return bdir / "bin"


def shared_libs(bin_dir: Path) -> list[Path]:
    """The shared libraries to ship, under the names their dependents ask for (SONAMEs)."""
    out = []
    for p in sorted(bin_dir.glob("lib*.so*")):
        if p.is_symlink() and p.name.endswith(".so"):
            continue  # the unversioned dev symlink is only for the link step
        if not p.is_symlink() and any(bin_dir.glob(p.name.rsplit(".so", 1)[0] + ".so.[0-9]")):
            continue  # the fully versioned file; its SONAME symlink is shipped instead
        out.append(p)
    return out


# ---------------------------------------------------------------------------------------------
# 3. cffi
# ---------------------------------------------------------------------------------------------

PREAMBLE = '#include "llama.h"\n#include "ggml-backend.h"\n#include "ggml-rpc.h"\n#include "_shim.h"\n'


def extension_kwargs(bin_dir: Path | None) -> dict:
    """Compiler/linker settings of the cffi extension (shared by set_source and setup.py)."""
    src, _ = llama_source()
    return dict(
        sources=[str(PKG / "_shim.cpp")],
        include_dirs=[str(PKG), str(src / "include"), str(src / "ggml" / "include"),
                      str(src / "common"), str(src / "src")],
        library_dirs=[str(bin_dir)] if bin_dir else [],
        libraries=["llama", "ggml", "ggml-base", "llama-common"],
        extra_compile_args=["-std=c++17", "-O2"],
        # the libraries are copied next to the extension, into llama_spec/_lib/
        extra_link_args=["-Wl,-rpath,$ORIGIN/_lib"],
    )


def ffibuilder(bin_dir: Path | None = None):
    """The cffi FFI: one cdef file per llama.cpp area (llama_spec/_cdef/*.h), API mode."""
    from cffi import FFI

    ffi = FFI()
    for h in sorted((PKG / "_cdef").glob("*.h")):
        ffi.cdef(h.read_text())
    ffi.set_source("llama_spec._llama_cffi", PREAMBLE, source_extension=".cpp",
                   **extension_kwargs(bin_dir))
    return ffi


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--source", action="store_true", help="only fetch/unpack the llama.cpp source")
    ap.add_argument("--tools", nargs="+", metavar="TARGET", help="build these native llama.cpp tools")
    ap.add_argument("--print-bin-dir", action="store_true", help="print the cached build's bin/ dir")
    ns = ap.parse_args()
    try:
        if ns.source:
            print(llama_source()[0])
        elif ns.tools:
            print(build_tools(ns.tools))
        elif ns.print_bin_dir:
            print(build_info()["bin_dir"])
        else:
            print(cmake_build())
    except BuildError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
