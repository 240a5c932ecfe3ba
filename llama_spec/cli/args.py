"""Argument groups shared by the commands, with llama.cpp's flag names.

Every sampling default shown or used here is read from :class:`~llama_spec.SamplerParams`, so
the CLI and the library cannot disagree. Light imports only: parsing ``--help`` or running
``rpc-server`` loads no kernel and no drafter.
"""

from __future__ import annotations

import argparse

from ..drafters.ngram import LLAMA_SPEC_PRIORITY, NGRAM_CLI_FLAGS
from ..llama.sampling import SamplerParams
from ..models.registry import MODELS

DEFAULTS = SamplerParams()
DEFAULT_N_MAX = 3  # draft tokens per verification, as llama.cpp's --spec-draft-n-max
# llama.cpp's kv_cache_types (common/arg.cpp), by ggml's names; Context.KV_CACHE_TYPES maps them
# (kept apart so --help loads no compiled binding; tests/test_cli.py checks they agree).
KV_CACHE_TYPE_NAMES = ("f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "iq4_nl", "q5_0", "q5_1")
LOAD_MODE_NAMES = ("auto", "none", "mmap", "mlock", "mmap+mlock")
_TRUTHY, _FALSEY = ("on", "enabled", "true", "1"), ("off", "disabled", "false", "0")


def flash_attn_value(value: str) -> str:
    """-fa's value as llama.cpp reads it (is_truthy / is_falsey / is_autoy) -> on | off | auto."""
    v = value.strip().lower()
    if v in _TRUTHY:
        return "on"
    if v in _FALSEY:
        return "off"
    if v == "auto":
        return "auto"
    raise argparse.ArgumentTypeError(f"unknown value for --flash-attn: {value!r} (on, off or auto)")


def add_model_args(ap: argparse.ArgumentParser) -> None:
    """-m, context, threads and device placement (llama.cpp's names)."""
    ap.add_argument("-m", "--model", default=None, help=f"GGUF path, or a named model ({', '.join(MODELS)})")
    ap.add_argument("-c", "--ctx-size", type=int, default=4096, help="context size (default 4096)")
    ap.add_argument("-b", "--batch-size", type=int, default=512)
    ap.add_argument("-ub", "--ubatch-size", type=int, default=None, help="physical batch size (default: -b)")
    ap.add_argument("-t", "--threads", type=int, default=None,
                    help="threads (default: $LLAMA_SPEC_THREADS, else all cores)")
    ap.add_argument("-ngl", "--n-gpu-layers", type=int, default=-1, help="layers on the GPU (-1 = all)")
    ap.add_argument("-sm", "--split-mode", default="layer", choices=["none", "layer", "row", "tensor"])
    ap.add_argument("-ts", "--tensor-split", default=None, help="comma-separated weights, e.g. 60,40")
    ap.add_argument("-mg", "--main-gpu", type=int, default=0)
    ap.add_argument("--rpc", default=None, help="comma-separated rpc-server endpoints host:port")
    add_memory_args(ap)
    add_verbose_arg(ap)


def add_memory_args(ap: argparse.ArgumentParser) -> None:
    """Weights and KV cache as llama.cpp's flags set them: repacking, flash attention, cache types, load mode."""
    ap.add_argument("-nr", "--no-repack", dest="no_repack", action="store_true", default=False,
                    help="no CPU weight repacking (llama.cpp's -nr; bitwise batch = solo)")
    ap.add_argument("--repack", dest="no_repack", action="store_false", help="weight repacking on (default)")
    ap.add_argument("-fa", "--flash-attn", type=flash_attn_value, default="auto", metavar="on|off|auto",
                    help="flash attention (default: auto)")
    ap.add_argument("-ctk", "--cache-type-k", default="f16", choices=KV_CACHE_TYPE_NAMES, help="KV cache type of K")
    ap.add_argument("-ctv", "--cache-type-v", default="f16", choices=KV_CACHE_TYPE_NAMES, help="KV cache type of V")
    ap.add_argument("-lm", "--load-mode", default=None, choices=LOAD_MODE_NAMES,
                    help="model loading mode (default: mmap)")
    ap.add_argument("--no-mmap", dest="load_mode", action="store_const", const="none",
                    help="read the weights instead of mapping them (= -lm none)")
    ap.add_argument("--mlock", dest="load_mode", action="store_const", const="mmap+mlock",
                    help="keep the model in RAM (= -lm mmap+mlock)")


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
    ap.add_argument("-s", "--seed", type=int, default=None, help="seed (default: random)")
    ap.add_argument("-r", "--reverse-prompt", action="append", default=[], metavar="PROMPT",
                    help="stop at PROMPT (repeatable; the text ends before it)")
    ap.add_argument("--grammar", default=None, help="GBNF grammar text")
    ap.add_argument("--grammar-file", default=None)
    ap.add_argument("-j", "--json-schema", default=None, metavar="SCHEMA",
                    help="JSON schema to constrain the output (llama.cpp's json-schema-to-grammar)")
    ap.add_argument("-jf", "--json-schema-file", default=None, metavar="FILE", help="file holding a JSON schema")


def add_spec_type_args(ap: argparse.ArgumentParser) -> None:
    """--spec-type (one type or a comma chain), -md, --spec-draft-n-max and the n-gram knobs (shared with serve)."""
    ap.add_argument("--spec-type", default=None, metavar="TYPE[,TYPE..]",
                    help="speculative decoding: none, " + ", ".join(LLAMA_SPEC_PRIORITY)
                    + " or a comma chain (default: draft-simple with -md, else none)")
    ap.add_argument("-md", "--model-draft", default=None, help="draft model for draft-simple")
    ap.add_argument("--spec-draft-n-max", type=int, default=DEFAULT_N_MAX,
                    help="draft tokens per verification of draft-simple/draft-mtp (1-64)")
    ap.add_argument("--spec-chain-gate", dest="spec_chain_gate", action=argparse.BooleanOptionalAction,
                    default=True, help="in a chain, ask a model drafter (draft-simple, draft-mtp) only while it "
                    "measurably pays: timed, so seeded temp>0 runs repeat exactly only with --no-spec-chain-gate "
                    "(default: on)")
    for flag, (kind, knob, default) in NGRAM_CLI_FLAGS.items():
        ap.add_argument(flag, type=int, default=default, dest=flag.lstrip("-").replace("-", "_"),
                        help=f"{kind}: {knob} (default {default})")
    ap.add_argument("--spec-auto", dest="spec_auto", action=argparse.BooleanOptionalAction, default=None,
                    help="choose per step plain decoding, the drafter (a chain's member) and the draft length by "
                    "predicted tokens/s from measured costs and acceptance (speed only: the output distribution "
                    "is unchanged, but seeded temp>0 runs repeat exactly only with --no-spec-auto, which is the "
                    "fixed configuration; default: on, env LLAMA_SPEC_AUTO)")
    ap.add_argument("--spec-cost-model", default=None, metavar="FILE",
                    help="start --spec-auto from a cost model written by `llama-spec tune --save FILE`")
    ap.add_argument("--spec-draft-adaptive", action="store_true",
                    help="cut each proposal to the length with the most expected tokens per second, from the "
                    "measured verification cost and each drafter's kept-draft rates (speed only; not with trees)")
    ap.add_argument("--spec-draft-tree", default=None, metavar="W1,W2,..",
                    help="tree drafts (draft-simple): candidates per depth, e.g. 3,1,1 = three at depth 1, a chain "
                    "after each; verified exactly in one target batch (docs/trees.md); under --spec-auto one option "
                    "per step beside plain decoding and the chain; serve: the default shape "
                    "and the largest a request's \"tree\" may ask for")


def add_spec_args(ap: argparse.ArgumentParser) -> None:
    """Speculative decoding: drafter, draft length, rule, statistics."""
    add_spec_type_args(ap)
    ap.add_argument("--spec-draft-p-min", type=float, default=0.0, help="stop drafting below this confidence")
    ap.add_argument("--spec-draft-sample", dest="spec_draft_sample", action="store_true", default=None,
                    help="rejection rule: sample drafts, verify by rejection sampling (default; env LLAMA_ARG_SPEC_DRAFT_SAMPLE)")
    ap.add_argument("--no-spec-draft-sample", dest="spec_draft_sample", action="store_false",
                    help="exact-match rule (the old behaviour)")
    ap.add_argument("--spec-verify", choices=("token", "block", "exact-match"), default="token",
                    help="verification rule when drafts come with q: token (rejection sampling, default), "
                    "block (the drafts verified jointly) or exact-match; --no-spec-draft-sample forces exact-match")
    ap.add_argument("--spec-draft-device", default=None, help="device name for the draft model (see `llama-spec devices`)")
    ap.add_argument("--spec-topk-stats", action="store_true", default=None, help="per-position top-k draft statistics (env LLAMA_MTP_TOPK_STATS)")
    ap.add_argument("--spec-topk-stats-every", type=int, default=None, help="report every N verifications (env LLAMA_MTP_TOPK_STATS_EVERY, default 128)")
    ap.add_argument("--spec-topk-stats-json", default=None, metavar="FILE")
    ap.add_argument("--spec-topk-stats-plot", default=None, metavar="FILE")
