"""``llama_spec.Llama``: llama-cpp-python 0.3.x's high-level ``Llama``, over llama-spec's engine.

Code written for llama-cpp-python runs after changing one import::

    from llama_spec import Llama          # was: from llama_cpp import Llama

    llm = Llama(model_path="model.gguf", n_ctx=2048, draft_model="draft.gguf")
    out = llm("Q: Name the planets in the solar system? A: ", max_tokens=32, stop=["Q:", "\\n"])
    out["choices"][0]["text"], out["usage"], out["speculative"]["mean_accepted_length"]

What is the same: the constructor's keywords (each one either works as theirs or raises
``TypeError`` naming it, see :mod:`llama_spec.compat.params`), ``__call__`` /
``create_completion`` / ``create_chat_completion`` with their arguments, defaults and result
dicts (``stream=True``: iterators of chunk dicts), ``tokenize`` (bytes in) / ``detokenize``
(bytes out), ``n_ctx()``, ``from_pretrained``, ``close()``. Every result (and the last chunk of
a stream) also carries ``"speculative"``: the rule, the drafter and the run's counters.

What is gained: ``draft_model=`` takes a draft GGUF (draft-simple verified by rejection
sampling, so temperature > 0 keeps the target's distribution exactly), an n-gram type, the MTP
head, or a llama-cpp-python ``LlamaDraftModel`` callable (exact-match rule); see
:mod:`llama_spec.compat.drafting`. Extra keywords: ``repack`` (llama.cpp's CPU weight
repacking, default on as there), ``spec_draft_n_max`` (draft tokens per verification),
``spec_verify`` (``"token"``, ``"block"`` or ``"exact-match"``).

Out of scope: ``logits_all``, ``logprobs``, embeddings (``embedding``, ``create_embedding``,
``embed``), LoRA, Python chat handlers / logits processors / stopping criteria, infill
(``suffix``), mirostat, state save/load, and the low-level ``llama_cpp.*`` C API.
"""

from __future__ import annotations

import os
import sys
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from types import TracebackType
from typing import Any

from ..generation.solo import SpeculativeGenerator
from ..llama.model import Model
from ..models.registry import resolve_model
from .chat import ChatPlan, chat_chunks, chat_result, check_chat_format, plan_chat
from .completion import (
    CompletionJob,
    check_call_defaults,
    derive_seed,
    grammar_text,
    prompt_tokens,
    sampling_params,
)
from .drafting import DraftSpec, build_draft, wants_mtp
from .params import (
    check_default_only,
    flash_attn_mode,
    kv_cache_type,
    load_mode,
    rpc_list,
    split_mode_name,
)

__all__ = ["LLAMA_DEFAULT_SEED", "Llama"]

LLAMA_DEFAULT_SEED = 0xFFFFFFFF
Result = dict[str, Any] | Iterator[dict[str, Any]]


