"""The CUDA/HIP build switch, tested without a GPU or a CUDA build (issue 14).

Fake toolkits, wheels and tools in tmp_path stand in for the real ones: nvcc from CUDACXX /
CUDA_HOME / PATH, cuBLAS from the toolkit or an nvidia-cublas wheel, GGML_CUDA_NO_VMM only
without a libcuda.so stub, the CMAKE_CUDA_ARCHITECTURES override, HIP's cmake line, and the
loader error of a GPU build whose runtime library is missing (a real dlopen failure).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
import build_llama as bl  # noqa: E402

NO_NVCC = "/nonexistent/cuda/bin/nvcc"


def _script(path: Path, body: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\n" + body + "\n")
    path.chmod(0o755)
    return path


def _toolkit(root: Path, version: str = "13.0", *, cublas: bool = False, stub: bool = False) -> Path:
    """A fake CUDA toolkit: bin/nvcc answering --version, targets/x86_64-linux/{include,lib}."""
    _script(root / "bin" / "nvcc", f'echo "Cuda compilation tools, release {version}, V{version}.88"')
    inc = root / "targets" / "x86_64-linux" / "include"
    lib = root / "targets" / "x86_64-linux" / "lib"
    inc.mkdir(parents=True)
    lib.mkdir(parents=True)
    (inc / "cuda_runtime.h").write_text("")
    major = version.split(".")[0]
    (lib / f"libcudart.so.{major}").write_text("")
    if cublas:
        (inc / "cublas_v2.h").write_text("")
        for name in ("libcublas.so", "libcublasLt.so"):
            (lib / name).write_text("")
    if stub:
        (lib / "stubs").mkdir()
        (lib / "stubs" / "libcuda.so").write_text("")
    return root


def _wheel(site_dir: Path, major: str = "13") -> Path:
    """An installed nvidia-cublas wheel's files: nvidia/cu<major>/{include/cublas_v2.h, lib/*.so.N}."""
    base = site_dir / "nvidia" / f"cu{major}"
    (base / "include").mkdir(parents=True)
    (base / "lib").mkdir(parents=True)
    (base / "include" / "cublas_v2.h").write_text("")
    for name in ("libcublas", "libcublasLt"):
        (base / "lib" / f"{name}.so.{major}").write_text("")
    return base


# --- nvcc --------------------------------------------------------------------------------------

def test_nvcc_order_cudacxx_then_cuda_home_then_path(tmp_path):
    a = _toolkit(tmp_path / "a")
    b = _toolkit(tmp_path / "b")
    c = _toolkit(tmp_path / "c")
    env = {"CUDACXX": str(a / "bin" / "nvcc"), "CUDA_HOME": str(b), "PATH": str(c / "bin")}
    assert bl.find_nvcc(env, NO_NVCC) == (a / "bin" / "nvcc", "CUDACXX")
    del env["CUDACXX"]
    assert bl.find_nvcc(env, NO_NVCC) == (b / "bin" / "nvcc", "CUDA_HOME")
    env["CUDA_PATH"] = env.pop("CUDA_HOME")
    assert bl.find_nvcc(env, NO_NVCC) == (b / "bin" / "nvcc", "CUDA_PATH")
    del env["CUDA_PATH"]
    assert bl.find_nvcc(env, NO_NVCC) == (c / "bin" / "nvcc", "PATH")


def test_nvcc_missing_or_wrong_variable_says_what_was_tried(tmp_path):
    with pytest.raises(bl.BuildError, match="nvcc not found .*CUDA_HOME or CUDACXX"):
        bl.find_nvcc({"PATH": str(tmp_path)}, NO_NVCC)
    # a set variable that points nowhere is an error, not silently skipped for PATH's nvcc
    c = _toolkit(tmp_path / "c")
    with pytest.raises(bl.BuildError, match="CUDA_HOME is set but .*not an executable nvcc"):
        bl.find_nvcc({"CUDA_HOME": str(tmp_path / "none"), "PATH": str(c / "bin")}, NO_NVCC)


def test_toolkit_root_through_symlink_and_wrapper_script(tmp_path):
    root = _toolkit(tmp_path / "cuda-13.0")
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "nvcc").symlink_to(root / "bin" / "nvcc")
    assert bl.toolkit_root(tmp_path / "bin" / "nvcc") == root.resolve()
    # a wrapper script (like /usr/local/bin/nvcc here): the toolkit comes from nvcc's own TOP= line
    wrapper = _script(tmp_path / "wrap" / "nvcc", f'echo "#$ TOP={root}/bin/.." >&2')
    assert bl.toolkit_root(wrapper) == root.resolve()
    bad = _script(tmp_path / "bad" / "nvcc", "exit 0")
    with pytest.raises(bl.BuildError, match="set CUDA_HOME"):
        bl.toolkit_root(bad)


