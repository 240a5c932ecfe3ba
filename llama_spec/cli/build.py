"""Models, drafter and generator from parsed arguments (shared by generate and chat)."""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

from ..drafters.base import Drafter
from ..drafters.chain import ChainDrafter
from ..drafters.draft_batch import DraftSimpleFactory
from ..drafters.draft_model import DraftModelDrafter
from ..drafters.mtp import MtpDrafter
from ..drafters.ngram import NGRAM_CLI_FLAGS, NGRAM_SPEC_TYPES, build_ngram_drafter, parse_spec_types
from ..env import default_threads, env_flag
from ..generation.controller import ENV_AUTO
from ..generation.cost_cache import cache_path, file_id, load_cached, save_cached
from ..generation.solo import N_MAX_LIMIT, SpeculativeGenerator
from ..llama.devices import n_offload_devices
from ..llama.grammar import json_schema_to_grammar
from ..llama.model import Model
from ..llama.sampling import SamplerParams
from ..models.registry import resolve_model
from ..observe.stats import TopKStats, topk_settings

PLOT_INSTALL_HINT = "pip install 'llama-spec[plot]'"


def sampling_params(ns: argparse.Namespace) -> SamplerParams:
    """SamplerParams from the sampling flags (checked by SamplerParams itself)."""
    grammar = ns.grammar
    if ns.grammar_file:
        grammar = Path(ns.grammar_file).read_text()
    schema = Path(ns.json_schema_file).read_text() if ns.json_schema_file else ns.json_schema
    if schema is not None:
        if grammar is not None:
            raise ValueError("--json-schema(-file) and --grammar(-file) both given: use one")
        grammar = json_schema_to_grammar(schema)  # llama.cpp's converter; ValueError on a bad schema
    return SamplerParams(temp=ns.temp, top_k=ns.top_k, top_p=ns.top_p, min_p=ns.min_p, typical_p=ns.typical,
                         top_n_sigma=ns.top_n_sigma, penalty_repeat=ns.repeat_penalty,
                         penalty_last_n=ns.repeat_last_n, grammar=grammar)


def load_model(ns: argparse.Namespace, *, load_mtp: bool = False) -> Model:
    """The target model named by -m (a path or a named model), placed as the flags say."""
    ts = [float(x) for x in ns.tensor_split.split(",")] if ns.tensor_split else None
    rpc = [x.strip() for x in ns.rpc.split(",")] if ns.rpc else None
    if not ns.model:
        raise ValueError("-m/--model is required (chat also accepts -hf REPO[:QUANT])")
    path = resolve_model(ns.model)
    print(f"llama-spec: loading {path}", file=sys.stderr)
    return Model(path, n_gpu_layers=ns.n_gpu_layers, split_mode=ns.split_mode, tensor_split=ts,
                 main_gpu=ns.main_gpu, rpc_servers=rpc, load_mtp=load_mtp,
                 repack=not getattr(ns, "no_repack", False), load_mode=getattr(ns, "load_mode", None))


ENV_LOAD_BESIDE = "LLAMA_SPEC_LOAD_DRAFT_BESIDE"


def load_models(ns: argparse.Namespace, types: list[str]) -> tuple[Model, Model | None]:
    """The target model (-m) and, where the chain has draft-simple, the draft model (-md).

    Where both stay in host memory (no GPU or RPC device to offload to), the draft model loads in
    a thread beside the target: a load is mostly one core reading and repacking weights (llama.cpp's
    calls release the GIL), so a run waits for the longer load, not for both (the 0.5B beside the
    1.5B on the 2-core EPYC: 0.04-0.68 s less per CLI run, scripts/cold_start.py; the two loads
    contend). ``LLAMA_SPEC_LOAD_DRAFT_BESIDE=0``: one after the other."""
    load_mtp = "draft-mtp" in types
    if "draft-simple" not in types:
        return load_model(ns, load_mtp=load_mtp), None
    dpath = resolve_model(ns.model_draft)   # (a bad name or a failed download: before anything loads)
    if ns.rpc or n_offload_devices() > 0 or not env_flag(ENV_LOAD_BESIDE, True):
        target = load_model(ns, load_mtp=load_mtp)   # (devices: the loads stay one after the other)
        return target, load_draft_model(ns, dpath)
    with ThreadPoolExecutor(1, thread_name_prefix="llama-spec-draft-load") as pool:
        pending = pool.submit(load_draft_model, ns, dpath)
        try:
            target = load_model(ns, load_mtp=load_mtp)
        except BaseException:
            pending.add_done_callback(_close_loaded)   # (the draft model of a run that cannot start)
            raise
        try:
            return target, pending.result()   # (re-raises the draft model's load error here)
        except BaseException:
            target.close()
            raise


