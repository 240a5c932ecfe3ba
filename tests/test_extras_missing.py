"""Optional extras fail cleanly (issue 26): without ``[server]`` or ``[plot]`` installed, the
command that needs one prints ONE line naming the missing package and the exact pip command,
exits 2, and shows no traceback.

"Not installed" is simulated in a fresh interpreter: a meta path finder placed first refuses to
import the extra's packages (ModuleNotFoundError, as for a package that is not there), then the
CLI's entry point runs as ``llama-spec`` would. Both commands fail before any model is loaded.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

RUNNER = textwrap.dedent("""
    import sys

    BLOCKED = set(sys.argv[1].split(","))

    class HideExtras:
        def find_spec(self, name, path=None, target=None):
            if name.partition(".")[0] in BLOCKED:
                raise ModuleNotFoundError(f"No module named {name!r}", name=name)
            return None

    sys.meta_path.insert(0, HideExtras())
    from llama_spec.cli import main
    sys.exit(main(sys.argv[2:]))
""")


def _run(blocked: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", RUNNER, blocked, *args], capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("blocked, missing", [("uvicorn,starlette", "uvicorn"), ("starlette", "starlette")])
def test_serve_without_the_server_extra(blocked, missing):
    r = _run(blocked, "serve", "-m", "smollm2-135m")
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert r.returncode == 2, r.stderr
    assert lines == [f"llama-spec serve needs the server extra ({missing} is not installed): "
                     "pip install 'llama-spec[server]'"], r.stderr
    assert "Traceback" not in r.stderr and r.stdout == ""


@pytest.mark.parametrize("cmd", ["generate", "chat"])
def test_plot_flag_without_the_plot_extra(cmd, tmp_path):
    r = _run("matplotlib", cmd, "-m", "smollm2-135m", "-p", "hi", "--spec-topk-stats", "--spec-topk-stats-plot",
             str(tmp_path / "p.png"))
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert r.returncode == 2, r.stderr
    assert lines == ["error: --spec-topk-stats-plot needs the plot extra (matplotlib is not installed): "
                     "pip install 'llama-spec[plot]'"], r.stderr
    assert "Traceback" not in r.stderr and r.stdout == ""
    assert not (tmp_path / "p.png").exists()
