"""Cost models kept between runs: a CLI run's controller starts from what the last run measured.

A ``llama-spec generate`` run is a new process, so its controller would start cold every time:
cold turns of the draft model at full length and costs learned again (the first request pays
for them). The CLI saves the controller (``SpecController.save``: costs and survival) at the end
of a run, in a file named by everything the costs depend on (``cache_key``), and the next run
with the same setup starts from it (``cost_model=``; survival enters as a prior of at most 4
verifications per key, and every measurement of the new run updates it as before).

``LLAMA_SPEC_COST_CACHE``: unset, the folder ``~/.cache/llama-spec/cost-models``; ``0`` / ``off``:
no cache; anything else: that folder. ``--spec-cost-model FILE`` (a file from ``llama-spec tune
--save``) is read instead of the cache; the run still updates the cache, never that file.
A file that cannot be read is ignored with a warning (the run starts cold), a folder that
cannot be written too: the cache is an optimisation, never a reason to fail.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import platform
from collections.abc import Sequence
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..env import env_value_or_off
from .cost_model import load_cost_model

if TYPE_CHECKING:
    from .controller import SpecController

ENV_COST_CACHE = "LLAMA_SPEC_COST_CACHE"


def cost_cache_dir() -> Path | None:
    """The cache folder as LLAMA_SPEC_COST_CACHE says (None: off)."""
    raw = env_value_or_off(ENV_COST_CACHE)
    if raw is None:
        return None
    return Path(raw).expanduser() if raw else Path.home() / ".cache" / "llama-spec" / "cost-models"


def cpu_name() -> str:
    """The CPU's model name (/proc/cpuinfo where there is one): costs measured on one CPU are not another's."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def file_id(path: os.PathLike[str] | str) -> list[Any]:
    """A model file as its resolved path, size and modification time (a replaced file is a new one)."""
    p = Path(path).resolve()
    st = p.stat()
    return [str(p), st.st_size, st.st_mtime_ns]


def package_version() -> str:
    """llama-spec's installed version (a new one may decode at other costs: a new file)."""
    try:
        return metadata.version("llama-spec")
    except metadata.PackageNotFoundError:
        return "unknown"


def cache_key(parts: Sequence[Any]) -> str:
    """A file name for the setup `parts` (JSON-serialisable): a digest of them, the CPU and the version."""
    blob = json.dumps([cpu_name(), platform.machine(), package_version(), *parts], sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:32] + ".json"


def cache_path(parts: Sequence[Any]) -> Path | None:
    """Where the cost model of setup `parts` is kept (None: the cache is off)."""
    folder = cost_cache_dir()
    return None if folder is None else folder / cache_key(parts)


def load_cached(path: Path | None) -> tuple[dict[str, Any] | None, str | None]:
    """(the saved model, None), or (None, why not): absent, unreadable or not a saved model."""
    if path is None or not path.exists():
        return None, None
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        return None, f"{path}: not read ({e.__class__.__name__}: {e}); starting cold"
    try:   # (read here, not by the generator: a damaged file must not stop the run)
        load_cost_model(data, 0.98)
    except Exception as e:   # noqa: BLE001 (a file's damage can raise anything from the parsers)
        return None, f"{path}: not a saved cost model ({e.__class__.__name__}: {e}); starting cold"
    return data, None


def save_cached(ctl: SpecController, path: Path | None) -> str | None:
    """Write the controller's model to `path` (a temporary file, then renamed: a reader never sees
    half a file, and of two runs at once the last one wins). Returns why not, or None."""
    if path is None:
        return None
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        ctl.save(tmp)
        os.replace(tmp, path)
    except OSError as e:
        with contextlib.suppress(OSError):   # (where the folder could not be made, neither can this)
            tmp.unlink(missing_ok=True)
        return f"{path}: not written ({e.__class__.__name__}: {e})"
    return None
