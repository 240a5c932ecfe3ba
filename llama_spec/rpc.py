"""llama.cpp's RPC backend from Python: local rpc-servers, endpoint probes, and lost servers.

*Security*: the RPC protocol is unauthenticated and unencrypted. Anyone who can reach an
rpc-server's port can read and write its memory buffers and run graphs on it. Bind servers to
loopback (the default here) or to a private, trusted network; never expose one to the internet.

Three parts:

* :func:`local_rpc_servers` / :func:`start_rpc_server` start ``ggml-rpc-server`` processes
  (the binary shipped in ``llama_spec/_lib``) on free loopback ports, wait until each answers
  the RPC handshake, and stop them on exit - for tests, and for trying a split on one machine.
* :func:`probe` performs the RPC ``HELLO`` handshake with a timeout, so an unreachable,
  busy or foreign endpoint gives a clear :class:`RpcConnectionError` instead of ggml-rpc's
  ``abort()`` or an endless wait (:func:`llama_spec.backends.add_rpc_server` uses it).
* Lost servers. ggml-rpc has no error path: when the connection to a server breaks, its
  dispatcher thread calls ``GGML_ABORT`` (``ggml_abort`` runs the abort callback, then always
  ``abort()``). :func:`call_guarded` runs a callable on a worker thread with an abort callback
  installed that, for ggml-rpc's connection aborts, wakes the caller and parks the aborting
  thread for good instead of returning to ``abort()``; the caller gets an
  :class:`RpcConnectionError` naming the endpoint and the process survives. What was allocated
  on the lost server can never be freed (freeing goes through the parked thread), so models
  and contexts that use it are leaked on purpose and refuse further use; the endpoint cannot
  be used again in this process (ggml-rpc keys its connection by the endpoint string).
  Outside :func:`call_guarded` a lost connection still aborts the process, after a clear
  message naming the endpoint on stderr and in the ``llama_spec.rpc`` log.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import socket
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

log = logging.getLogger("llama_spec.rpc")

# ggml-rpc wire protocol of the pinned llama.cpp (ggml/include/ggml-rpc.h, ggml-rpc.cpp)
RPC_PROTO_MAJOR_VERSION = 7
RPC_PROTO_MINOR_VERSION = 0
_RPC_CMD_HELLO = 14
_RPC_CONN_CAPS_SIZE = 24
_HELLO_RSP_SIZE = 4 + _RPC_CONN_CAPS_SIZE

DEFAULT_TIMEOUT = 5.0

T = TypeVar("T")


class RpcConnectionError(ConnectionError):
    """An RPC server could not be reached, or was lost while in use."""

    def __init__(self, endpoint: str, message: str):
        super().__init__(f"RPC server {endpoint} {message}")
        self.endpoint = endpoint
        self.reason = message


# -- endpoints ---------------------------------------------------------------------------------
def parse_endpoint(endpoint: str) -> tuple[str, int]:
    """"host:port" -> (host, port), with ggml-rpc's own rules (IPv4 / host name, last ':')."""
    if not isinstance(endpoint, str):
        raise TypeError(f"RPC endpoint must be a 'host:port' string, got {type(endpoint).__name__}")
    host, sep, port = endpoint.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"RPC endpoint {endpoint!r} must look like host:port (port 1-65535)")
    return host, int(port)


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise ConnectionResetError("connection closed by the peer")
        buf += chunk
    return bytes(buf)


