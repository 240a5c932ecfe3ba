"""GGUF mutation fuzz: every mutated file loads or raises ModelLoadError; no crash, no hang.

    python scripts/fuzz_gguf.py --n 1000 [--seed 0] [--timeout 20] [--seed-file F.gguf]

The seed file is a tiny llama model written with the ``gguf`` package (300-token vocabulary,
one block), or ``--seed-file``. Mutations: truncations, byte flips in the header / metadata /
tensor-info region, huge counts, bad versions, wrong tensor types / shapes / offsets, a
vocabulary with invalid UTF-8, a chat template that is not valid Jinja. Each file is loaded in a
worker *subprocess* (Model, then a Context, one decode, tokenize/detokenize) with a timeout, so
an abort or a hang is seen and counted; the worker restarts after one.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

N_VOCAB_EXTRA = 41  # tokens beyond <unk>, <s>, </s> and the 256 byte tokens


def write_tiny_llama(path: Path, *, chat_template: str | None = "{% for m in messages %}{{ m.content }}{% endfor %}",
                     bad_utf8: bool = False, embd_rows: int | None = None, q_type: str = "F32") -> Path:
    """A tiny valid llama GGUF (random weights): 300 tokens, n_embd 32, one block."""
    from gguf import GGUFWriter

    rng = np.random.default_rng(0)
    n_embd, n_ff, n_head = 32, 64, 4
    toks: list[str | bytes] = ["<unk>", "<s>", "</s>"] + [f"<0x{i:02X}>" for i in range(256)]
    toks += [chr(ord("a") + i % 26) * (1 + i // 26) for i in range(N_VOCAB_EXTRA)]
    if bad_utf8:
        toks[-1] = b"\xff\xfe\xc3"
    n_vocab = len(toks)
    w = GGUFWriter(str(path), "llama")
    w.add_context_length(256)
    w.add_embedding_length(n_embd)
    w.add_block_count(1)
    w.add_feed_forward_length(n_ff)
    w.add_head_count(n_head)
    w.add_head_count_kv(n_head)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_dimension_count(n_embd // n_head)
    w.add_tokenizer_model("llama")
    w.add_token_list(toks)
    w.add_token_scores([float(-i) for i in range(n_vocab)])
    w.add_token_types([3, 3, 3] + [6] * 256 + [1] * N_VOCAB_EXTRA)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    if chat_template is not None:
        w.add_chat_template(chat_template)

    def t(name: str, *shape: int) -> None:
        w.add_tensor(name, (rng.standard_normal(shape) * 0.02).astype(np.float32))

    t("token_embd.weight", embd_rows or n_vocab, n_embd)
    t("output_norm.weight", n_embd)
    t("output.weight", n_vocab, n_embd)
    t("blk.0.attn_norm.weight", n_embd)
    if q_type == "F16":
        w.add_tensor("blk.0.attn_q.weight", (rng.standard_normal((n_embd, n_embd)) * 0.02).astype(np.float16))
    else:
        t("blk.0.attn_q.weight", n_embd, n_embd)
    for n in ("attn_k", "attn_v", "attn_output"):
        t(f"blk.0.{n}.weight", n_embd, n_embd)
    t("blk.0.ffn_norm.weight", n_embd)
    t("blk.0.ffn_gate.weight", n_ff, n_embd)
    t("blk.0.ffn_up.weight", n_ff, n_embd)
    t("blk.0.ffn_down.weight", n_embd, n_ff)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def _layout(data: bytes) -> tuple[int, list[tuple[int, int]]]:
    """(end of the tensor-info region, [(offset of a tensor's type field, offset of its data-offset field)])."""
    from gguf import GGUFReader

    with tempfile.NamedTemporaryFile(suffix=".gguf") as f:
        f.write(data)
        f.flush()
        r = GGUFReader(f.name)
        fields = []
        end = 0
        for t in r.tensors:
            fld = t.field
            sizes = [p.nbytes for p in fld.parts]
            type_off = fld.offset + sum(sizes[:-2])
            fields.append((type_off, type_off + sizes[-2]))
            end = max(end, fld.offset + sum(sizes))
        return end, fields


def mutations(seed: bytes, rng: random.Random, n: int, tmp: Path) -> list[tuple[str, bytes]]:
    """n mutated files (kind, bytes), round-robin over the mutation kinds."""
    info_end, tinfo = _layout(seed)
    fixed = [("bad_utf8_vocab", write_tiny_llama(tmp / "u.gguf", bad_utf8=True).read_bytes()),
             ("bad_jinja_template", write_tiny_llama(tmp / "j.gguf", chat_template="{% if %}{{ x ").read_bytes()),
             ("wrong_shape", write_tiny_llama(tmp / "s.gguf", embd_rows=299).read_bytes()),
             ("f16_tensor", write_tiny_llama(tmp / "f.gguf", q_type="F16").read_bytes())]
    out: list[tuple[str, bytes]] = list(fixed)
    kinds = ["truncate", "flip_header", "flip_meta", "flip_any", "huge_count", "version", "tensor_type",
             "tensor_offset", "tensor_dims", "zero_run"]
    i = 0
    while len(out) < n:
        kind = kinds[i % len(kinds)]
        i += 1
        b = bytearray(seed)
        if kind == "truncate":
            cut = rng.choice([rng.randrange(0, 64), rng.randrange(0, info_end), rng.randrange(info_end, len(b))])
            b = b[:cut]
        elif kind in ("flip_header", "flip_meta", "flip_any"):
            hi = {"flip_header": 24, "flip_meta": info_end, "flip_any": len(b)}[kind]
            for _ in range(rng.randint(1, 8)):
                b[rng.randrange(0, hi)] ^= 1 << rng.randrange(8)
        elif kind == "huge_count":
            off = rng.choice([8, 16])
            struct.pack_into("<Q", b, off, rng.choice([2**63 - 1, 2**64 - 1, 2**32, 10**9, 1 << 40]))
        elif kind == "version":
            struct.pack_into("<I", b, 4, rng.choice([0, 1, 4, 99, 2**31, 2**32 - 1]))
        elif kind == "tensor_type":
            off, _ = rng.choice(tinfo)
            struct.pack_into("<I", b, off, rng.choice([4, 5, 31, 36, 39, 40, 99, 2**31, 2**32 - 1]))
        elif kind == "tensor_offset":
            _, off = rng.choice(tinfo)
            struct.pack_into("<Q", b, off, rng.choice([1, 31, len(b), 2**40, 2**64 - 32]))
        elif kind == "tensor_dims":
            type_off, _ = rng.choice(tinfo)
            # dims are the u64s just before the type field: overwrite the last one
            struct.pack_into("<Q", b, type_off - 8, rng.choice([0, 1, 3, 2**31, 2**62, 2**64 - 1]))
        elif kind == "zero_run":
            s = rng.randrange(0, info_end)
            b[s : s + rng.randint(1, 64)] = bytes(min(len(b) - s, 64))[: len(b[s : s + 64])][: rng.randint(1, 64)]
        out.append((kind, bytes(b)))
    return out[:n]


WORKER = r"""
import sys, json
from llama_spec import Model
from llama_spec.llama.context import Context
from llama_spec.errors import ModelLoadError
for line in sys.stdin:
    path = line.strip()
    try:
        m = Model(path, n_gpu_layers=0)
        try:
            ids = m.tokenize("hello ab")
            m.detokenize(ids)
            c = Context(m, n_ctx=64, n_batch=16, n_threads=1)
            c.decode(ids[:4] or [0])
            c.close()
            tmpl = m.chat_template
            res = "loaded"
            if tmpl is not None:  # untrusted text: compiles or raises TemplateError
                from llama_spec.chat_api.template import compile_chat_template
                from llama_spec.errors import TemplateError
                try:
                    compile_chat_template(tmpl)
                except TemplateError:
                    res = "loaded (template refused)"
        finally:
            m.close()
    except ModelLoadError:
        res = "ModelLoadError"
    except Exception as e:  # anything else is a finding
        res = "other:" + type(e).__name__ + ": " + str(e)[:200]
    print("@@RES " + json.dumps(res), flush=True)
"""


class Worker:
    """A subprocess loading one file per request; restarted after a crash or a hang."""

    def __init__(self, timeout: float) -> None:
        self.timeout = timeout
        self.p: subprocess.Popen | None = None

    def _start(self) -> subprocess.Popen:
        env = dict(os.environ, LLAMA_SPEC_LOG="0")
        return subprocess.Popen([sys.executable, "-c", WORKER], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.DEVNULL, text=True, env=env)

    def run(self, path: Path) -> str:
        import selectors

        if self.p is None or self.p.poll() is not None:
            self.p = self._start()
        p = self.p
        assert p.stdin and p.stdout
        try:
            p.stdin.write(str(path) + "\n")
            p.stdin.flush()
        except BrokenPipeError:
            self.p = None
            return "crash"
        sel = selectors.DefaultSelector()
        sel.register(p.stdout, selectors.EVENT_READ)
        deadline = time.monotonic() + self.timeout
        while True:  # skip whatever llama.cpp itself printed to stdout
            if not sel.select(max(0.0, deadline - time.monotonic())):
                p.kill()
                p.wait()
                self.p = None
                return "hang"
            line = p.stdout.readline()
            if not line:
                rc = p.wait()
                self.p = None
                return f"crash(rc={rc})"
            if line.startswith("@@RES "):
                return json.loads(line[6:])

    def close(self) -> None:
        if self.p is not None:
            self.p.kill()
            self.p.wait()


def fuzz(n: int, seed: int = 0, timeout: float = 20.0, seed_file: Path | None = None,
         log=print) -> dict:
    """Run n cases; returns the counts and the failing cases."""
    rng = random.Random(seed)
    counts: dict[str, int] = {}
    bad: list[dict] = []
    w = Worker(timeout)
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as td:
        tmp = Path(td)
        base = seed_file.read_bytes() if seed_file else write_tiny_llama(tmp / "seed.gguf").read_bytes()
        cases = mutations(base, rng, n, tmp)
        f = tmp / "case.gguf"
        try:
            for i, (kind, data) in enumerate(cases):
                f.write_bytes(data)
                res = w.run(f)
                key = res if res in ("loaded", "loaded (template refused)", "ModelLoadError") else ("hang" if res == "hang" else
                                                                     "crash" if res.startswith("crash") else "other")
                counts[key] = counts.get(key, 0) + 1
                if key in ("crash", "hang", "other"):
                    keep = tmp.parent / f"fuzz_gguf_fail_{seed}_{i}.gguf"
                    keep.write_bytes(data)
                    bad.append({"case": i, "kind": kind, "result": res, "file": str(keep)})
                    log(f"case {i} ({kind}): {res} -> {keep}")
        finally:
            w.close()
    return {"cases": len(cases), "counts": counts, "failures": bad, "seconds": round(time.perf_counter() - t0, 1)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=1000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--timeout", type=float, default=20.0)
    ap.add_argument("--seed-file", type=Path, default=None)
    ns = ap.parse_args()
    r = fuzz(ns.n, ns.seed, ns.timeout, ns.seed_file)
    print(json.dumps({k: v for k, v in r.items() if k != "failures"}, indent=1))
    print(f"cases {r['cases']}: crashes {r['counts'].get('crash', 0)}, hangs {r['counts'].get('hang', 0)}, "
          f"other exceptions {r['counts'].get('other', 0)}")
    return 0 if not r["failures"] else 1


if __name__ == "__main__":
    sys.exit(main())