def test_nvcc_version_parsed(tmp_path):
    root = _toolkit(tmp_path / "t", "12.8")
    assert bl.nvcc_version(root / "bin" / "nvcc") == "12.8"
    junk = _script(tmp_path / "junk" / "nvcc", "echo hello")
    with pytest.raises(bl.BuildError, match="no CUDA release"):
        bl.nvcc_version(junk)


# --- cuBLAS ------------------------------------------------------------------------------------

def test_cublas_from_toolkit_first(tmp_path):
    root = _toolkit(tmp_path / "t", cublas=True)
    site = tmp_path / "site"
    _wheel(site)
    cb = bl.find_cublas(root, "13", [site])
    assert cb.origin == "toolkit" and not cb.from_wheel
    assert cb.libs["cublas"].name == "libcublas.so" and cb.libs["cublasLt"].name == "libcublasLt.so"


def test_cublas_from_wheel_when_toolkit_has_none(tmp_path):
    root = _toolkit(tmp_path / "t")
    site = tmp_path / "site"
    base = _wheel(site)
    cb = bl.find_cublas(root, "13", [tmp_path / "empty", site])
    assert cb.origin == "nvidia-cublas wheel" and cb.from_wheel
    assert cb.lib_dir == base / "lib" and cb.include_dir == base / "include"
    assert cb.libs == {"cublas": base / "lib" / "libcublas.so.13", "cublasLt": base / "lib" / "libcublasLt.so.13"}


def test_cublas_wheel_of_another_cuda_major_is_not_used(tmp_path):
    root = _toolkit(tmp_path / "t")
    site = tmp_path / "site"
    _wheel(site, "12")
    with pytest.raises(bl.BuildError, match=r"cuBLAS for CUDA 13 not found.*pip install 'nvidia-cublas>=13,<14'"):
        bl.find_cublas(root, "13", [site])
    # a wheel without headers is not enough either (the build needs cublas_v2.h)
    site2 = tmp_path / "site2"
    (_wheel(site2) / "include" / "cublas_v2.h").unlink()
    with pytest.raises(bl.BuildError):
        bl.find_cublas(root, "13", [site2])


def test_site_dirs_include_this_interpreters_site_packages():
    dirs = bl.site_dirs()
    assert Path(sysconfig.get_paths()["purelib"]).resolve() in dirs


# --- driver stub / NO_VMM, architectures, the cmake arguments ----------------------------------

def test_driver_stub_from_toolkit_or_system(tmp_path):
    assert bl.find_driver_stub(_toolkit(tmp_path / "none"), []) is None
    with_stub = _toolkit(tmp_path / "stub", stub=True)
    assert bl.find_driver_stub(with_stub, []) == with_stub / "targets" / "x86_64-linux" / "lib" / "stubs" / "libcuda.so"
    sysdir = tmp_path / "usr-lib"
    sysdir.mkdir()
    (sysdir / "libcuda.so.1").write_text("")     # the driver's SONAME alone is not what CMake links
    assert bl.find_driver_stub(_toolkit(tmp_path / "none2"), [sysdir]) is None
    (sysdir / "libcuda.so").write_text("")
    assert bl.find_driver_stub(_toolkit(tmp_path / "none3"), [sysdir]) == sysdir / "libcuda.so"


def test_cuda_arch_override_and_defaults(tmp_path, monkeypatch):
    assert bl.cuda_arch({"CMAKE_CUDA_ARCHITECTURES": "80;90"})[0] == "80;90"
    monkeypatch.setenv("PATH", str(tmp_path))                 # no nvidia-smi: no GPU visible
    assert bl.cuda_arch({}) == ("90", bl.cuda_arch({})[1]) and "no GPU visible" in bl.cuda_arch({})[1]
    _script(tmp_path / "nvidia-smi", 'echo "GPU 0: NVIDIA H200"')
    assert bl.cuda_arch({})[0] == "native"


