"""Models by Hugging Face id: ``from_pretrained(repo_id, filename)`` and the CLI's ``-hf repo[:quant]``.

Files come through ``huggingface_hub`` (its cache, its progress bars, its token handling). The
cache directory and offline mode are read from the environment at call time (``HF_HUB_CACHE``,
``HUGGINGFACE_HUB_CACHE``, ``HF_HOME``; ``HF_HUB_OFFLINE=1``), so a process may switch them.

Choosing the file:

* ``filename`` / the part after ``:`` containing ``*``, ``?`` or ``[`` is an ``fnmatch`` pattern,
  matched case-insensitively against the path in the repository and against its base name;
* any other text is a quantization tag (``Q4_K_M``, ``q8_0``) or a file name: the file whose name
  carries it as a whole tag wins, else the one that merely contains it (case-insensitive);
* nothing given: ``Q4_K_M`` if the repository has it, else the first GGUF file (llama.cpp's
  ``-hf`` rule). ``mmproj`` files (vision projectors) are never chosen implicitly.

A split model (``…-00001-of-00003.gguf``) is fetched whole; the first shard's path is returned
(llama.cpp finds the others next to it). Offline, or when the hub cannot be reached, the file
list comes from the cached snapshot; a file that is not cached then raises
:class:`ModelNotCachedError` with a one-line message.
"""

from __future__ import annotations

import fnmatch
import os
import re
from collections.abc import Iterable
from pathlib import Path

from ..env import env_flag
from ..errors import HubError, ModelNotCachedError

__all__ = [
    "HubError",
    "ModelNotCachedError",
    "download_gguf",
    "hf_cache_dir",
    "is_offline",
    "list_gguf_files",
    "parse_hf_spec",
    "resolve_hf",
    "select_gguf",
]

DEFAULT_QUANT = "Q4_K_M"
_SHARD_RE = re.compile(r"-(\d{5})-of-(\d{5})\.gguf$", re.IGNORECASE)
_HEX40 = re.compile(r"^[0-9a-f]{40}$")


# ----------------------------------------------------------------------------- environment


def is_offline() -> bool:
    """``HF_HUB_OFFLINE`` (or ``TRANSFORMERS_OFFLINE``) set now, or at huggingface_hub's import."""
    for var in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
        if env_flag(var, False):
            return True
    try:
        from huggingface_hub import constants

        return bool(constants.HF_HUB_OFFLINE)
    except Exception:  # noqa: BLE001
        return False


def hf_cache_dir(cache_dir: os.PathLike[str] | str | None = None) -> Path:
    """The hub cache: explicit > ``HF_HUB_CACHE`` > ``HUGGINGFACE_HUB_CACHE`` > ``$HF_HOME/hub``."""
    if cache_dir is not None:
        return Path(cache_dir).expanduser()
    for var in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"):
        v = os.environ.get(var)
        if v:
            return Path(os.path.expandvars(v)).expanduser()
    home = os.environ.get("HF_HOME")
    if home:
        return Path(os.path.expandvars(home)).expanduser() / "hub"
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / "huggingface" / "hub"


# ----------------------------------------------------------------------------- parsing


def parse_hf_spec(spec: str) -> tuple[str, str | None]:
    """``"owner/name[:quant]"`` (also ``hf.co/…``, ``https://huggingface.co/…``) -> (repo, quant)."""
    s = spec.strip()
    for prefix in ("https://huggingface.co/", "http://huggingface.co/", "huggingface.co/", "hf.co/"):
        if s.startswith(prefix):
            s = s[len(prefix):]
            break
    repo, sep, quant = s.partition(":")
    repo = repo.strip().strip("/")
    parts = repo.split("/")
    if len(parts) != 2 or not all(parts):
        raise HubError(f"-hf {spec!r}: expected owner/name[:quant], e.g. Qwen/Qwen2.5-0.5B-Instruct-GGUF:Q4_K_M")
    return repo, (quant.strip() or None) if sep else None


def _is_pattern(s: str) -> bool:
    return any(c in s for c in "*?[")