def probe(endpoint: str, timeout: float = DEFAULT_TIMEOUT) -> tuple[int, int, int]:
    """RPC handshake with `endpoint`, bounded by `timeout` seconds in all; return its version.

    Raises :class:`RpcConnectionError` when nothing listens there, when it does not answer
    in time (an rpc-server serves one client at a time: a busy one does not answer until its
    client disconnects), when it does not speak the RPC protocol, or on a version mismatch.
    """
    host, port = parse_endpoint(endpoint)
    deadline = time.monotonic() + timeout
    try:
        sock = socket.create_connection((host, port), timeout=timeout)
    except TimeoutError:
        raise RpcConnectionError(endpoint, f"is unreachable: no TCP connection within {timeout:g} s") from None
    except OSError as e:
        raise RpcConnectionError(endpoint, f"is unreachable: {e.strerror or e}") from None
    with sock:
        try:
            sock.settimeout(max(deadline - time.monotonic(), 0.01))
            sock.sendall(bytes([_RPC_CMD_HELLO]) + struct.pack("<Q", _RPC_CONN_CAPS_SIZE) + bytes(_RPC_CONN_CAPS_SIZE))
            (size,) = struct.unpack("<Q", _recv_exact(sock, 8))
            if size != _HELLO_RSP_SIZE:
                raise RpcConnectionError(endpoint, f"is not a compatible ggml rpc-server (HELLO reply of {size} bytes)")
            major, minor, patch = _recv_exact(sock, size)[:3]
        except TimeoutError:
            raise RpcConnectionError(
                endpoint, f"accepted the connection but did not answer the RPC handshake within {timeout:g} s "
                "(an rpc-server serves one client at a time: is another process using it?)") from None
        except OSError as e:
            raise RpcConnectionError(endpoint, f"broke off the RPC handshake ({e.strerror or e}): "
                                               "is it a ggml rpc-server?") from None
    if major != RPC_PROTO_MAJOR_VERSION or minor > RPC_PROTO_MINOR_VERSION:
        raise RpcConnectionError(
            endpoint, f"speaks RPC protocol {major}.{minor}.{patch}; this build needs "
            f"{RPC_PROTO_MAJOR_VERSION}.x with x <= {RPC_PROTO_MINOR_VERSION} (use the same llama.cpp on both ends)")
    return major, minor, patch


def wait_until_ready(endpoint: str, timeout: float = 30.0, *, proc: subprocess.Popen | None = None) -> None:
    """Retry :func:`probe` until the server answers, `proc` exits, or `timeout` passes."""
    deadline = time.monotonic() + timeout
    last: Exception | None = None
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RpcConnectionError(endpoint, f"process exited with code {proc.returncode} before it was ready")
        try:
            probe(endpoint, timeout=min(2.0, max(deadline - time.monotonic(), 0.05)))
            return
        except RpcConnectionError as e:
            last = e
            time.sleep(0.05)
    raise RpcConnectionError(endpoint, f"was not ready within {timeout:g} s ({last})")


# -- local servers -----------------------------------------------------------------------------
def rpc_server_binary() -> Path:
    """The ``ggml-rpc-server`` built with this package."""
    p = Path(__file__).resolve().parent / "_lib" / "ggml-rpc-server"
    if not p.exists():
        raise FileNotFoundError(f"{p} is missing (the package was built without the RPC server)")
    return p


def _die_with_parent() -> None:  # runs in the child between fork and exec
    if sys.platform.startswith("linux"):
        import ctypes
        import signal

        ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGTERM))  # PR_SET_PDEATHSIG


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nobody listens on right now (another process may still take it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


@dataclass
class RpcServer:
    """A running local ``ggml-rpc-server`` process."""

    endpoint: str
    proc: subprocess.Popen = field(repr=False)
    log_path: Path | None = None

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def output(self) -> str:
        """What the server printed so far (when started with a log file)."""
        if self.log_path is None or not self.log_path.exists():
            return ""
        return self.log_path.read_text(errors="replace")

    def kill(self) -> None:
        """SIGKILL, as a crash would (no goodbye on the socket beyond the kernel's)."""
        if self.alive():
            self.proc.kill()
        self.proc.wait()

    def stop(self, timeout: float = 5.0) -> None:
        if self.alive():
            self.proc.terminate()
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def start_rpc_server(
    *,
    host: str = "127.0.0.1",
    port: int | None = None,
    threads: int = 1,
    device: str | None = None,
    ready_timeout: float = 30.0,
    log_path: str | os.PathLike | None = None,
    die_with_parent: bool = True,
) -> RpcServer:
    """Start ``ggml-rpc-server -H host -p port`` and wait until it answers the handshake.

    `port` None picks a free one (retrying if another process takes it first). Binding to a
    non-loopback `host` exposes this machine to whoever can reach the port (see module doc).
    `die_with_parent` (Linux): the server gets SIGTERM when the thread that started it ends -
    also when this process is killed or aborts - so no server outlives its test.
    """
    if host not in ("127.0.0.1", "localhost") and not host.startswith("127."):
        log.warning("rpc-server on %s: the RPC protocol is unauthenticated; never face an untrusted network", host)
    for attempt in range(5):
        p = port if port is not None else free_port(host if host != "localhost" else "127.0.0.1")
        args = [str(rpc_server_binary()), "-H", host, "-p", str(p), "-t", str(int(threads))]
        if device:
            args += ["-d", device]
        out = open(log_path, "ab") if log_path is not None else subprocess.DEVNULL  # noqa: SIM115
        try:
            proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                    preexec_fn=_die_with_parent if die_with_parent else None)
        finally:
            if log_path is not None:
                out.close()
        server = RpcServer(f"{host}:{p}", proc, Path(log_path) if log_path is not None else None)
        try:
            wait_until_ready(server.endpoint, ready_timeout, proc=proc)
            return server
        except RpcConnectionError:
            server.stop()
            if port is not None or attempt == 4 or proc.returncode == 0:
                raise
            # most likely the free port was taken in between: try another one
    raise AssertionError("unreachable")  # pragma: no cover