def load_draft_model(ns: argparse.Namespace, dpath: Path) -> Model:
    """The draft model (-md, already resolved to `dpath`) on --spec-draft-device if given."""
    print(f"llama-spec: loading draft {dpath}", file=sys.stderr)
    dev = getattr(ns, "spec_draft_device", None)
    return Model(dpath, n_gpu_layers=ns.n_gpu_layers, devices=[dev] if dev else None,
                 repack=not ns.no_repack, load_mode=ns.load_mode)


def _close_loaded(done: Future[Model]) -> None:
    if done.exception() is None:
        done.result().close()


def spec_types(ns: argparse.Namespace) -> list[str]:
    """The --spec-type chain in llama.cpp's order ([] = none); draft-simple needs -md."""
    types = parse_spec_types(ns.spec_type) if ns.spec_type else (["draft-simple"] if ns.model_draft else [])
    if "draft-simple" in types and not ns.model_draft:
        raise ValueError("--spec-type draft-simple needs -md/--model-draft")
    return types


def context_options(ns: argparse.Namespace) -> dict[str, Any]:
    """The target context's -ub, -fa, -ctk, -ctv (Context keywords)."""
    return {"n_ubatch": ns.ubatch_size, "flash_attn": ns.flash_attn, "type_k": ns.cache_type_k,
            "type_v": ns.cache_type_v}


def spec_n_max(ns: argparse.Namespace, types: list[str]) -> int:
    """The generator's n_max as llama.cpp's common_speculative_n_max: the largest member's size
    (n-gram: size_m / n_max; model drafters: --spec-draft-n-max), capped at N_MAX_LIMIT."""
    sizes = [ns.spec_draft_n_max]
    if types and all(t in NGRAM_SPEC_TYPES for t in types):
        sizes = []  # n-gram members only: their own sizes decide
    for flag, (kind, knob, _) in NGRAM_CLI_FLAGS.items():
        if kind in types and knob in ("size_m", "n_max"):
            sizes.append(getattr(ns, flag.lstrip("-").replace("-", "_")))
    return max(1, min(N_MAX_LIMIT, max(sizes)))


def drafter_factory(ns: argparse.Namespace, target: Model, types: list[str], dmodel: Model | None = None
                    ) -> tuple[Callable[[], Drafter] | None, list[Callable[[], None]]]:
    """A function making one drafter (a ChainDrafter for several types) and the closers of the
    draft model (`dmodel` from load_models, else loaded here); (None, []) for no speculation."""
    if not types:
        return None, []
    closers: list[Callable[[], None]] = []
    if "draft-simple" in types:
        dmodel = dmodel or load_draft_model(ns, resolve_model(ns.model_draft))
        closers.append(dmodel.close)
    knobs: dict[str, dict[str, int]] = {}
    for flag, (kind, knob, _) in NGRAM_CLI_FLAGS.items():
        knobs.setdefault(kind, {})[knob] = getattr(ns, flag.lstrip("-").replace("-", "_"))

    def one(t: str) -> Drafter:
        if t == "draft-simple":
            assert dmodel is not None
            return DraftModelDrafter(dmodel, n_ctx=ns.ctx_size, n_threads=ns.threads, n_max=ns.spec_draft_n_max)
        if t == "draft-mtp":
            return MtpDrafter(target, n_ctx=ns.ctx_size, n_threads=ns.threads)
        return build_ngram_drafter(t, **knobs.get(t, {}))

    for t in types:  # refuse unknown / unimplemented types before anything is generated
        if t not in ("draft-simple", "draft-mtp", *NGRAM_SPEC_TYPES):
            raise ValueError(f"--spec-type {t!r} is not implemented here")

    if types == ["draft-simple"]:  # a BatchGenerator (serve) gives its slots one shared draft context
        assert dmodel is not None
        return DraftSimpleFactory(dmodel, n_ctx=ns.ctx_size, n_threads=ns.threads, n_max=ns.spec_draft_n_max), closers

    def make() -> Drafter:
        members = [one(t) for t in types]
        if len(members) == 1:
            return members[0]
        return ChainDrafter(members, gate=getattr(ns, "spec_chain_gate", True))

    return make, closers


def check_plot_available(ns: argparse.Namespace) -> None:
    """--spec-topk-stats-plot needs matplotlib: say what to install (one line, exit 2) before
    generating anything. Imported, not looked up: a broken or blocked install fails here too."""
    if not getattr(ns, "spec_topk_stats_plot", None):
        return
    try:
        importlib.import_module("matplotlib")
    except ImportError:
        raise ValueError("--spec-topk-stats-plot needs the plot extra (matplotlib is not installed): "
                         f"{PLOT_INSTALL_HINT}") from None


