"""The binding layer: the compiled cffi module, backend init, and llama.cpp's log -> `logging`.

Everything above this module talks to llama.cpp only through `ffi` and `lib` from here.
Importing it only loads the library: the backends are initialised and the log hooked by
:func:`ensure_init`, on first use (the first Model, device listing, RPC registration).
llama.cpp's log is routed to the `llama_spec.llama_cpp` logger; nothing is printed unless the
application configures logging (the CLI does, on stderr). The last warning/error lines are
kept so that load failures can say *why*.
"""

from __future__ import annotations

import collections
import logging
import threading


def _load_error(e: ImportError) -> str:
    """Why the compiled extension did not load: not built, or (GPU builds) a library the loader
    cannot find, named with what to install or how to get the CPU build instead."""
    import json
    import re
    from pathlib import Path

    here = Path(__file__).resolve().parent
    if not any(here.glob("_llama_cffi*.so")):
        return ("llama_spec's compiled extension is missing: install the package with `pip install .` "
                f"(or `pip install -e .`) from the repository root ({e})")
    info = here / "_build_info.json"
    backend = json.loads(info.read_text()).get("backend", "cpu") if info.exists() else "cpu"
    m = re.search(r"([\w.+-]+\.so[\d.]*): cannot open shared object file", str(e))
    lib_name = m.group(1) if m else "a library it links"
    need = {"cuda": "the CUDA runtime (libcudart, from the CUDA toolkit or `pip install nvidia-cuda-runtime`) "
                    "and cuBLAS (`pip install nvidia-cublas`); no GPU or driver is needed to import",
            "hip": "ROCm's HIP runtime with hipBLAS and rocBLAS"}.get(backend, "the libraries in llama_spec/_lib")
    return (f"llama_spec ({backend} build) cannot load {lib_name}: install {need}, or install the CPU build "
            "with `LLAMA_SPEC_BACKEND=cpu pip install --force-reinstall --no-cache-dir .` "
            f"(loader said: {e})")


try:
    from llama_spec._llama_cffi import ffi, lib
except ImportError as e:  # pragma: no cover - only when the package was not built or cannot load
    raise ImportError(_load_error(e)) from e

logger = logging.getLogger("llama_spec.llama_cpp")
logging.getLogger("llama_spec").addHandler(logging.NullHandler())

_LEVELS = {
    lib.GGML_LOG_LEVEL_DEBUG: logging.DEBUG,
    lib.GGML_LOG_LEVEL_INFO: logging.INFO,
    lib.GGML_LOG_LEVEL_WARN: logging.WARNING,
    lib.GGML_LOG_LEVEL_ERROR: logging.ERROR,
}

_recent: collections.deque[str] = collections.deque(maxlen=32)  # recent warning/error lines, for error messages
_partial: list[str] = []
_partial_level = [logging.INFO]
_lock = threading.Lock()


@ffi.def_extern()
def _lsp_log_callback(level, text, user_data):  # noqa: ARG001 - signature fixed by ggml
    msg = ffi.string(text).decode("utf-8", "replace")
    with _lock:
        if level != lib.GGML_LOG_LEVEL_CONT:
            _partial_level[0] = _LEVELS.get(level, logging.INFO)
        _partial.append(msg)
        if not msg.endswith("\n"):
            return
        line = "".join(_partial).rstrip("\n")
        _partial.clear()
        py_level = _partial_level[0]
    if py_level >= logging.WARNING:
        _recent.append(line)
    if logger.isEnabledFor(py_level):
        logger.log(py_level, "%s", line)


def recent_errors(n: int = 6) -> list[str]:
    """The last `n` warning/error lines llama.cpp logged (newest last)."""
    return list(_recent)[-n:]


def clear_recent_errors() -> None:
    _recent.clear()


_init_done = False
_init_lock = threading.Lock()


def ensure_init() -> None:
    """Initialise llama.cpp's backends once per process and hook its log (thread-safe).

    Importing the package only loads the library; this runs on the first Model (and before
    anything else that needs the backends, e.g. listing devices or registering RPC servers).
    """
    global _init_done
    if _init_done:
        return
    with _init_lock:
        if _init_done:
            return
        lib.llama_log_set(lib._lsp_log_callback, ffi.NULL)
        lib.llama_backend_init()
        _init_done = True


def backend_initialized() -> bool:
    """Has :func:`ensure_init` run in this process? (Tests check that import alone does not.)"""
    return _init_done
