"""A drafter resumed after the issue's 500 plain steps accepts as before it sat out (issue 25, 5).

The full N of tests/test_controller_loop.py's resume test (120 plain steps there): for each
drafter kind, kept drafts per verification before the rest, after it, and of a drafter that never
sat out on the same text (greedy, SmolLM2-135M drafting for itself or n-gram drafters;
llama_spec/testing/resume.py). Exit 1 when a resumed drafter keeps < 0.8x the steady one's.

    python scripts/resume_check.py [--plain 500] [--kinds draft-simple,ngram-map-k,ngram-mod]
"""

from __future__ import annotations

import argparse
import sys

from llama_spec import Model
from llama_spec.testing.models import model_path
from llama_spec.testing.resume import KINDS, resume_check


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--plain", type=int, default=500, help="plain steps the drafter sits out")
    ap.add_argument("--draft", type=int, default=16, help="draft steps before the rest (twice that after)")
    ap.add_argument("--kinds", default=",".join(KINDS))
    a = ap.parse_args(argv)
    model = Model(model_path("smollm2-135m"), repack=False)
    bad = 0
    print(f"{'drafter':<14} {'before':>7} {'resumed':>8} {'steady':>7} {'n resumed':>9}  same tokens")
    for kind in a.kinds.split(","):
        r = resume_check(model, kind, a.plain, a.draft)
        ok = r.same_tokens and len(r.resumed) >= a.draft // 2 and r.kept(r.resumed) >= 0.8 * r.kept(r.steady)
        bad += not ok
        print(f"{kind:<14} {r.kept(r.before):>7.2f} {r.kept(r.resumed):>8.2f} {r.kept(r.steady):>7.2f} "
              f"{len(r.resumed):>9}  {r.same_tokens}{'' if ok else '   FAIL'}")
    model.close()
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
