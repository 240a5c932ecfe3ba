"""setuptools glue: build llama.cpp (cached), then the cffi extension, then ship the libraries.

All the real work lives in build_llama.py; this file only wires it into `pip install`.
"""

import json
import os
import shutil
import sys
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import build_llama  # noqa: E402


class BuildLlamaExt(build_ext):
    def run(self):
        try:
            bin_dir = build_llama.cmake_build()
            ffi = build_llama.ffibuilder(bin_dir)
        except build_llama.BuildError as e:
            # One readable message instead of a traceback wall.
            sys.stderr.write(f"\nllama-spec: build failed\n{e}\n\n")
            raise SystemExit(1) from None
        gen_dir = Path(self.build_temp) / "cffi"
        gen_dir.mkdir(parents=True, exist_ok=True)
        c_file = gen_dir / "_llama_cffi.cpp"
        ffi.emit_c_code(str(c_file))
        # Fill in the placeholder extension (setuptools already finalized it) from cffi's view.
        kwargs = build_llama.extension_kwargs(bin_dir)
        ext = self.extensions[0]
        # setuptools wants source paths relative to the project root
        ext.sources = [os.path.relpath(p, HERE) for p in (str(c_file), *kwargs["sources"])]
        ext.include_dirs = kwargs["include_dirs"]
        ext.library_dirs = kwargs["library_dirs"]
        ext.libraries = kwargs["libraries"]
        ext.extra_compile_args = kwargs["extra_compile_args"]
        ext.extra_link_args = kwargs["extra_link_args"]
        ext.language = "c++"
        super().run()
        pkg_dir = Path(self.get_ext_fullpath(ext.name)).parent
        lib_dir = pkg_dir / "_lib"
        if lib_dir.exists():
            shutil.rmtree(lib_dir)
        lib_dir.mkdir(parents=True)
        for lib in build_llama.shared_libs(bin_dir):
            shutil.copy2(lib, lib_dir / lib.name, follow_symlinks=True)
        for tool in ("ggml-rpc-server",):
            if (bin_dir / tool).exists():
                shutil.copy2(bin_dir / tool, lib_dir / tool)
        info = json.loads((bin_dir.parent / "llama-spec-build.json").read_text())
        (pkg_dir / "_build_info.json").write_text(json.dumps(info, indent=2))


setup(
    ext_modules=[Extension("llama_spec._llama_cffi", sources=[])],
    cmdclass={"build_ext": BuildLlamaExt},
)