@contextlib.contextmanager
def local_rpc_servers(
    n: int, *, threads: int = 1, host: str = "127.0.0.1", ready_timeout: float = 30.0,
    log_dir: str | os.PathLike | None = None,
) -> Iterator[list[str]]:
    """Start `n` rpc-servers on free ports of `host`; yield their "host:port" endpoints.

    Every server answers the RPC handshake before the body runs, and all are stopped on exit
    (SIGTERM, then SIGKILL). Use :func:`local_rpc_server_handles` for the processes.
    """
    with local_rpc_server_handles(n, threads=threads, host=host, ready_timeout=ready_timeout,
                                  log_dir=log_dir) as servers:
        yield [s.endpoint for s in servers]


@contextlib.contextmanager
def local_rpc_server_handles(
    n: int, *, threads: int = 1, host: str = "127.0.0.1", ready_timeout: float = 30.0,
    log_dir: str | os.PathLike | None = None,
) -> Iterator[list[RpcServer]]:
    """Like :func:`local_rpc_servers`, yielding :class:`RpcServer` handles (to kill one, say)."""
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    servers: list[RpcServer] = []
    try:
        for i in range(n):
            lp = Path(log_dir) / f"rpc-server-{i}.log" if log_dir is not None else None
            servers.append(start_rpc_server(host=host, threads=threads, ready_timeout=ready_timeout, log_path=lp))
        yield servers
    finally:
        for s in servers:
            s.stop()


# -- lost servers ------------------------------------------------------------------------------
# ggml-rpc aborts the process when a connection breaks (module doc). The abort callback below
# turns that into an exception for code run through call_guarded().

_lock = threading.RLock()
_registered: dict[str, None] = {}     # endpoints registered with ggml in this process (ordered)
_lost: dict[str, str] = {}            # endpoint -> why it is considered lost
_waiters: list[_Guard] = []           # guarded calls in flight
_abort_state: dict[str, Any] = {}     # the cffi ABI handle and callback (kept alive)

# GGML_ABORT messages of ggml-rpc's client side that mean "the connection is gone"
_RPC_ABORT_MARKERS = (
    "Remote RPC server crashed",
    "Failed to connect to ",
    "RPC handshake failed for ",
)


# threading's stand-in for threads not started by Python (ggml-rpc's dispatcher threads)
_FOREIGN_THREAD = getattr(threading, "_DummyThread", ())


class _Guard:
    __slots__ = ("done", "failure")

    def __init__(self) -> None:
        self.done = threading.Event()
        self.failure: RpcConnectionError | None = None


def note_registered(endpoint: str) -> None:
    """Record that `endpoint` was registered with ggml (called by backends.add_rpc_server)."""
    with _lock:
        _registered[endpoint] = None
    install_abort_handler()


def registered_endpoints() -> list[str]:
    with _lock:
        return list(_registered)


def lost_endpoints() -> dict[str, str]:
    """Endpoints this process lost (endpoint -> reason). They cannot be used again here."""
    with _lock:
        return dict(_lost)


def check_not_lost(endpoint: str) -> None:
    with _lock:
        why = _lost.get(endpoint)
    if why is not None:
        raise RpcConnectionError(
            endpoint, f"was lost earlier in this process ({why}); ggml-rpc keeps one connection per endpoint "
            "and cannot reconnect it, so this process cannot use it again (restart the process)")


def _libggml_base_path() -> Path:
    """The libggml-base this process loaded (the binding links it), else the packaged one."""
    with contextlib.suppress(OSError), open("/proc/self/maps") as fh:
        for line in fh:
            path = line.rstrip("\n").split(maxsplit=5)[-1]
            if os.path.basename(path).startswith("libggml-base.so"):
                return Path(path)
    return Path(__file__).resolve().parent / "_lib" / "libggml-base.so.0"


