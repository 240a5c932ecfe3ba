"""``llama-spec tune``: measure what speculation costs on this machine, and what the controller picks.

    llama-spec tune -m TARGET [-md DRAFT] [--spec-type TYPE[,TYPE..]] [-t N] [-n 48]
        [--temps 0,0.8] [--plot FILE.png] [--save FILE.json]

A few built-in sample prompts (code, prose, a chat-formatted edit) are generated with every option
in turn, one option per verification step: plain decoding, and each drafter (a chain's members
apart) at each draft length. That fills the speculation controller's cost model (the verification
cost c(n), the drafters' cost per drafted token, the post-decode cost) and its per-position
acceptance per drafter and temperature band (generation/controller.py). Printed: per band, every
option's expected tokens per verification, seconds per step and predicted tokens/s, and the
option the controller would pick. ``--save`` writes the model for ``--spec-cost-model FILE``
(generate, serve) to start from; ``--plot`` draws tokens/s per option (the ``[plot]`` extra).
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path
from typing import Any

from .args import add_model_args, add_spec_type_args

__all__ = ["SAMPLE_PROMPTS", "add_parser", "run"]

SAMPLE_PROMPTS = (
    "def fibonacci(n: int) -> list[int]:\n    \"\"\"The first n Fibonacci numbers.\"\"\"\n",
    "The history of the printing press begins in the fifteenth century, when",
    "<|im_start|>user\nAdd type hints to this function and return the whole file:\n```python\n"
    "def scale(values, factor):\n    out = []\n    for v in values:\n        out.append(v * factor)\n"
    "    return out\n\n\ndef total(values):\n    s = 0\n    for v in values:\n        s += v\n    return s\n```"
    "<|im_end|>\n<|im_start|>assistant\n",
)
_LENGTHS = (1, 2, 3, 4, 6, 8, 16, 32, 64)


def add_parser(sub: Any) -> None:
    t = sub.add_parser("tune", help="measure speculation costs and acceptance here; what --spec-auto would pick")
    add_model_args(t)
    add_spec_type_args(t)
    t.add_argument("-n", "--n-predict", type=int, default=48, help="tokens per sample prompt and temperature")
    t.add_argument("--temps", default="0,0.8", help="temperatures to measure at (comma list; default 0,0.8)")
    t.add_argument("--plot", default=None, metavar="FILE.png", help="tokens/s per option (needs the [plot] extra)")
    t.add_argument("--save", default=None, metavar="FILE.json", help="the cost model, for --spec-cost-model FILE")
    t.set_defaults(func=run)


def _temps(value: str) -> list[float]:
    try:
        temps = [float(x) for x in value.split(",") if x.strip()]
    except ValueError:
        raise ValueError(f"--temps: expected a comma list of numbers, got {value!r}") from None
    if not temps or any(t < 0 for t in temps):
        raise ValueError(f"--temps: expected temperatures >= 0, got {value!r}")
    return temps


def run(ns: argparse.Namespace) -> int:
    """Sweep the options over the sample prompts; print the table; save / plot as asked."""
    from ..generation.arms import tree_arm, tree_name
    from ..generation.bands import band_of
    from ..generation.solo import SpeculativeGenerator
    from ..llama.sampling import SamplerParams
    from .build import (
        PLOT_INSTALL_HINT,
        context_options,
        drafter_factory,
        load_models,
        spec_n_max,
        spec_types,
    )

    if ns.plot and not _has_matplotlib():
        raise ValueError(f"--plot needs the plot extra (matplotlib is not installed): {PLOT_INSTALL_HINT}")
    if ns.n_predict < 4:
        raise ValueError(f"-n/--n-predict must be >= 4, got {ns.n_predict}")
    temps = _temps(ns.temps)
    types = spec_types(ns)
    if not types:
        raise ValueError("tune needs a drafter: -md DRAFT and/or --spec-type TYPE[,TYPE..]")
    target, dmodel = load_models(ns, types)
    make, _closers = drafter_factory(ns, target, types, dmodel)
    assert make is not None
    drafter = make()
    n_max = spec_n_max(ns, types)
    ks = [k for k in _LENGTHS if k <= n_max] or [n_max]
    members = drafter.member_names()
    sweep: list[tuple[int | None, int]] = [(None, 0)] + [(m, k) for m in range(len(members)) for k in ks]
    gen = SpeculativeGenerator(target, drafter, n_ctx=ns.ctx_size, n_batch=ns.batch_size, n_threads=ns.threads,
                               n_max=n_max, context_options=context_options(ns), auto=True,
                               cost_model=ns.spec_cost_model, tree=ns.spec_draft_tree)
    ctl = gen.controller
    assert ctl is not None
    tree, tree_member = gen.tree, ctl.slots[0].tree_member
    if tree and tree_member is not None:   # --spec-draft-tree: its trees at every depth too
        sweep += [(tree_arm(tree_member), d) for d in range(1, len(tree) + 1)]
        members = [*members, tree_name(members[tree_member], tree)]
    ctl.sweep = sweep
    bands = [band_of(t <= 0, t, "token") for t in temps]
    try:
        _measure(gen, temps, ns.n_predict, SamplerParams)
    finally:
        gen.close()
    tables = {band: [r for r in ctl.table(0, max(ks), band, tree=tree) if r["k"] in (0, *ks) or "tree" in r["option"]]
              for band in bands}
    ctl.sweep = []
    _print(tables, members)
    if ns.save:
        ctl.save(ns.save)
        print(f"llama-spec tune: cost model written to {ns.save} (use --spec-cost-model {ns.save})", file=sys.stderr)
    if ns.plot:
        _plot(tables, members, ns.plot)
        print(f"llama-spec tune: plot written to {ns.plot}", file=sys.stderr)
    return 0


def _measure(gen: Any, temps: list[float], n_predict: int, params: Any) -> None:
    """Every sample prompt at every temperature (a tqdm bar on stderr)."""
    from tqdm import tqdm

    jobs = [(t, p) for t in temps for p in SAMPLE_PROMPTS]
    for i, (t, prompt) in enumerate(tqdm(jobs, desc="tune", unit="prompt", file=sys.stderr)):
        sampling = params(temp=t)
        gen.generate(prompt, sampling=sampling, n_predict=n_predict, seed=1234 + i, ignore_eos=True)


def _print(tables: dict[str, list[dict[str, Any]]], members: list[str]) -> None:
    for band, rows in tables.items():
        width = max(16, *(len(r["option"]) for r in rows))
        print(f"\n{band}:  {'option':<{width - 2}} k   tokens/verification   ms/step   tokens/s (predicted)")
        for r in rows:
            print(f"  {r['option']:<{width}} {r['k']:>3}   {r['tokens']:>8.2f}   {1e3 * r['seconds']:>12.2f}   "
                  f"{r['tok_per_s']:>10.1f}")
        ok = [r for r in rows if not math.isnan(r["tok_per_s"])]
        if ok:
            best = max(ok, key=lambda r: r["tok_per_s"])
            plain = rows[0]["tok_per_s"]
            k = f"depth {best['k']}" if "tree" in best["option"] else f"k = {best['k']}"
            what = "plain decoding" if best["k"] == 0 else f"{best['option']} with {k}"
            print(f"  the controller would pick: {what} ({best['tok_per_s']:.1f} t/s, "
                  f"{best['tok_per_s'] / plain:.2f}x plain)")


def _has_matplotlib() -> bool:
    import importlib

    try:
        importlib.import_module("matplotlib")
    except ImportError:
        return False
    return True


def _plot(tables: dict[str, list[dict[str, Any]]], members: list[str], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(tables), figsize=(5 * len(tables), 3.6), squeeze=False)
    for ax, (band, rows) in zip(axes[0], tables.items(), strict=True):
        ax.axhline(rows[0]["tok_per_s"], color="k", linestyle="--", label="plain")
        for name in members:
            pts = [(r["k"], r["tok_per_s"]) for r in rows if r["option"] == name]
            ax.plot([k for k, _ in pts], [v for _, v in pts], marker="o", label=name)
        ax.set_title(band)
        ax.set_xlabel("draft length k (a tree: its depth)")
        ax.set_ylabel("tokens/s (predicted from measured costs)")
        ax.legend()
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
