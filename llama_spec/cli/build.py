"""Models, drafter and generator from parsed arguments (shared by generate and chat)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from ..drafters.base import Drafter
from ..drafters.draft_model import DraftModelDrafter
from ..drafters.mtp import MtpDrafter
from ..model import Model
from ..models_registry import resolve_model
from ..sampling import SamplerParams
from ..speculative import SpeculativeGenerator
from ..stats import TopKStats, topk_settings


def sampling_params(ns: argparse.Namespace) -> SamplerParams:
    """SamplerParams from the sampling flags (checked by SamplerParams itself)."""
    grammar = ns.grammar
    if ns.grammar_file:
        grammar = Path(ns.grammar_file).read_text()
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
                 repack=not getattr(ns, "no_repack", False))  # serve's -nr


def build_generator(ns: argparse.Namespace) -> tuple[SpeculativeGenerator, TopKStats | None]:
    """Target model, drafter and generator from parsed CLI args (shared by generate and chat)."""
    spec_type = ns.spec_type or ("draft-simple" if ns.model_draft else "none")
    if spec_type == "draft-simple" and not ns.model_draft:
        raise SystemExit("error: --spec-type draft-simple needs -md/--model-draft")
    target = load_model(ns, load_mtp=spec_type == "draft-mtp")
    drafter: Drafter | None = None
    if spec_type == "draft-simple":
        dpath = resolve_model(ns.model_draft)
        print(f"llama-spec: loading draft {dpath}", file=sys.stderr)
        devs = [ns.spec_draft_device] if ns.spec_draft_device else None
        dmodel = Model(dpath, n_gpu_layers=ns.n_gpu_layers, devices=devs)
        drafter = DraftModelDrafter(dmodel, n_ctx=ns.ctx_size, n_threads=ns.threads)
    elif spec_type == "draft-mtp":
        drafter = MtpDrafter(target, n_ctx=ns.ctx_size, n_threads=ns.threads)
    gen = SpeculativeGenerator(target, drafter, n_ctx=ns.ctx_size, n_batch=ns.batch_size,
                               n_threads=ns.threads, n_max=ns.spec_draft_n_max)
    return gen, _topk_stats(ns, gen)


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