def install_abort_handler() -> bool:
    """Install the ggml abort callback that makes ggml-rpc connection losses recoverable.

    Idempotent; done automatically when an RPC server is registered. Other aborts keep
    ggml's behaviour (message and backtrace on stderr, then ``abort()``).
    """
    with _lock:
        if _abort_state:
            return True
        try:
            import cffi

            abi = cffi.FFI()
            abi.cdef(
                "typedef void (*ggml_abort_callback_t)(const char * error_message);"
                "ggml_abort_callback_t ggml_set_abort_callback(ggml_abort_callback_t callback);"
                "void ggml_print_backtrace(void);"
            )
            from . import _ffi  # noqa: F401 - loads libggml-base first

            # the libggml-base the binding loaded: dlopen returns that handle, same globals
            base = abi.dlopen(str(_libggml_base_path()))
            cb = abi.callback("void(const char *)", _on_ggml_abort)
            prev = base.ggml_set_abort_callback(cb)
        except Exception as e:  # noqa: BLE001 - best effort: without it a lost server aborts
            log.warning("could not install the ggml abort callback (%s): a lost RPC server will abort the process", e)
            return False
        _abort_state.update(abi=abi, base=base, cb=cb, prev=prev)
        atexit.register(_at_exit)
        return True


def _at_exit() -> None:
    """Before the interpreter tears down: retire what lives on servers that are gone.

    Freeing a model whose server is gone makes ggml-rpc abort (or, with the callback still
    installed while Python finalizes, wait forever). So models on servers that no longer answer
    are leaked, and the callback is removed: from here on ggml's own abort() applies.
    """
    with contextlib.suppress(Exception):
        release_unreachable(timeout=1.0)
    with _lock:
        state = dict(_abort_state)
    if state:
        with contextlib.suppress(Exception):
            state["base"].ggml_set_abort_callback(state["prev"])


def _live_rpc_models() -> list:
    import gc

    from .model import Model

    return [o for o in gc.get_objects() if isinstance(o, Model) and model_endpoints(o)]


def release_unreachable(timeout: float = 1.0) -> dict[str, str]:
    """Retire models and contexts on RPC servers that stopped answering; return {endpoint: why}.

    Their native memory is leaked (freeing it would make ggml-rpc abort the process) and they
    become :class:`LostRpcObject`; the endpoints count as lost for this process. Runs by itself
    at interpreter exit; call it before closing models when a server may have gone away.
    """
    with _lock:
        known_lost = set(_lost)
    in_use = {ep for m in _live_rpc_models() for ep in model_endpoints(m)} - known_lost
    bad = {}
    for ep in sorted(in_use):
        ok, why = endpoint_usable(ep, timeout=timeout)
        if not ok:
            bad[ep] = why
    if bad:
        with _lock:
            for ep, why in bad.items():
                _lost.setdefault(ep, why)
        _tombstone_lost()
    return bad


def _our_tcp_states(host: str, port: int) -> list[str]:
    """TCP states (hex, /proc/net/tcp) of this process's sockets connected to host:port."""
    try:
        addr = socket.gethostbyname(host)
        inodes = set()
        for fd in os.listdir("/proc/self/fd"):
            with contextlib.suppress(OSError):
                target = os.readlink(f"/proc/self/fd/{fd}")
                if target.startswith("socket:["):
                    inodes.add(target[8:-1])
        want = f"{struct.unpack('=I', socket.inet_aton(addr))[0]:08X}:{port:04X}"  # kernel byte order
        states = []
        with open("/proc/net/tcp") as fh:
            next(fh)
            for line in fh:
                f = line.split()
                if f[2] == want and f[9] in inodes:
                    states.append(f[3])
        return states
    except (OSError, ValueError, StopIteration):
        return []


_TCP_ESTABLISHED, _TCP_CLOSE_WAIT = "01", "08"


def _liveness(endpoint: str) -> tuple[bool | None, str]:
    """(False, why) if `endpoint` is certainly gone, (True, why) if certainly up, else (None, why)."""
    try:
        host, port = parse_endpoint(endpoint)
    except (TypeError, ValueError):
        return None, "bad endpoint"
    states = _our_tcp_states(host, port)
    if _TCP_CLOSE_WAIT in states:
        return False, "the server closed the connection"
    if _TCP_ESTABLISHED in states:
        return True, "connection established"
    # no open connection of ours left (reset): is anything listening there?
    try:
        with socket.create_connection((host, port), timeout=1.0):
            return True, "accepts connections"
    except ConnectionRefusedError:
        return False, "connection refused"
    except TimeoutError:
        return None, "no answer within 1 s"
    except OSError as e:
        return False, e.strerror or str(e)