def _config(tmp_path, monkeypatch, *, stub: bool, env_extra: dict[str, str] | None = None) -> bl.CudaConfig:
    monkeypatch.setenv("LLAMA_SPEC_BUILD_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("PATH", str(tmp_path / "nobin"))     # no nvidia-smi
    root = _toolkit(tmp_path / "cuda", stub=stub)
    site = tmp_path / "site-packages"
    _wheel(site)
    env = {"CUDA_HOME": str(root), **(env_extra or {})}
    return bl.cuda_config(env, sites=[site], system_dirs=[])


def test_cmake_args_no_vmm_only_without_stub(tmp_path, monkeypatch):
    cfg = _config(tmp_path, monkeypatch, stub=False)
    args = cfg.cmake_args()
    assert "-DGGML_CUDA=ON" in args and "-DGGML_CUDA_NO_VMM=ON" in args
    assert f"-DCMAKE_CUDA_COMPILER={tmp_path / 'cuda' / 'bin' / 'nvcc'}" in args
    assert "-DCMAKE_CUDA_ARCHITECTURES=90" in args
    assert any("GGML_CUDA_NO_VMM=ON: no libcuda.so" in n for n in cfg.notes())
    cfg2 = _config(tmp_path / "two", monkeypatch, stub=True)
    assert "-DGGML_CUDA_NO_VMM=ON" not in cfg2.cmake_args()
    assert any("driver stub" in n and "VMM on" in n for n in cfg2.notes())


def test_cmake_args_arch_override(tmp_path, monkeypatch):
    cfg = _config(tmp_path, monkeypatch, stub=False, env_extra={"CMAKE_CUDA_ARCHITECTURES": "86-real;90"})
    assert "-DCMAKE_CUDA_ARCHITECTURES=86-real;90" in cfg.cmake_args()
    assert cfg.arch_from == "from CMAKE_CUDA_ARCHITECTURES"


def test_wheel_cublas_links_rpath_and_notes(tmp_path, monkeypatch):
    cfg = _config(tmp_path, monkeypatch, stub=False)
    lib = tmp_path / "site-packages" / "nvidia" / "cu13" / "lib"
    links = cfg.links_dir()
    assert links.is_relative_to(tmp_path / "cache")
    args = cfg.cmake_args()
    assert f"-DCUDA_cublas_LIBRARY={links / 'libcublas.so'}" in args
    assert f"-DCUDA_cublasLt_LIBRARY={links / 'libcublasLt.so'}" in args
    assert f"-DCMAKE_CUDA_FLAGS=-I{links / 'include'}" in args   # the mtime-stable copy of the headers
    assert cfg.cxx_flags() == [f"-I{links / 'include'}"]
    # run time: the wheel next to llama_spec/ in site-packages, the wheel found now, the toolkit's cudart
    assert cfg.rpath() == ["$ORIGIN", "$ORIGIN/../../nvidia/cu13/lib", str(lib),
                           str(tmp_path / "cuda" / "targets" / "x86_64-linux" / "lib")]
    cfg.prepare()
    assert (links / "libcublas.so").resolve() == (lib / "libcublas.so.13").resolve()
    assert (links / "libcublasLt.so").resolve() == (lib / "libcublasLt.so.13").resolve()
    cfg.prepare()                                            # idempotent
    assert (links / "include" / "cublas_v2.h").read_text() == ""
    notes = "\n".join(cfg.notes())
    assert "nvcc: " in notes and "CUDA 13.0, from CUDA_HOME" in notes
    assert f"cuBLAS: nvidia-cublas wheel at {lib}" in notes and "CUDA architectures: 90" in notes


def test_reinstalled_wheel_headers_do_not_touch_the_build_copy(tmp_path, monkeypatch):
    # A fresh venv reinstalls the wheel: same bytes, new mtimes. The copy the compiler sees keeps its
    # mtime (ninja rebuilds nothing); a header whose bytes change is rewritten.
    cfg = _config(tmp_path, monkeypatch, stub=False)
    inc = tmp_path / "site-packages" / "nvidia" / "cu13" / "include"
    (inc / "sub").mkdir()
    (inc / "sub" / "cublas_api.h").write_text("int v1;")
    cfg.prepare()
    copy = cfg.build_include_dir()
    old = 1_000_000_000
    for f in copy.rglob("*.h"):
        os.utime(f, (old, old))
    for f in inc.rglob("*.h"):                      # the reinstall: rewritten, same bytes
        f.write_bytes(f.read_bytes())
    cfg.prepare()
    assert all(f.stat().st_mtime == old for f in copy.rglob("*.h"))
    (inc / "sub" / "cublas_api.h").write_text("int v2;")
    cfg.prepare()
    assert (copy / "sub" / "cublas_api.h").read_text() == "int v2;"
    assert (copy / "sub" / "cublas_api.h").stat().st_mtime != old
    assert (copy / "cublas_v2.h").stat().st_mtime == old


def test_full_cmake_line_cuda_and_cpu_unchanged(tmp_path, monkeypatch):
    cfg = _config(tmp_path, monkeypatch, stub=False)
    monkeypatch.setattr(bl, "_CUDA", [cfg])
    monkeypatch.setattr(bl, "_is_x86", lambda: True)
    monkeypatch.delenv("CMAKE_ARGS", raising=False)
    monkeypatch.delenv("LLAMA_SPEC_AMX", raising=False)
    monkeypatch.setenv("LLAMA_SPEC_BACKEND", "cuda")
    cuda = bl.cmake_args(Path("/src"), Path("/b"))
    no_amx = "-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
    assert f"-DCMAKE_CXX_FLAGS={no_amx} -I{cfg.build_include_dir()}" in cuda
    assert f"-DCMAKE_INSTALL_RPATH={';'.join(cfg.rpath())}" in cuda
    assert cuda[-len(cfg.cmake_args()):] == cfg.cmake_args()
    monkeypatch.setenv("CMAKE_ARGS", "-DGGML_CUDA_NO_VMM=OFF")   # the user's arguments come last and win
    assert bl.cmake_args(Path("/src"), Path("/b"))[-1] == "-DGGML_CUDA_NO_VMM=OFF"
    # the CPU line is exactly what it was before the CUDA work: the CPU build cache key is unchanged
    monkeypatch.delenv("CMAKE_ARGS")
    monkeypatch.setenv("LLAMA_SPEC_BACKEND", "cpu")
    assert bl.cmake_args(Path("/src"), Path("/b")) == [
        "cmake", "-S", "/src", "-B", "/b", "-G", "Ninja", "-DCMAKE_BUILD_TYPE=Release", "-DBUILD_SHARED_LIBS=ON",
        "-DCMAKE_BUILD_WITH_INSTALL_RPATH=ON", "-DCMAKE_INSTALL_RPATH=$ORIGIN", "-DGGML_RPC=ON",
        "-DLLAMA_BUILD_COMMON=ON", "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_SERVER=OFF", "-DLLAMA_BUILD_APP=OFF",
        "-DLLAMA_BUILD_TOOLS=ON", "-DLLAMA_BUILD_EXAMPLES=ON", "-DLLAMA_OPENSSL=OFF",
        f"-DCMAKE_C_FLAGS={no_amx}", f"-DCMAKE_CXX_FLAGS={no_amx}"]


def test_cuda_config_error_names_the_missing_cublas(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path / "nobin"))
    root = _toolkit(tmp_path / "cuda")
    with pytest.raises(bl.BuildError, match="nvidia-cublas"):
        bl.cuda_config({"CUDA_HOME": str(root)}, sites=[tmp_path], system_dirs=[])


