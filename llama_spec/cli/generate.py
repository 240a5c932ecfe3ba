"""``llama-spec generate``: text for a prompt on stdout; counters on stderr (and as JSON)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from .args import add_model_args, add_sampling_args, add_spec_args


def add_parser(sub: Any) -> None:
    g = sub.add_parser("generate", help="generate text (stdout) from a prompt")
    add_model_args(g)
    add_sampling_args(g)
    add_spec_args(g)
    g.add_argument("-p", "--prompt", default=None)
    g.add_argument("-f", "--file", default=None, help="read the prompt from a file")
    g.add_argument("-n", "--n-predict", type=int, default=128)
    g.add_argument("--ignore-eos", action="store_true", help="never sample an end-of-generation token (llama.cpp's --ignore-eos)")
    g.add_argument("--stats-json", default=None, metavar="FILE", help="write the run's counters as JSON")
    g.set_defaults(func=run, needs_prompt=True)


def run(ns: argparse.Namespace) -> int:
    """Stream the generated text to stdout, then the run's counters to stderr."""
    from .build import build_generator, finish_topk, sampling_params, save_cost_cache

    gen, topk = build_generator(ns)
    prompt = ns.prompt if ns.prompt is not None else Path(ns.file).read_text()
    out: list[Any] = []
    # -r: never write past the first stop string (a token's piece may hold it anywhere), and hold
    # back the last len(stop) - 1 characters, which may be the start of one
    stops = [s for s in ns.reverse_prompt if s]
    hold = max(map(len, stops), default=1) - 1
    text, written = "", 0
    try:
        for ev in gen.stream(prompt, sampling=sampling_params(ns), n_predict=ns.n_predict, seed=ns.seed,
                             spec_draft_sample=ns.spec_draft_sample, verify=ns.spec_verify, n_max=gen.n_max, stop=ns.reverse_prompt,
                             p_min=ns.spec_draft_p_min, ignore_eos=ns.ignore_eos, result=out):
            if ev.text:
                text += ev.text
                end = min([len(text) - hold, *(i for i in (text.find(st) for st in stops) if i >= 0)])
                if end > written:
                    sys.stdout.write(text[written:end])
                    sys.stdout.flush()
                    written = end
    except KeyboardInterrupt:  # Ctrl-C: the text so far (whole characters), then exit 130
        sys.stdout.write(text[written:] + "\n")
        sys.stdout.flush()
        raise
    res = out[0]
    save_cost_cache(ns, gen)
    sys.stdout.write(res.text[written:] + "\n")
    st = res.stats
    rule = "none" if gen.drafter is None else res.verify
    print(f"\nllama-spec: stop={res.stop_reason} prompt={st.n_prompt} tokens ({st.n_cached} cached), generated={st.emitted} tokens, "
          f"decode {st.decode_tps:.2f} t/s, prefill {st.t_prompt_s:.2f} s", file=sys.stderr)
    if gen.drafter is not None:
        print(f"llama-spec: rule={rule} {gen.drafter.name}: verifications={st.verifications} drafted={st.drafted} "
              f"accepted={st.accepted} ({100 * st.acceptance_rate:.1f} %) recovered={st.recovered} bonus={st.bonus} "
              f"mean_accepted_length={st.mean_accepted_length:.2f} (kept drafts per verification) "
              f"tokens_per_verification={st.tokens_per_verification:.2f} (incl. recovered/bonus) "
              f"extra_accepted={st.extra_accepted}", file=sys.stderr)
    if gen.controller is not None and st.auto_steps:
        print(f"llama-spec: auto chose {st.auto_summary()}", file=sys.stderr)
        print(f"llama-spec: {gen.controller.describe(choices=False)}", file=sys.stderr)
    if ns.stats_json:
        auto = {"auto": gen.controller.summary()} if gen.controller is not None else {}
        Path(ns.stats_json).write_text(json.dumps({"rule": rule, "stop_reason": res.stop_reason,
                                                   "tokens": res.tokens, **st.as_dict(), **auto}, indent=2))
    finish_topk(ns, topk)
    return 0