def endpoint_usable(endpoint: str, timeout: float = DEFAULT_TIMEOUT) -> tuple[bool, str]:
    """Whether ggml may talk to `endpoint` now without aborting or hanging: (ok, why).

    An open connection of this process counts as usable (an rpc-server serves one client at
    a time, so a handshake probe would wait behind it); otherwise the handshake must succeed.
    """
    with _lock:
        why = _lost.get(endpoint)
    if why is not None:
        return False, f"lost earlier in this process ({why})"
    try:
        host, port = parse_endpoint(endpoint)
    except (TypeError, ValueError) as e:
        return False, str(e)
    states = _our_tcp_states(host, port)
    if _TCP_CLOSE_WAIT in states:
        return False, "the server closed the connection"
    if _TCP_ESTABLISHED in states:
        return True, "connected"
    try:
        probe(endpoint, timeout=timeout)
    except RpcConnectionError as e:
        return False, e.reason
    return True, "answers the handshake"


def _identify_lost(message: str) -> dict[str, str]:
    """Which registered endpoint(s) the abort `message` is about."""
    for marker in ("Failed to connect to ", "RPC handshake failed for "):
        if marker in message:
            ep = message.split(marker, 1)[1].strip()
            return {ep: "connection failed" if marker.startswith("Failed") else "handshake failed"}
    endpoints = registered_endpoints()
    verdicts = {ep: _liveness(ep) for ep in endpoints}
    dead = {ep: why for ep, (alive, why) in verdicts.items() if alive is False}
    if dead:
        return dead
    unsure = {ep: why for ep, (alive, why) in verdicts.items() if alive is None}
    return unsure or {ep: "connection broke" for ep in endpoints}


def _on_ggml_abort(c_message) -> None:
    """ggml_abort's callback: runs on the aborting thread, which `abort()`s when this returns."""
    try:
        message = _abort_state["abi"].string(c_message).decode("utf-8", "replace")
    except Exception:  # noqa: BLE001
        message = "(unreadable abort message)"
    if not any(m in message for m in _RPC_ABORT_MARKERS):
        # not ours: ggml's default behaviour (the callback replaces its printing)
        sys.stderr.write(message + "\n")
        sys.stderr.flush()
        with contextlib.suppress(Exception):
            _abort_state["base"].ggml_print_backtrace()
        return
    lost = _identify_lost(message)
    detail = message.rsplit(": ", 1)[-1].strip()
    names = ", ".join(lost) or "(unknown)"
    reasons = "; ".join(f"{ep}: {why}" for ep, why in lost.items())
    with _lock:
        for ep, why in lost.items():
            _lost.setdefault(ep, why)
        waiters = list(_waiters)
        # Park only ggml-rpc's own dispatcher threads (foreign to Python): they hold no lock.
        # The other RPC aborts happen while connecting, on the calling thread, under
        # ggml-rpc's global dispatcher mutex - parking there would deadlock every later use.
        park = bool(waiters) and isinstance(threading.current_thread(), _FOREIGN_THREAD)
        if park:
            err = RpcConnectionError(
                names, f"was lost during the call ({reasons}; ggml-rpc: {detail}). Models and contexts "
                "using it are unusable now (their memory is leaked on purpose) and this process cannot "
                "use the endpoint again")
            for w in waiters:
                if w.failure is None:
                    w.failure = err
                w.done.set()
    log.error("RPC server %s lost (%s; ggml-rpc: %s)", names, reasons, detail)
    if park:
        # Never return: returning means abort(). This thread (ggml-rpc's dispatcher, or the
        # guarded worker) stays parked; what waits on it is leaked (see _tombstone_lost).
        threading.Event().wait()
    sys.stderr.write(
        f"llama_spec: RPC server {names} lost ({reasons}; ggml-rpc: {detail}).\n"
        "llama_spec: ggml-rpc cannot recover from a broken connection outside llama_spec.rpc.call_guarded() "
        "and aborts the process now.\n")
    sys.stderr.flush()


