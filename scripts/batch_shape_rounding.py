"""How far llama.cpp's CPU logits move when the same tokens are decoded in other batch shapes.

Decodes a prompt plus 8 generated tokens (SmolLM2-135M Q4_1, repack off) once in one batch and
again split in several ways, and prints per generated row the largest |logit difference| from
the one-batch decode, flash attention off and on. Greedy tests that compare runs decoded in
different shapes (the server against a solo run) allow near-ties of this size
(tests/test_server_cache.py NEAR_TIE).

    python scripts/batch_shape_rounding.py [-t THREADS]
"""

from __future__ import annotations

import argparse
import platform
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from llama_spec import Model  # noqa: E402
from llama_spec.llama.context import Context  # noqa: E402
from llama_spec.models.registry import resolve_model  # noqa: E402

PROMPT = "You review Python code. Be brief. " * 12 + "Question 9: what is 9 + 9?"
GENERATED = [198, 198, 504, 2988, 314, 42, 216, 41]   # its greedy answer, "\n\nThe answer is: 9"


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-t", "--threads", type=int, default=2)
    args = ap.parse_args()
    model = Model(resolve_model("smollm2-135m"), repack=False)
    p = model.tokenize(PROMPT)
    toks = np.asarray(p + GENERATED, dtype=np.int32)
    n_p, n = len(p), len(toks)
    print(f"CPU: {cpu_name()}; prompt {n_p} tokens + {len(GENERATED)} generated; -t {args.threads}")

    def run(splits: list[int], fa: str) -> np.ndarray:
        with Context(model, n_ctx=1024, n_threads=args.threads, flash_attn=fa) as ctx:  # type: ignore[arg-type]
            out, i = [], 0
            for k in splits:
                out.append(np.array(ctx.decode(toks[i:i + k], np.arange(i, i + k, dtype=np.int32), 0, "all")))
                i += k
        return np.concatenate(out)[n_p:]

    for fa in ("off", "on"):
        base = run([n], fa)
        print(f"flash attention {fa}: max |logit - one-batch logit| per generated row")
        for splits in ([n_p, 8], [n_p - 10, 10, 8], [n_p, 4, 4], [n_p, 1, 1, 6], [n_p] + [1] * 8):
            d = np.abs(run(splits, fa) - base).max(axis=1)
            print(f"  {str(splits):32s} {' '.join(f'{x:.3f}' for x in d)}")
    model.close()


if __name__ == "__main__":
    main()