class Llama:
    """A model, its context and (optionally) a drafter, with llama-cpp-python's high-level API.

    ``model_path``: a GGUF path (a test-model name or a loaded :class:`~llama_spec.Model` also
    work; a Model passed in is not closed by :meth:`close`). Defaults are llama-cpp-python's:
    ``n_ctx=512`` (0 = the model's training context), ``n_gpu_layers=0``, ``flash_attn=False``,
    ``verbose=True``. ``n_threads=None`` uses ``$LLAMA_SPEC_THREADS`` or every core (theirs:
    half the cores). Unknown keywords and unsupported values raise ``TypeError`` naming them.
    """

    def __init__(
        self,
        model_path: str | os.PathLike[str] | Model,
        *,
        n_gpu_layers: int = 0,
        split_mode: int | str = 1,
        main_gpu: int = 0,
        tensor_split: Sequence[float] | None = None,
        rpc_servers: str | Sequence[str] | None = None,
        use_mmap: bool = True,
        use_mlock: bool = False,
        seed: int = LLAMA_DEFAULT_SEED,
        n_ctx: int = 512,
        n_batch: int = 512,
        n_ubatch: int = 512,
        n_threads: int | None = None,
        n_threads_batch: int | None = None,
        flash_attn: bool | str = False,
        no_perf: bool = False,
        last_n_tokens_size: int = 64,
        chat_format: str | None = None,
        draft_model: DraftSpec = None,
        type_k: int | str | None = None,
        type_v: int | str | None = None,
        verbose: bool = True,
        repack: bool = True,
        spec_draft_n_max: int | None = None,
        spec_verify: str = "token",
        **kwargs: Any,
    ) -> None:
        check_default_only(kwargs)  # before anything is loaded: a refused keyword costs nothing
        self._closers: list[Any] = []
        self.verbose = bool(verbose)
        self.no_perf = bool(no_perf)  # llama.cpp's perf counters stay off; our timings are in `speculative`
        self.last_n_tokens_size = int(last_n_tokens_size)
        self._seed = int(seed)
        self._spec_verify = spec_verify
        ctx_opts = {"n_threads_batch": n_threads_batch, "flash_attn": flash_attn_mode(flash_attn),
                    "type_k": kv_cache_type("type_k", type_k), "type_v": kv_cache_type("type_v", type_v)}
        placement: dict[str, Any] = dict(n_gpu_layers=n_gpu_layers, repack=repack, load_mode=load_mode(use_mmap, use_mlock))
        try:
            self._model = self._load(model_path, placement, split_mode, main_gpu, tensor_split, rpc_servers,
                                     wants_mtp(draft_model))
            self.model_path = str(model_path.path if isinstance(model_path, Model) else model_path)
            self.chat_format = check_chat_format(self._model, chat_format)
            n_ctx = int(n_ctx) or self._model.n_ctx_train
            self.n_batch = min(n_ctx, int(n_batch))
            ctx_opts["n_ubatch"] = min(self.n_batch, int(n_ubatch))
            plan = build_draft(draft_model, self._model, n_ctx=n_ctx, n_threads=n_threads, n_max=spec_draft_n_max,
                               model_kwargs=placement)
            self._closers[:0] = plan.closers  # drafters and draft models go before the target
            self._drafter_name = plan.mode if plan.drafter is not None else None
            self._gen = SpeculativeGenerator(self._model, plan.drafter, n_ctx=n_ctx, n_batch=self.n_batch,
                                             n_threads=n_threads, n_max=plan.n_max, context_options=ctx_opts)
            self._closers.insert(0, self._gen.close)  # its context and drafter (closing twice is a no-op)
        except BaseException:
            self.close()
            raise
        self.metadata: dict[str, str] = self._model.metadata()
        if self.verbose:
            print(f"llama-spec: {self.model_path}: n_ctx {self._gen.ctx.n_ctx}, drafter "
                  f"{self._drafter_name or 'none'}", file=sys.stderr)

    def _load(self, model_path: str | os.PathLike[str] | Model, placement: dict[str, Any], split_mode: int | str,
              main_gpu: int, tensor_split: Sequence[float] | None, rpc_servers: str | Sequence[str] | None,
              mtp: bool) -> Model:
        """The target: the caller's Model, or one loaded here (and closed by close())."""
        if isinstance(model_path, Model):
            if mtp and not model_path.load_mtp:
                raise ValueError("draft_model='draft-mtp' needs the Model loaded with load_mtp=True")
            return model_path
        if not isinstance(model_path, (str, os.PathLike)):
            raise TypeError(f"model_path must be a str or os.PathLike, got {type(model_path).__name__}")
        try:
            path = resolve_model(model_path)
        except ValueError:
            raise ValueError(f"Model path does not exist: {model_path}") from None
        m = Model(path, split_mode=split_mode_name(split_mode), main_gpu=main_gpu,
                  tensor_split=list(tensor_split) if tensor_split is not None else None,
                  rpc_servers=rpc_list(rpc_servers), load_mtp=mtp, **placement)
        self._closers.append(m.close)
        return m

    @classmethod
    def from_pretrained(cls, repo_id: str, filename: str | None = None, additional_files: list[str] | None = None,
                        local_dir: str | os.PathLike[str] | None = None, local_dir_use_symlinks: bool | str = "auto",
                        cache_dir: str | os.PathLike[str] | None = None, *, revision: str | None = None,
                        **kwargs: Any) -> Llama:
        """Download (or find in the Hugging Face cache) a GGUF and load it; other keywords go to
        :class:`Llama`. ``filename`` is a glob (``"*Q4_K_M.gguf"``), a quant tag or a file name
        (:mod:`llama_spec.models.hub`; split models are fetched whole). ``HF_HUB_OFFLINE=1`` is honoured.
        ``additional_files`` and ``local_dir`` are not supported (TypeError)."""
        from ..models.hub import download_gguf

        for name, value, default in (("additional_files", additional_files, None), ("local_dir", local_dir, None),
                                     ("local_dir_use_symlinks", local_dir_use_symlinks, "auto")):
            if value != default:
                raise TypeError(f"Llama.from_pretrained(): {name}={value!r} is not supported by llama-spec "
                                "(files go to the Hugging Face cache; use cache_dir)")
        return cls(download_gguf(repo_id, filename, revision=revision, cache_dir=cache_dir), **kwargs)

    # -- lifetime --------------------------------------------------------------------------------
    def close(self) -> None:
        """Free the context, the drafter and the models loaded here (idempotent)."""
        fns, self._closers = getattr(self, "_closers", []), []
        for fn in fns:
            fn()

    def __enter__(self) -> Llama:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: BLE001 - at interpreter shutdown the binding may already be gone
            pass

    # -- the model -------------------------------------------------------------------------------
    @property
    def generator(self) -> SpeculativeGenerator:
        """The llama-spec generator underneath (observers, totals, the drafter)."""
        return self._gen

    @property
    def model(self) -> Model:
        """The llama-spec :class:`~llama_spec.Model` (llama-cpp-python: a C pointer)."""
        return self._model

    def n_ctx(self) -> int:
        """The context window size (tokens)."""
        return int(self._gen.ctx.n_ctx)

    def n_vocab(self) -> int:
        return int(self._model.n_vocab)

    def n_embd(self) -> int:
        return int(self._model.n_embd)

    def token_bos(self) -> int:
        return -1 if self._model.token_bos is None else int(self._model.token_bos)

    def token_eos(self) -> int:
        return -1 if self._model.token_eos is None else int(self._model.token_eos)

    def token_nl(self) -> int:
        return -1 if self._model.token_nl is None else int(self._model.token_nl)

    def set_seed(self, seed: int) -> None:
        """The seed the next call without ``seed=`` derives its own from (as llama-cpp-python)."""
        self._seed = int(seed)

    def tokenize(self, text: bytes | str, add_bos: bool = True, special: bool = False) -> list[int]:
        """UTF-8 bytes (a str is encoded) -> token ids; ``add_bos`` adds BOS where the vocabulary
        wants it, ``special`` parses special-token text (e.g. ``<|im_start|>``)."""
        return self._model.tokenize(text, add_special=add_bos, parse_special=special)

    def detokenize(self, tokens: Sequence[int], prev_tokens: Sequence[int] | None = None,
                   special: bool = False) -> bytes:
        """Token ids -> bytes: the pieces joined (a leading space after BOS dropped, as theirs);
        ``prev_tokens`` is accepted and, as in llama-cpp-python 0.3.x, not used."""
        del prev_tokens
        toks = [int(t) for t in tokens]
        out = b"".join(self._model.token_to_piece(t, special=special) for t in toks)
        if toks and toks[0] == self.token_bos() and out[:1] == b" ":
            out = out[1:]
        return out

    # -- completions -----------------------------------------------------------------------------
    def _job(self, tokens: list[int], prompt_text: str, *, max_tokens: int | None, stop: str | Sequence[str] | None,
             seed: int | None, echo: bool, model: str | None, sampling: Any, cid: str) -> CompletionJob:
        if seed is None:  # llama-cpp-python: each call's seed comes from the last one
            seed = derive_seed(self._seed)
        self._seed = int(seed)
        room = self.n_ctx() - len(tokens)
        n = room if max_tokens is None or max_tokens <= 0 else min(int(max_tokens), room)
        stops = [stop] if isinstance(stop, str) else list(stop or [])
        return CompletionJob(cid=cid, created=int(time.time()), model_name=model or self.model_path,
                             prompt_text=prompt_text, tokens=tokens, sampling=sampling,
                             seed=int(seed) & 0xFFFFFFFF, n_predict=max(1, n), stops=[s for s in stops if s],
                             echo=echo, drafter_name=self._drafter_name, spec_kwargs={"verify": self._spec_verify})

    def _run(self, job: CompletionJob, stream: bool) -> Result:
        s = job.start(self._gen)  # validation errors surface here, also for stream=True
        if stream:
            return self._logged(job.chunks(s))
        out = job.result(s)
        self._log(out["speculative"])
        return out

    def _logged(self, chunks: Iterator[dict[str, Any]]) -> Iterator[dict[str, Any]]:
        for c in chunks:
            if "speculative" in c:
                self._log(c["speculative"])
            yield c

    def _log(self, spec: Mapping[str, Any]) -> None:
        if self.verbose:
            print(f"llama-spec: {spec['emitted']} tokens, decode {spec['decode_tps']:.2f} t/s, rule {spec['rule']}, "
                  f"drafter {spec['drafter']}: drafted {spec['drafted']}, accepted {spec['accepted']}, "
                  f"mean accepted length {spec['mean_accepted_length']:.2f}", file=sys.stderr)

    def create_completion(
        self,
        prompt: str | list[int],
        suffix: str | None = None,
        max_tokens: int | None = 16,
        temperature: float = 0.8,
        top_p: float = 0.95,
        min_p: float = 0.05,
        typical_p: float = 1.0,
        logprobs: int | None = None,
        echo: bool = False,
        stop: str | list[str] | None = None,
        frequency_penalty: float = 0.0,
        presence_penalty: float = 0.0,
        repeat_penalty: float = 1.0,
        top_k: int = 40,
        stream: bool = False,
        seed: int | None = None,
        tfs_z: float = 1.0,
        mirostat_mode: int = 0,
        mirostat_tau: float = 5.0,
        mirostat_eta: float = 0.1,
        model: str | None = None,
        stopping_criteria: Any = None,
        logits_processor: Any = None,
        grammar: Any = None,
        logit_bias: Mapping[Any, float] | None = None,
    ) -> Result:
        """Complete `prompt` (text, or token ids used as given): a ``text_completion`` dict, or
        with ``stream=True`` an iterator of chunks. ``max_tokens`` None or <= 0: up to the end of
        the context. ``grammar``: GBNF text or a ``llama_cpp.LlamaGrammar``. ``echo`` puts the
        prompt in front of the text (streamed as a first chunk)."""
        del mirostat_tau, mirostat_eta  # only read by mirostat, refused below unless mode 0
        check_call_defaults(suffix=suffix, logprobs=logprobs, tfs_z=tfs_z, mirostat_mode=mirostat_mode,
                            stopping_criteria=stopping_criteria, logits_processor=logits_processor)
        sp = sampling_params(temperature=temperature, top_p=top_p, top_k=top_k, min_p=min_p, typical_p=typical_p,
                             repeat_penalty=repeat_penalty, frequency_penalty=frequency_penalty,
                             presence_penalty=presence_penalty, penalty_last_n=self.last_n_tokens_size,
                             grammar=grammar, logit_bias=logit_bias)
        if isinstance(prompt, str):
            text = prompt
        else:
            text = self.detokenize(prompt).decode("utf-8", "replace") if echo else ""
        job = self._job(prompt_tokens(self._model, prompt), text, max_tokens=max_tokens, stop=stop, seed=seed,
                        echo=echo, model=model, sampling=sp, cid="cmpl-" + str(uuid.uuid4()))
        return self._run(job, stream)

    def __call__(self, prompt: str | list[int], *args: Any, **kwargs: Any) -> Result:
        """Same as :meth:`create_completion`."""
        return self.create_completion(prompt, *args, **kwargs)

    def create_chat_completion(
        self,
        messages: Sequence[Mapping[str, Any]],
        functions: Sequence[Mapping[str, Any]] | None = None,
        function_call: Any = None,
        tools: Sequence[Mapping[str, Any]] | None = None,
        tool_choice: Any = None,
        temperature: float = 0.2,
        top_p: float = 0.95,
        top_k: int = 40,
        min_p: float = 0.05,
        typical_p: float = 1.0,
        stream: bool = False,
        stop: str | list[str] | None = None,
        seed: int | None = None,
        response_format: Mapping[str, Any] | None = None,
        max_tokens: int | None = None,
        presence_penalty: float = 0.0,
        frequency_penalty: float = 0.0,
        repeat_penalty: float = 1.0,
        tfs_z: float = 1.0,
        mirostat_mode: int = 0,
        mirostat_tau: float = 5.0,
        mirostat_eta: float = 0.1,
        model: str | None = None,
        logits_processor: Any = None,
        grammar: Any = None,
        logit_bias: Mapping[Any, float] | None = None,
        logprobs: bool | None = None,
        top_logprobs: int | None = None,
    ) -> Result:
        """One chat turn: a ``chat.completion`` dict, or with ``stream=True`` an iterator of
        ``chat.completion.chunk`` dicts (see :mod:`llama_spec.compat.chat` for chat_format,
        response_format and tools)."""
        del mirostat_tau, mirostat_eta
        check_call_defaults(logprobs=logprobs, top_logprobs=top_logprobs, tfs_z=tfs_z, mirostat_mode=mirostat_mode,
                            logits_processor=logits_processor)
        plan: ChatPlan = plan_chat(self._model, messages, chat_format=self.chat_format, functions=functions,
                                   function_call=function_call, tools=tools, tool_choice=tool_choice,
                                   response_format=response_format, grammar=grammar_text(grammar))
        sp = sampling_params(temperature=temperature, top_p=top_p, top_k=top_k, min_p=min_p, typical_p=typical_p,
                             repeat_penalty=repeat_penalty, frequency_penalty=frequency_penalty,
                             presence_penalty=presence_penalty, penalty_last_n=self.last_n_tokens_size,
                             grammar=plan.grammar, logit_bias=logit_bias)
        stops = [stop] if isinstance(stop, str) else list(stop or [])
        job = self._job(plan.tokens, "", max_tokens=max_tokens, stop=stops + plan.stops, seed=seed, echo=False,
                        model=model, sampling=sp, cid="cmpl-" + str(uuid.uuid4()))
        out = self._run(job, stream)
        if isinstance(out, dict):
            return chat_result(out, plan)
        return chat_chunks(out, plan)