def build_generator(ns: argparse.Namespace) -> tuple[SpeculativeGenerator, TopKStats | None]:
    """Target model, drafter and generator from parsed CLI args (shared by generate and chat)."""
    check_plot_available(ns)
    types = spec_types(ns)
    target, dmodel = load_models(ns, types)
    make, _closers = drafter_factory(ns, target, types, dmodel)  # the draft model lives as long as the process
    drafter = make() if make is not None else None
    gen = SpeculativeGenerator(target, drafter, n_ctx=ns.ctx_size, n_batch=ns.batch_size,
                               n_threads=ns.threads, n_max=spec_n_max(ns, types),
                               context_options=context_options(ns), tree=getattr(ns, "spec_draft_tree", None),
                               adaptive_draft=getattr(ns, "spec_draft_adaptive", False),
                               **auto_args(ns))
    return gen, _topk_stats(ns, gen)


def auto_args(ns: argparse.Namespace, cache: bool = True) -> dict[str, Any]:
    """auto and cost_model of a generator from --spec-auto / --spec-cost-model, else (with `cache`)
    the cost model an earlier run with the same setup left in the cache (generation/cost_cache.py)."""
    auto, path = getattr(ns, "spec_auto", None), getattr(ns, "spec_cost_model", None)
    if path is not None and auto is False:
        raise ValueError("--spec-cost-model is the --spec-auto controller's: not with --no-spec-auto")
    if path is not None or not cache or not (env_flag(ENV_AUTO, True) if auto is None else auto):
        return {"auto": auto, "cost_model": path}
    file = cost_cache_file(ns)
    data, why = load_cached(file)
    if why is not None:
        print(f"llama-spec: warning: cost-model cache {why}", file=sys.stderr)
    elif data is not None:
        print(f"llama-spec: auto starts from the costs earlier runs measured ({file}; "
              "LLAMA_SPEC_COST_CACHE=0: start cold)", file=sys.stderr)
    return {"auto": auto, "cost_model": data}


def cost_cache_file(ns: argparse.Namespace) -> Path | None:
    """The cost-model cache file of this setup: the models, drafters and every flag that changes a
    decode's or a draft's cost (None: no speculation, or the cache is off)."""
    types = spec_types(ns)
    if not types:
        return None
    draft = file_id(resolve_model(ns.model_draft)) if "draft-simple" in types else None
    knobs = {flag: getattr(ns, flag.lstrip("-").replace("-", "_"), None) for flag in NGRAM_CLI_FLAGS}
    flags = [getattr(ns, k, None) for k in (
        "threads", "n_gpu_layers", "split_mode", "tensor_split", "main_gpu", "rpc", "no_repack", "flash_attn",
        "cache_type_k", "cache_type_v", "batch_size", "ubatch_size", "spec_draft_device", "spec_draft_tree")]
    flags += [os.environ.get(v) for v in ("CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES")]   # (which GPUs)
    flags[0] = flags[0] or default_threads()
    return cache_path([file_id(resolve_model(ns.model)), draft, types,
                       spec_n_max(ns, types), knobs, flags])


def save_cost_cache(ns: argparse.Namespace, gen: SpeculativeGenerator) -> None:
    """After a run: the controller's costs and survival into the cache, for the next run."""
    if gen.controller is None or not gen.controller.choices:
        return   # (no controller, or it decided nothing: nothing measured)
    try:
        why = save_cached(gen.controller, cost_cache_file(ns))
    except (OSError, ValueError) as e:   # (a model file gone since it was loaded: no key to save under)
        why = f"not written ({e.__class__.__name__}: {e})"
    if why is not None:
        print(f"llama-spec: warning: cost-model cache {why}", file=sys.stderr)


def _topk_stats(ns: argparse.Namespace, gen: SpeculativeGenerator) -> TopKStats | None:
    enabled, every = topk_settings(ns.spec_topk_stats, ns.spec_topk_stats_every)
    if not enabled or gen.drafter is None:
        return None
    st = TopKStats(every=every, log=lambda s: print(s, file=sys.stderr))
    st.attach(gen)
    return st


def finish_topk(ns: argparse.Namespace, topk: TopKStats | None) -> None:
    """Print the top-k table and write the JSON / plot files the flags ask for."""
    if topk is None:
        return
    print(topk.table(), file=sys.stderr)
    if ns.spec_topk_stats_json:
        Path(ns.spec_topk_stats_json).write_text(json.dumps(topk.as_dict(), indent=2))
    if ns.spec_topk_stats_plot:
        topk.plot(ns.spec_topk_stats_plot)