class LostRpcObject:
    """What a Model or Context becomes when an RPC server holding part of it is lost.

    Its native memory is leaked on purpose (freeing it would wait forever on the lost
    connection); every use raises :class:`RpcConnectionError`; ``close()`` does nothing.
    """

    _ALLOWED = frozenset({"close", "__class__", "__dict__", "__repr__", "__enter__", "__exit__", "__del__",
                          "lost_endpoint", "_rpc_lost", "__reduce_ex__"})

    def __getattribute__(self, name: str):
        if name in LostRpcObject._ALLOWED:
            return object.__getattribute__(self, name)
        raise RpcConnectionError(
            self.lost_endpoint, f"was lost: this {object.__getattribute__(self, '__dict__').get('_rpc_lost', ('?',))[0]} "
            "was on it and cannot be used any more (load the model again on reachable servers)")

    @property
    def lost_endpoint(self) -> str:
        return object.__getattribute__(self, "__dict__").get("_rpc_lost", ("", "?"))[1]

    def close(self) -> None:
        pass

    def __del__(self) -> None:
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        pass

    def __repr__(self) -> str:
        d = object.__getattribute__(self, "__dict__")
        kind, ep = d.get("_rpc_lost", ("object", "?"))
        return f"<lost {kind}: RPC server {ep} was lost>"


def model_endpoints(model) -> tuple[str, ...]:
    return tuple(getattr(model, "rpc_endpoints", ()) or ())


def _tombstone_lost() -> None:
    """Turn every live Model / Context that uses a lost endpoint into a LostRpcObject."""
    import gc

    from .context import Context
    from .model import Model

    with _lock:
        lost = set(_lost)
    if not lost:
        return
    models = {}
    objs = gc.get_objects()
    for o in objs:
        if isinstance(o, Model):
            eps = [ep for ep in model_endpoints(o) if ep in lost]
            if eps:
                models[id(o)] = (o, eps[0])
    for o in objs:
        if isinstance(o, Context):
            hit = models.get(id(o.__dict__.get("model")))
            if hit is not None:
                o.__dict__["_rpc_lost"] = (type(o).__name__, hit[1])
                o.__class__ = LostRpcObject
    for o, ep in models.values():
        o.__dict__["_rpc_lost"] = (type(o).__name__, ep)
        o.__class__ = LostRpcObject


def retire_if_unreachable(model, timeout: float = 1.0) -> bool:
    """Before freeing `model` (or a context on it): True if one of its servers is gone.

    Then `model`, its contexts and everything else on that server were turned into
    :class:`LostRpcObject` (leaked); the caller must not free anything. False: free as usual.
    """
    eps = model_endpoints(model)
    if not eps:
        return False
    bad = {}
    for ep in eps:
        ok, why = endpoint_usable(ep, timeout=timeout)
        if not ok:
            bad[ep] = why
    if not bad:
        return False
    with _lock:
        for ep, why in bad.items():
            _lost.setdefault(ep, why)
    _tombstone_lost()
    log.warning("RPC server %s is gone: leaking what lived on it instead of freeing it", ", ".join(bad))
    return True


def check_model(model) -> None:
    """Raise RpcConnectionError if `model` uses an RPC server this process lost."""
    for ep in model_endpoints(model):
        check_not_lost(ep)


def call_guarded(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """Run ``fn(*args, **kwargs)``; if an RPC server is lost meanwhile, raise instead of aborting.

    ``fn`` runs on a worker thread while the caller waits. Should ggml-rpc hit a broken
    connection, the caller gets :class:`RpcConnectionError` naming the endpoint, the worker is
    abandoned (it waits forever inside llama.cpp), and every Model / Context on the lost server
    becomes a :class:`LostRpcObject`. Without registered RPC servers ``fn`` just runs here.
    One guarded call at a time per process is the intended use.
    """
    with _lock:
        direct = not _registered or not _abort_state
    if direct:
        return fn(*args, **kwargs)
    guard = _Guard()
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["value"] = fn(*args, **kwargs)
        except BaseException as e:  # noqa: BLE001 - handed to the caller
            box["error"] = e
        finally:
            guard.done.set()

    worker = threading.Thread(target=run, name="llama-spec-rpc-call", daemon=True)
    with _lock:
        _waiters.append(guard)
    try:
        worker.start()
        try:
            guard.done.wait()
        except BaseException:
            # Ctrl-C: the native call cannot be interrupted; let it finish before leaving
            guard.done.wait()
            raise
    finally:
        with _lock:
            _waiters.remove(guard)
    if guard.failure is not None:
        _tombstone_lost()
        raise guard.failure
    if "error" in box:
        raise box["error"]
    return box["value"]