def _shard_group(name: str) -> str | None:
    m = _SHARD_RE.search(name)
    return name[: m.start()] if m else None


def select_gguf(files: Iterable[str], want: str | None) -> list[str]:
    """The file(s) to fetch for ``want`` (pattern, quant tag or None): one file, or every shard.

    Raises :class:`HubError` naming the candidates when nothing or several models match.
    """
    ggufs = sorted(f for f in files if f.lower().endswith(".gguf"))
    if not ggufs:
        raise HubError("no .gguf file in the repository")
    plain = [f for f in ggufs if "mmproj" not in os.path.basename(f).lower()]

    if want is None:
        hits = _match_quant(plain, DEFAULT_QUANT) or plain[:1]
    elif _is_pattern(want):
        w = want.lower()
        hits = [f for f in ggufs if fnmatch.fnmatchcase(f.lower(), w)
                or fnmatch.fnmatchcase(os.path.basename(f).lower(), w)]
    else:
        exact = [f for f in ggufs if f == want or os.path.basename(f) == want]
        hits = exact or _match_quant(plain, want) or _match_quant(ggufs, want)
    if not hits:
        shown = ", ".join(ggufs[:12]) + (" …" if len(ggufs) > 12 else "")
        raise HubError(f"no GGUF file matches {want!r}; the repository has: {shown}")

    groups: dict[str, list[str]] = {}
    for f in hits:
        groups.setdefault(_shard_group(f) or f, []).append(f)
    if len(groups) > 1:
        raise HubError(f"{want!r} matches several models: {', '.join(sorted(groups))}; be more specific")
    (key, members), = groups.items()
    if _shard_group(members[0]) is not None:  # fetch every shard of the split model
        members = sorted(f for f in ggufs if _shard_group(f) == key)
    return members


def _match_quant(files: list[str], quant: str) -> list[str]:
    q = re.escape(quant.lower())
    tag = re.compile(rf"(^|[-._/]){q}([-._]|$)")
    whole = [f for f in files if tag.search(os.path.basename(f).lower()) or tag.search(f.lower())]
    return whole or [f for f in files if quant.lower() in os.path.basename(f).lower()]


# ----------------------------------------------------------------------------- cache


def _repo_folder(repo_id: str, cache: Path) -> Path:
    return cache / ("models--" + repo_id.replace("/", "--"))


def _cached_snapshot(repo_id: str, revision: str | None, cache: Path) -> Path | None:
    """The cached snapshot folder for ``revision`` (default ``main``), or None."""
    root = _repo_folder(repo_id, cache)
    rev = revision or "main"
    if _HEX40.match(rev):
        snap = root / "snapshots" / rev
        return snap if snap.is_dir() else None
    ref = root / "refs" / rev
    try:
        commit = ref.read_text().strip()
    except OSError:
        commit = None
    if commit:
        snap = root / "snapshots" / commit
        if snap.is_dir():
            return snap
    if revision is None:  # no ref recorded: a single snapshot is unambiguous
        snaps = [p for p in (root / "snapshots").glob("*") if p.is_dir()] if (root / "snapshots").is_dir() else []
        if len(snaps) == 1:
            return snaps[0]
    return None


def _cached_files(snapshot: Path) -> list[str]:
    return sorted(p.relative_to(snapshot).as_posix() for p in snapshot.rglob("*")
                  if p.is_file())  # is_file follows the blob symlinks: broken links are skipped


def list_gguf_files(repo_id: str, *, revision: str | None = None,
                    cache_dir: os.PathLike[str] | str | None = None) -> tuple[list[str], str]:
    """The repository's files and where the list came from (``"hub"`` or ``"cache"``).

    Offline, or when the hub cannot be reached, the cached snapshot is listed instead; with no
    snapshot either, :class:`ModelNotCachedError` is raised.
    """
    cache = hf_cache_dir(cache_dir)
    reason = "HF_HUB_OFFLINE=1"
    if not is_offline():
        try:
            from huggingface_hub import HfApi

            return list(HfApi().list_repo_files(repo_id, revision=revision)), "hub"
        except Exception as e:  # noqa: BLE001 - classified below
            if _is_hub_answer(e):
                raise HubError(f"{repo_id}: {_one_line(e)}") from None
            reason = f"the hub is unreachable ({type(e).__name__})"
    snap = _cached_snapshot(repo_id, revision, cache)
    if snap is None:
        raise ModelNotCachedError(repo_id, "*", cache, reason)
    return _cached_files(snap), "cache"


