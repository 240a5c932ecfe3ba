"""What the speculation controller chose in each request of a sequence like bench_auto's: code
prompt 1 twice, prose 1 three times, code 2 twice, prose 2 three times, one auto generator (its
controller learns from request to request, as in a server or a chat), n-gram pools reset before
each request. One line per request: t/s and ``auto chose ...`` (plain steps, steps per member, k)
and the acceptance of what was verified. ``--sequence`` names another order, e.g. bench_auto's
cells ``code1,prose1,edit1,code2,prose2,edit2`` (the auto arm's controller meets them in that order);
``code1@0.8`` is that request at temperature 0.8 (else ``--temp``).

Shows how many steps a request where the draft model loses drafts before turning to plain
(the per-request prior, ``--request-prior``; issue 25).

  python scripts/auto_requests.py                        # 1.5B <- 0.5B, greedy
  python scripts/auto_requests.py --temp 0.8 --request-prior 4
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_auto  # noqa: E402
from bench_spec import loadavg, machine_info  # noqa: E402


def sequence(spec: str, temp: float = 0.0) -> list[tuple[str, str, float]]:
    """'code1,prose2@0.8' -> [("code 1", text, temp), ("prose 2", text, 0.8)] (bench_auto's prompts;
    an item's ``@T`` is its temperature, else `temp`)."""
    ps = bench_auto.prompts(2)
    out = []
    for item in spec.split(","):
        m = re.fullmatch(r"(code|prose|edit)([12])(?:@(\d+(?:\.\d*)?))?", item.strip())
        if m is None:
            raise SystemExit(f"--sequence: no request {item!r} (code1..2, prose1..2, edit1..2, each with an optional @TEMP)")
        cls, i = m[1], int(m[2])
        out.append((f"{cls} {i}", [t for c, t in ps if c == cls][i - 1], float(m[3]) if m[3] else temp))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", default=bench_auto.DEFAULT_TARGET)
    ap.add_argument("--drafter", default=bench_auto.DEFAULT_DRAFTER)
    ap.add_argument("--temp", type=float, default=0.0)
    ap.add_argument("--request-prior", type=float, default=None, help="default: the controller's")
    ap.add_argument("-n", "--n-tokens", type=int, default=96)
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--set", action="append", default=[], metavar="NAME=VALUE",
                    help="a controller setting, as bench_auto's --auto-ab (e.g. borrow_bands=0); repeatable")
    ap.add_argument("--sequence", default=None,
                    help="comma-separated requests: code1, prose2, edit1, ... (default: the sequence above)")
    a = ap.parse_args(argv)
    b = bench_auto.parse_args(["--fixed", "", "--native", "off", "--target", a.target, "--drafter", a.drafter,
                               "-t", str(a.threads)])
    info = machine_info()
    print(f"# {info['cpu']}, {info['cores']} cores; {loadavg()}", file=sys.stderr)
    arms = bench_auto.Arms(b)
    gen = arms.gens["auto"]
    if a.request_prior is not None:
        gen.controller.request_prior = a.request_prior
    for item in a.set:
        name, _, value = item.partition("=")
        if bench_auto.ab_setting(gen, name.strip(), value.strip()):
            raise SystemExit(f"--set {item}: a request's setting, not the controller's")
    print(f"# request prior {gen.controller.request_prior:g}, temp {a.temp}, {a.n_tokens} tokens"
          + "".join(f", {x}" for x in a.set))
    seq = sequence(a.sequence or "code1,code1,prose1,prose1,prose1,code2,code2,prose2,prose2,prose2", a.temp)
    try:
        for name, text, temp in seq:
            for pool in arms.pools["auto"]:
                pool.reset()
            r = gen.generate(text, sampling=bench_auto.sampler(temp), n_predict=a.n_tokens, seed=1)
            st = r.stats
            print(f"{name:8} T{temp:<4g} {st.decode_tps:5.1f} t/s  auto chose {st.auto_summary()}; "
                  f"kept {st.accepted}/{st.drafted}", flush=True)
    finally:
        arms.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