# --- HIP ---------------------------------------------------------------------------------------

def test_hip_cmake_args_with_and_without_rocm(tmp_path):
    assert bl.hip_cmake_args({"PATH": str(tmp_path)}) == [
        "-DGGML_HIP=ON", "-DAMDGPU_TARGETS=gfx906", "-DGPU_TARGETS=gfx906"]
    _script(tmp_path / "bin" / "hipconfig",
            'case "$1" in -l) echo /opt/rocm/llvm/bin ;; -R) echo /opt/rocm ;; *) exit 1 ;; esac')
    args = bl.hip_cmake_args({"PATH": str(tmp_path / "bin"), "AMDGPU_TARGETS": "gfx90a"})
    assert args == ["-DGGML_HIP=ON", "-DAMDGPU_TARGETS=gfx90a", "-DGPU_TARGETS=gfx90a",
                    "-DCMAKE_HIP_COMPILER=/opt/rocm/llvm/bin/clang", "-DCMAKE_PREFIX_PATH=/opt/rocm"]
    missing = bl.hip_missing({"PATH": str(tmp_path), "ROCM_PATH": str(tmp_path / "rocm")})
    assert missing[0] == "hipconfig (ROCm)" and "libhipblas.so" in missing


def test_print_cmake_prints_the_hip_line(tmp_path):
    # a stand-in llama.cpp tree: --print-cmake only needs the two files llama_source() checks
    src = tmp_path / "llama.cpp"
    (src / "include").mkdir(parents=True)
    (src / "CMakeLists.txt").write_text("")
    (src / "include" / "llama.h").write_text("")
    env = {**os.environ, "LLAMA_SPEC_BACKEND": "hip", "LLAMA_CPP_DIR": str(src), "PATH": "/usr/bin:/bin"}
    env.pop("CMAKE_ARGS", None)
    out = subprocess.run([sys.executable, str(ROOT / "build_llama.py"), "--print-cmake"], env=env,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.strip().splitlines()
    assert lines[0].startswith("# HIP: missing here: hipconfig (ROCm)")
    assert lines[-1].startswith(f"cmake -S {src} -B '<build>' -G Ninja")
    assert lines[-1].endswith("-DGGML_HIP=ON -DAMDGPU_TARGETS=gfx906 -DGPU_TARGETS=gfx906")


# --- item 2: a GPU build whose runtime library is missing ---------------------------------------

def _fake_package(tmp_path: Path, backend: str, missing_lib: str | None) -> Path:
    """A copy of llama_spec's Python files whose compiled extension really fails in dlopen:
    it is linked against `missing_lib`, which is then deleted (what a GPU-less machine lacks).
    Tests use SONAMEs no machine has (.so.99): a real libcudart.so.13 would be found and loaded."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler")
    site = tmp_path / "site"
    shutil.copytree(ROOT / "llama_spec", site / "llama_spec",
                    ignore=shutil.ignore_patterns("_lib", "*.so", "_build_info.json", "__pycache__"))
    pkg = site / "llama_spec"
    (pkg / "_build_info.json").write_text(json.dumps({"backend": backend}))
    if missing_lib is None:
        return site
    work = tmp_path / "work"
    work.mkdir()
    (work / "stub.c").write_text("int cuda_stub_symbol(void) { return 0; }\n")
    (work / "ext.c").write_text("int cuda_stub_symbol(void);\nint PyInit__llama_cffi(void) { return cuda_stub_symbol(); }\n")
    subprocess.run([cc, "-shared", "-fPIC", "-o", str(work / missing_lib), f"-Wl,-soname,{missing_lib}",
                    str(work / "stub.c")], check=True)
    ext = pkg / f"_llama_cffi{sysconfig.get_config_var('EXT_SUFFIX')}"
    subprocess.run([cc, "-shared", "-fPIC", "-o", str(ext), str(work / "ext.c"), str(work / missing_lib)],
                   check=True)
    (work / missing_lib).unlink()
    return site


# An editable install's import hook would otherwise find the real llama_spec._llama_cffi.
_NO_EDITABLE = ("import sys; sys.meta_path[:] = [f for f in sys.meta_path if '__editable__' not in "
                "getattr(f, '__module__', '') + type(f).__module__]\n")


def _import_in_subprocess(site: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(site)}
    env.pop("LD_LIBRARY_PATH", None)
    return subprocess.run([sys.executable, "-c", _NO_EDITABLE + "import llama_spec; llama_spec.devices()"],
                          cwd=str(site), env=env, capture_output=True, text=True, timeout=120)


def test_cuda_build_without_cudart_raises_a_clear_import_error(tmp_path):
    """Decision (issue 14, item 2): with its libraries present, the CUDA package imports and runs
    on the CPU without a GPU or driver (checked by scripts/cuda_build_check.sh on the real build);
    when a CUDA library itself is missing, import raises an ImportError that names the library,
    what to install and the CPU-build command; never the loader's bare error or an OSError."""
    out = _import_in_subprocess(_fake_package(tmp_path, "cuda", "libcudart.so.99"))
    assert out.returncode != 0
    last = out.stderr.strip().splitlines()[-1]
    assert last.startswith("ImportError: llama_spec (cuda build) cannot load libcudart.so.99: install the CUDA runtime")
    assert "pip install nvidia-cuda-runtime" in last and "nvidia-cublas" in last
    assert "LLAMA_SPEC_BACKEND=cpu pip install --force-reinstall --no-cache-dir ." in last
    assert "no GPU or driver is needed to import" in last
    assert "OSError" not in out.stderr
    # the loader's own words are kept at the end, for the record
    assert "libcudart.so.99: cannot open shared object file" in last


def test_missing_cublas_and_cpu_build_messages(tmp_path):
    out = _import_in_subprocess(_fake_package(tmp_path / "a", "cuda", "libcublas.so.99"))
    assert "cannot load libcublas.so.99" in out.stderr.strip().splitlines()[-1]
    # a CPU build with a broken library: the same shape, no CUDA advice
    out = _import_in_subprocess(_fake_package(tmp_path / "b", "cpu", "libggml-base.so.99"))
    last = out.stderr.strip().splitlines()[-1]
    assert last.startswith("ImportError: llama_spec (cpu build) cannot load libggml-base.so.99")
    assert "CUDA" not in last
    # never built: the old message, pointing at pip install
    out = _import_in_subprocess(_fake_package(tmp_path / "c", "cpu", None))
    assert "compiled extension is missing" in out.stderr.strip().splitlines()[-1]