def _is_hub_answer(e: Exception) -> bool:
    """True for a real answer of the hub (no such repo/revision, gated, ...): no cache fallback."""
    try:
        from huggingface_hub.errors import (
            GatedRepoError,
            RepositoryNotFoundError,
            RevisionNotFoundError,
        )
    except ImportError:  # pragma: no cover
        return False
    return isinstance(e, (RepositoryNotFoundError, RevisionNotFoundError, GatedRepoError))


def _one_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return text[0] if text else type(e).__name__


def _download(repo_id: str, filename: str, *, revision: str | None, cache: Path, offline: bool,
              reason: str) -> Path:
    from huggingface_hub import hf_hub_download
    from huggingface_hub.errors import LocalEntryNotFoundError  # huggingface_hub >= 0.23

    try:
        return Path(hf_hub_download(repo_id, filename, revision=revision, cache_dir=cache,
                                    local_files_only=offline))
    except LocalEntryNotFoundError:
        raise ModelNotCachedError(repo_id, filename, cache, reason) from None
    except Exception as e:  # noqa: BLE001
        if _is_hub_answer(e):
            raise HubError(f"{repo_id}/{filename}: {_one_line(e)}") from None
        raise HubError(f"cannot fetch {repo_id}/{filename}: {_one_line(e)}") from None


def _display(want: str | None) -> str:
    """How a requested file is named in messages: the pattern or file name, else ``*QUANT*.gguf``."""
    if want and (_is_pattern(want) or want.lower().endswith(".gguf")):
        return want
    return f"*{want or DEFAULT_QUANT}*.gguf"


def _fetch(repo_id: str, want: str | None, *, revision: str | None,
           cache_dir: os.PathLike[str] | str | None) -> Path:
    cache = hf_cache_dir(cache_dir)
    offline = is_offline()
    try:
        files, source = list_gguf_files(repo_id, revision=revision, cache_dir=cache)
    except ModelNotCachedError as e:
        raise ModelNotCachedError(repo_id, _display(want), cache, str(e).split(" and ")[0]) from None
    reason = "HF_HUB_OFFLINE=1" if offline else "the hub is unreachable"
    try:
        chosen = select_gguf(files, want)
    except HubError:
        if source == "cache":
            raise ModelNotCachedError(repo_id, _display(want), cache, reason) from None
        raise
    local_only = offline or source == "cache"
    paths = [_download(repo_id, f, revision=revision, cache=cache, offline=local_only, reason=reason)
             for f in chosen]
    return paths[0]


# ----------------------------------------------------------------------------- public API


def resolve_hf(spec: str, *, revision: str | None = None, cache_dir: os.PathLike[str] | str | None = None) -> Path:
    """``-hf owner/name[:quant]`` -> the local path of the GGUF file (downloaded if needed)."""
    repo_id, quant = parse_hf_spec(spec)
    return _fetch(repo_id, quant, revision=revision, cache_dir=cache_dir)


def download_gguf(repo_id: str, filename: str | None = None, *, revision: str | None = None,
                  cache_dir: os.PathLike[str] | str | None = None) -> Path:
    """The local path of a GGUF from a Hugging Face repository (downloaded if needed).

    ``filename`` is a pattern, a quant tag or a file name (see the module docs); a split model
    is fetched whole and its first shard returned. :meth:`llama_spec.Model.from_pretrained`
    loads it.
    """
    parse_hf_spec(repo_id)  # validates the owner/name shape
    return _fetch(repo_id.strip(), filename, revision=revision, cache_dir=cache_dir)
