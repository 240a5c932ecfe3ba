"""Argument groups shared by the commands, with llama.cpp's flag names.

Every sampling default shown or used here is read from :class:`~llama_spec.SamplerParams`, so
the CLI and the library cannot disagree. Light imports only: parsing ``--help`` or running
``rpc-server`` loads no kernel and no drafter.
"""

from __future__ import annotations

import argparse

from ..models_registry import MODELS
from ..sampling import SamplerParams

DEFAULTS = SamplerParams()
DEFAULT_N_MAX = 3  # draft tokens per verification, as llama.cpp's --spec-draft-n-max


def add_model_args(ap: argparse.ArgumentParser) -> None:
    """-m, context, threads and device placement (llama.cpp's names)."""
    ap.add_argument("-m", "--model", default=None, help=f"GGUF path, or a named model ({', '.join(MODELS)})")
    ap.add_argument("-c", "--ctx-size", type=int, default=4096, help="context size (default 4096)")
    ap.add_argument("-b", "--batch-size", type=int, default=512)
    ap.add_argument("-t", "--threads", type=int, default=None, help="threads (default: all cores)")
    ap.add_argument("-ngl", "--n-gpu-layers", type=int, default=-1, help="layers on the GPU (-1 = all)")
    ap.add_argument("-sm", "--split-mode", default="layer", choices=["none", "layer", "row", "tensor"])
    ap.add_argument("-ts", "--tensor-split", default=None, help="comma-separated weights, e.g. 60,40")
    ap.add_argument("-mg", "--main-gpu", type=int, default=0)
    ap.add_argument("--rpc", default=None, help="comma-separated rpc-server endpoints host:port")
    add_verbose_arg(ap)


def add_verbose_arg(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("-v", "--verbose", action="count", default=0, help="-v: info log, -vv: llama.cpp debug log")


def add_sampling_args(ap: argparse.ArgumentParser) -> None:
    """The sampler chain's knobs; defaults are SamplerParams' (llama.cpp's)."""
    d = DEFAULTS
    ap.add_argument("--temp", type=float, default=d.temp)
    ap.add_argument("--top-k", type=int, default=d.top_k)
    ap.add_argument("--top-p", type=float, default=d.top_p)
    ap.add_argument("--min-p", type=float, default=d.min_p)
    ap.add_argument("--typical", type=float, default=d.typical_p)
    ap.add_argument("--top-n-sigma", type=float, default=d.top_n_sigma)
    ap.add_argument("--repeat-penalty", type=float, default=d.penalty_repeat)
    ap.add_argument("--repeat-last-n", type=int, default=d.penalty_last_n)
    ap.add_argument("--seed", type=int, default=None, help="seed (default: random)")
    ap.add_argument("--grammar", default=None, help="GBNF grammar text")
    ap.add_argument("--grammar-file", default=None)


def add_spec_args(ap: argparse.ArgumentParser) -> None:
    """Speculative decoding: drafter, draft length, rule, statistics."""
    ap.add_argument("--spec-type", default=None, choices=["none", "draft-simple", "draft-mtp"],
                    help="speculative decoding (default: draft-simple with -md, else none)")
    ap.add_argument("-md", "--model-draft", default=None, help="draft model for draft-simple")
    ap.add_argument("--spec-draft-n-max", type=int, default=DEFAULT_N_MAX, help="draft tokens per verification (1-64)")
    ap.add_argument("--spec-draft-p-min", type=float, default=0.0, help="stop drafting below this confidence")
    ap.add_argument("--spec-draft-sample", dest="spec_draft_sample", action="store_true", default=None,
                    help="rejection rule: sample drafts, verify by rejection sampling (default; env LLAMA_ARG_SPEC_DRAFT_SAMPLE)")
    ap.add_argument("--no-spec-draft-sample", dest="spec_draft_sample", action="store_false",
                    help="exact-match rule (the old behaviour)")
    ap.add_argument("--spec-draft-device", default=None, help="device name for the draft model (see `llama-spec devices`)")
    ap.add_argument("--spec-topk-stats", action="store_true", default=None, help="per-position top-k draft statistics (env LLAMA_MTP_TOPK_STATS)")
    ap.add_argument("--spec-topk-stats-every", type=int, default=None, help="report every N verifications (env LLAMA_MTP_TOPK_STATS_EVERY, default 128)")
    ap.add_argument("--spec-topk-stats-json", default=None, metavar="FILE")
    ap.add_argument("--spec-topk-stats-plot", default=None, metavar="FILE")
