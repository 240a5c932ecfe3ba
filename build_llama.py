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
  CUDACXX, CUDA_HOME, CUDA_PATH  cuda only; where nvcc is (else PATH, else /usr/local/cuda)
  CMAKE_CUDA_ARCHITECTURES  cuda only; default "native" when a GPU is visible, else "90"
  AMDGPU_TARGETS          hip only; default gfx906 (MI50)
  ROCM_PATH               hip only; default: from `hipconfig -R`, else /opt/rocm
  CMAKE_ARGS              extra cmake arguments, passed through (as llama-cpp-python does)
  LLAMA_CPP_DIR           use this llama.cpp tree instead of the pinned one
  LLAMA_SPEC_BUILD_CACHE  where cached builds live (default ~/.cache/llama-spec/build)
  LLAMA_SPEC_AMX          1 = keep Intel AMX kernels (off by default: they crash in this llama.cpp)
"""

from __future__ import annotations

import argparse
import glob
import hashlib
import json
import os
import re
import shlex
import shutil
import site
import subprocess
import sys
import sysconfig
import tarfile
import tempfile
import urllib.request
from dataclasses import dataclass, field
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


# --- CUDA: nvcc, cuBLAS, the driver stub, architectures ---------------------------------------

@dataclass
class Cublas:
    """Where cuBLAS comes from: the CUDA toolkit itself, or an installed nvidia-cublas wheel."""
    origin: str                      # "toolkit" | "nvidia-cublas wheel"
    lib_dir: Path
    include_dir: Path
    libs: dict[str, Path]            # "cublas" / "cublasLt" -> the versioned .so file

    @property
    def from_wheel(self) -> bool:
        return self.origin != "toolkit"


@dataclass
class CudaConfig:
    """What a CUDA build found; `notes()` are the lines the build prints about it."""
    nvcc: Path
    nvcc_from: str                   # CUDACXX | CUDA_HOME | CUDA_PATH | PATH | default
    root: Path                       # the toolkit (has include/cuda_runtime.h)
    version: str                     # "13.0"
    cublas: Cublas
    driver_stub: Path | None         # libcuda.so for CUDA::cuda_driver; None -> GGML_CUDA_NO_VMM
    arch: str
    arch_from: str
    cudart_dir: Path | None = None   # the toolkit folder holding libcudart.so.N
    extra: list[str] = field(default_factory=list)

    @property
    def major(self) -> str:
        return self.version.split(".")[0]

    def links_dir(self) -> Path:
        """Unversioned cuBLAS names (libcublas.so -> the wheel's libcublas.so.13) for the link step."""
        key = hashlib.sha256(str(self.cublas.lib_dir).encode()).hexdigest()[:12]
        return cache_root() / "cuda-links" / key

    def rpath(self) -> list[str]:
        """Run-time search path of the libraries: next to each other, then the cuBLAS wheel as it
        sits next to llama_spec/ in site-packages (as torch does), then the folders found now."""
        out = ["$ORIGIN"]
        if self.cublas.from_wheel:
            out += [f"$ORIGIN/../../{self.cublas.lib_dir.parent.parent.name}/{self.cublas.lib_dir.parent.name}/lib",
                    str(self.cublas.lib_dir)]
        if self.cudart_dir is not None:
            out.append(str(self.cudart_dir))
        return out

    def build_include_dir(self) -> Path:
        """The cuBLAS headers the compiler sees. For a wheel: a copy in the links folder whose files
        are rewritten only when their bytes change. The wheel's own files get new mtimes whenever it
        is reinstalled (a fresh venv), and ninja then rebuilt all 144 CUDA objects (~2 h on 2 cores):
        an interrupted build could never resume."""
        return self.links_dir() / "include" if self.cublas.from_wheel else self.cublas.include_dir

    def cmake_args(self) -> list[str]:
        args = ["-DGGML_CUDA=ON", f"-DCMAKE_CUDA_COMPILER={self.nvcc}", f"-DCUDAToolkit_ROOT={self.root}",
                f"-DCMAKE_CUDA_ARCHITECTURES={self.arch}"]
        if self.driver_stub is None:
            args.append("-DGGML_CUDA_NO_VMM=ON")
        if self.cublas.from_wheel:
            links = self.links_dir()
            args += [f"-DCUDA_cublas_LIBRARY={links / 'libcublas.so'}",
                     f"-DCUDA_cublasLt_LIBRARY={links / 'libcublasLt.so'}",
                     f"-DCMAKE_CUDA_FLAGS=-I{self.build_include_dir()}"]
        return args

    def cxx_flags(self) -> list[str]:
        return [f"-I{self.build_include_dir()}"] if self.cublas.from_wheel else []

    def notes(self) -> list[str]:
        libs = ", ".join(p.name for p in self.cublas.libs.values())
        vmm = (f"driver stub {self.driver_stub}: VMM on" if self.driver_stub else
               "GGML_CUDA_NO_VMM=ON: no libcuda.so driver stub in the toolkit or the system library "
               "folders (CUDA::cuda_driver cannot link); the CUDA pool uses cudaMalloc instead of VMM")
        return [f"nvcc: {self.nvcc} (CUDA {self.version}, from {self.nvcc_from}; toolkit {self.root})",
                f"cuBLAS: {self.cublas.origin} at {self.cublas.lib_dir} ({libs}; headers {self.cublas.include_dir})",
                f"CUDA architectures: {self.arch} ({self.arch_from})",
                vmm]

    def prepare(self) -> None:
        """Create the unversioned link names the linker needs (the wheel ships only .so.N) and the
        mtime-stable copy of the wheel's headers (build_include_dir)."""
        if not self.cublas.from_wheel:
            return
        links = self.links_dir()
        links.mkdir(parents=True, exist_ok=True)
        for name, real in self.cublas.libs.items():
            link = links / f"lib{name}.so"
            if link.is_symlink() or link.exists():
                link.unlink()
            link.symlink_to(real)
        _sync_tree(self.cublas.include_dir, self.build_include_dir())


def _sync_tree(src: Path, dst: Path) -> None:
    """Make dst hold src's files, writing only files that are missing or whose bytes differ (an
    unchanged file keeps its mtime, so nothing that includes it is rebuilt)."""
    for f in src.rglob("*"):
        if not f.is_file():
            continue
        out = dst / f.relative_to(src)
        data = f.read_bytes()
        if out.is_file() and out.read_bytes() == data:
            continue
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = out.with_name(out.name + ".tmp")
        tmp.write_bytes(data)
        tmp.replace(out)


def _env(env: dict[str, str] | None) -> dict[str, str]:
    return dict(os.environ) if env is None else env


def find_nvcc(env: dict[str, str] | None = None, default: str = "/usr/local/cuda/bin/nvcc") -> tuple[Path, str]:
    """nvcc from CUDACXX, then CUDA_HOME / CUDA_PATH, then PATH, then /usr/local/cuda; (path, source)."""
    e = _env(env)
    tried = []
    cands: list[tuple[str, str | None]] = [("CUDACXX", e.get("CUDACXX"))]
    cands += [(v, str(Path(e[v]) / "bin" / "nvcc") if e.get(v) else None) for v in ("CUDA_HOME", "CUDA_PATH")]
    cands += [("PATH", shutil.which("nvcc", path=e.get("PATH", ""))), ("default", default)]
    for src, path in cands:
        if not path:
            continue
        tried.append(f"{src}: {path}")
        if os.path.isfile(path) and os.access(path, os.X_OK):
            return Path(path), src
        if src in ("CUDACXX", "CUDA_HOME", "CUDA_PATH"):
            raise BuildError(f"{src} is set but {path} is not an executable nvcc")
    raise BuildError("LLAMA_SPEC_BACKEND=cuda: nvcc not found (set CUDA_HOME or CUDACXX, or put nvcc on PATH); "
                     f"tried: {'; '.join(tried) or 'nothing'}")


def _has_runtime_header(root: Path) -> bool:
    return (root / "include" / "cuda_runtime.h").exists() or any(root.glob("targets/*/include/cuda_runtime.h"))


def toolkit_root(nvcc: Path) -> Path:
    """The toolkit folder: nvcc's bin/.. (symlinks resolved); for a wrapper script, ask nvcc (TOP=)."""
    root = nvcc.resolve().parent.parent
    if _has_runtime_header(root):
        return root
    with tempfile.TemporaryDirectory() as tmp:
        cu = Path(tmp) / "probe.cu"
        cu.write_text("")
        out = subprocess.run([str(nvcc), "--dryrun", "-c", str(cu)], capture_output=True, text=True, timeout=60)
    m = re.search(r"^#\$ TOP=(.+)$", out.stdout + out.stderr, re.M)
    if m and _has_runtime_header(Path(m.group(1).strip()).resolve()):
        return Path(m.group(1).strip()).resolve()
    raise BuildError(f"cannot find the CUDA toolkit of {nvcc} (no include/cuda_runtime.h near it); set CUDA_HOME")


def nvcc_version(nvcc: Path) -> str:
    out = subprocess.run([str(nvcc), "--version"], capture_output=True, text=True, timeout=60)
    m = re.search(r"release (\d+\.\d+)", out.stdout + out.stderr)
    if not m:
        raise BuildError(f"`{nvcc} --version` printed no CUDA release: {(out.stdout + out.stderr).strip()[-200:]}")
    return m.group(1)


def _toolkit_dirs(root: Path, kind: str) -> list[Path]:
    """lib or include folders of a toolkit: <root>/lib64, <root>/lib, <root>/targets/*/lib."""
    names = ["lib64", "lib"] if kind == "lib" else ["include"]
    dirs = [root / n for n in names] + sorted(Path(p) for p in glob.glob(str(root / "targets" / "*" / kind)))
    return [d for d in dirs if d.is_dir()]


def site_dirs() -> list[Path]:
    """Where installed wheels live for this interpreter: its site-packages (also from inside pip's
    isolated build environment, which keeps sys.prefix) and sys.path."""
    cands = [sysconfig.get_paths().get(k) for k in ("purelib", "platlib")]
    try:
        cands += site.getsitepackages() + [site.getusersitepackages()]
    except AttributeError:  # pragma: no cover - old virtualenv's site.py
        pass
    cands += sys.path
    out: list[Path] = []
    for c in cands:
        if c and Path(c).is_dir() and Path(c).resolve() not in out:
            out.append(Path(c).resolve())
    return out


def _cublas_in(lib_dir: Path, inc_dir: Path, major: str, versioned: bool) -> dict[str, Path] | None:
    if not (inc_dir / "cublas_v2.h").exists():
        return None
    libs = {}
    for name in ("cublas", "cublasLt"):
        pat = f"lib{name}.so.{major}*" if versioned else f"lib{name}.so"
        hits = sorted(p for p in lib_dir.glob(pat) if p.is_file())
        if not hits:
            return None
        libs[name] = hits[0]
    return libs


def find_cublas(root: Path, major: str, sites: list[Path] | None = None) -> Cublas:
    """cuBLAS of CUDA `major`: the toolkit's own first, else an nvidia-cublas wheel
    (nvidia/cu<major>/ since CUDA 13, nvidia/cublas/ for the -cu12 wheels)."""
    incs = _toolkit_dirs(root, "include")
    for lib_dir in _toolkit_dirs(root, "lib"):
        for inc in incs:
            libs = _cublas_in(lib_dir, inc, major, versioned=False)
            if libs:
                return Cublas("toolkit", lib_dir, inc, libs)
    sites = site_dirs() if sites is None else sites
    for sd in sites:
        for sub in (f"nvidia/cu{major}", "nvidia/cublas"):
            base = sd / sub
            libs = _cublas_in(base / "lib", base / "include", major, versioned=True)
            if libs:
                return Cublas("nvidia-cublas wheel", base / "lib", base / "include", libs)
    raise BuildError(
        f"cuBLAS for CUDA {major} not found: not in the toolkit at {root}, and no nvidia-cublas wheel in "
        f"{', '.join(map(str, sites[:4])) or 'site-packages'}. Install it into the environment you build in: "
        f"pip install 'nvidia-cublas>={major},<{int(major) + 1}'   (or: pip install 'llama-spec[cuda-build]')")


def system_lib_dirs() -> list[Path]:
    """The dynamic loader's folders (ldconfig -p) plus the usual ones."""
    dirs = {Path(p) for p in ("/usr/lib/x86_64-linux-gnu", "/usr/lib64", "/usr/lib", "/usr/local/lib", "/usr/lib/wsl/lib")}
    try:
        out = subprocess.run(["ldconfig", "-p"], capture_output=True, text=True, timeout=20).stdout
        dirs |= {Path(ln.rsplit("=>", 1)[1].strip()).parent for ln in out.splitlines() if "=>" in ln}
    except (OSError, subprocess.TimeoutExpired):
        pass
    return sorted(d for d in dirs if d.is_dir())


def find_driver_stub(root: Path, system_dirs: list[Path] | None = None) -> Path | None:
    """libcuda.so (what CMake's CUDA::cuda_driver links): the toolkit's stubs/, else the driver's
    unversioned dev link. None means GGML_CUDA_NO_VMM (no direct driver dependency)."""
    dirs = []
    for d in _toolkit_dirs(root, "lib"):
        dirs += [d / "stubs", d]
    dirs += system_lib_dirs() if system_dirs is None else system_dirs
    for d in dirs:
        if (d / "libcuda.so").exists():
            return d / "libcuda.so"
    return None


def cuda_arch(env: dict[str, str] | None = None) -> tuple[str, str]:
    """(architectures, why): CMAKE_CUDA_ARCHITECTURES if set, else "native" with a visible GPU, else 90."""
    arch = _env(env).get("CMAKE_CUDA_ARCHITECTURES")
    if arch:
        return arch, "from CMAKE_CUDA_ARCHITECTURES"
    try:
        ok = subprocess.run(["nvidia-smi", "-L"], capture_output=True, timeout=20).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        ok = False
    if ok:
        return "native", "a GPU is visible; set CMAKE_CUDA_ARCHITECTURES to override"
    return "90", "no GPU visible: Hopper (H100/H200); set CMAKE_CUDA_ARCHITECTURES to override"


def cuda_config(env: dict[str, str] | None = None, sites: list[Path] | None = None,
                system_dirs: list[Path] | None = None) -> CudaConfig:
    """Find everything a CUDA build needs, or raise BuildError saying what is missing."""
    nvcc, nvcc_from = find_nvcc(env)
    root = toolkit_root(nvcc)
    if (root / "bin" / "nvcc").is_file() and nvcc.resolve() != (root / "bin" / "nvcc").resolve():
        # a wrapper script (e.g. /usr/local/bin/nvcc running the toolkit's): give CMake the real one
        nvcc_from = f"{nvcc_from} ({nvcc} runs it)"
        nvcc = root / "bin" / "nvcc"
    version = nvcc_version(nvcc)
    major = version.split(".")[0]
    cublas = find_cublas(root, major, sites)
    arch, arch_from = cuda_arch(env)
    cudart = next((d for d in _toolkit_dirs(root, "lib") if any(d.glob(f"libcudart.so.{major}*"))), None)
    return CudaConfig(nvcc, nvcc_from, root, version, cublas, find_driver_stub(root, system_dirs),
                      arch, arch_from, cudart)


_CUDA: list[CudaConfig] = []


def _cuda_config_cached() -> CudaConfig:
    if not _CUDA:
        _CUDA.append(cuda_config())
    return _CUDA[0]


# --- HIP (ROCm): the switch is kept, but no build of it has been verified here ----------------

def hip_cmake_args(env: dict[str, str] | None = None) -> list[str]:
    """GGML_HIP with the GPU targets (default gfx906, MI50) and ROCm's clang as the HIP compiler
    (llama.cpp's documented `HIPCXX="$(hipconfig -l)/clang"`), when hipconfig or HIPCXX is there."""
    e = _env(env)
    targets = e.get("AMDGPU_TARGETS", "gfx906")
    args = ["-DGGML_HIP=ON", f"-DAMDGPU_TARGETS={targets}", f"-DGPU_TARGETS={targets}"]
    hipconfig = shutil.which("hipconfig", path=e.get("PATH", ""))

    def ask(flag: str) -> str | None:
        if not hipconfig:
            return None
        out = subprocess.run([hipconfig, flag], capture_output=True, text=True, timeout=60)
        return out.stdout.strip() or None if out.returncode == 0 else None

    clang = e.get("HIPCXX") or (f"{ask('-l')}/clang" if ask("-l") else None)
    rocm = e.get("ROCM_PATH") or ask("-R")
    if clang:
        args.append(f"-DCMAKE_HIP_COMPILER={clang}")
    if rocm:
        args.append(f"-DCMAKE_PREFIX_PATH={rocm}")
    return args


def hip_missing(env: dict[str, str] | None = None) -> list[str]:
    """What a HIP build will miss on this machine (hipconfig, hipBLAS, rocBLAS); empty = looks complete."""
    e = _env(env)
    rocm = Path(e.get("ROCM_PATH", "/opt/rocm"))
    dirs = [rocm / "lib", rocm / "lib64", *system_lib_dirs()]
    missing = [] if shutil.which("hipconfig", path=e.get("PATH", "")) or e.get("HIPCXX") else ["hipconfig (ROCm)"]
    for lib in ("hipblas", "rocblas"):
        if not any((d / f"lib{lib}.so").exists() for d in dirs):
            missing.append(f"lib{lib}.so")
    return missing


def cmake_args(src: Path, bdir: Path) -> list[str]:
    b = backend()
    cuda = _cuda_config_cached() if b == "cuda" else None
    rpath = ";".join(cuda.rpath()) if cuda else "$ORIGIN"
    args = [
        "cmake", "-S", str(src), "-B", str(bdir), "-G", "Ninja",
        "-DCMAKE_BUILD_TYPE=Release",
        "-DBUILD_SHARED_LIBS=ON",
        # Libraries and tools sit side by side in bin/ and find each other through $ORIGIN,
        # so the copies inside the installed package work from any directory.
        "-DCMAKE_BUILD_WITH_INSTALL_RPATH=ON",
        f"-DCMAKE_INSTALL_RPATH={rpath}",
        "-DGGML_RPC=ON",
        "-DLLAMA_BUILD_COMMON=ON",
        "-DLLAMA_BUILD_TESTS=OFF",
        "-DLLAMA_BUILD_SERVER=OFF",
        "-DLLAMA_BUILD_APP=OFF",
        "-DLLAMA_BUILD_TOOLS=ON",      # configured, but only built on demand (tests, benchmarks)
        "-DLLAMA_BUILD_EXAMPLES=ON",
        "-DLLAMA_OPENSSL=OFF",
    ]
    flags = cuda.cxx_flags() if cuda else []
    if os.environ.get("LLAMA_SPEC_AMX", "0") != "1" and _is_x86():
        # llama.cpp 0c1e57098's AMX int8 matmul segfaults on Sapphire Rapids-class CPUs (its own
        # llama-completion crashes the same way; `--no-repack` avoids it). Build without AMX
        # unless asked: the AVX-512/VNNI kernels are used instead.
        no_amx = "-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
        args += [f"-DCMAKE_C_FLAGS={no_amx}", f"-DCMAKE_CXX_FLAGS={' '.join([no_amx, *flags])}"]
    elif flags:
        args.append(f"-DCMAKE_CXX_FLAGS={' '.join(flags)}")
    if cuda:
        args += cuda.cmake_args()
    elif b == "hip":
        args += hip_cmake_args()
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
    if backend() == "cuda":
        cuda = _cuda_config_cached()
        for note in cuda.notes():
            log(note)
        cuda.prepare()
    elif backend() == "hip":
        log("HIP: this switch has never been compiled by the project (see README, Building for GPUs)")
        missing = hip_missing()
        if missing:
            log(f"HIP: not found here: {', '.join(missing)}; cmake will likely stop (ROCm with hipBLAS/rocBLAS needed)")
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
    if all((bdir / "bin" / t).exists() for t in tools):
        return bdir / "bin"
    bdir.mkdir(parents=True, exist_ok=True)
    # several test processes (pytest-xdist workers) may ask at once: one builds, the others wait
    with open(bdir / ".tools.lock", "a+b") as lock:
        try:
            import fcntl

            fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
        except ImportError:  # not POSIX: no lock
            pass
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


def print_cmake() -> None:
    """The backend's findings and its cmake line (the build folder shown as <build>), on stdout."""
    src, _ = llama_source()
    if backend() == "cuda":
        for note in _cuda_config_cached().notes():
            print(f"# {note}")
    elif backend() == "hip":
        missing = hip_missing()
        print(f"# HIP: missing here: {', '.join(missing)}" if missing else "# HIP: hipconfig, hipBLAS, rocBLAS found")
    print(shlex.join(cmake_args(src, Path("<build>"))))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--source", action="store_true", help="only fetch/unpack the llama.cpp source")
    ap.add_argument("--tools", nargs="+", metavar="TARGET", help="build these native llama.cpp tools")
    ap.add_argument("--print-bin-dir", action="store_true", help="print the cached build's bin/ dir")
    ap.add_argument("--print-cmake", action="store_true",
                    help="print what the backend found and the cmake line, build nothing")
    ns = ap.parse_args()
    try:
        if ns.source:
            print(llama_source()[0])
        elif ns.print_cmake:
            print_cmake()
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
