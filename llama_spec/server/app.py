"""The OpenAI-compatible HTTP API (starlette) over a :class:`~llama_spec.server.engine.ServerEngine`.

Routes: ``POST /v1/chat/completions``, ``POST /v1/completions`` (JSON, or SSE with
``"stream": true``), ``GET /v1/models``, ``GET /health``. Errors are OpenAI-shaped
(``{"error": {"message", "type", "param", "code"}}``): 400 for malformed JSON, a bad field (named
in ``param``) or a prompt longer than a slot's context (both numbers in the message), 401 for
a missing/wrong Bearer key (every route but ``/health``), 503 when every slot and queue place is
taken. Responses carry a ``speculative`` object (drafted, accepted, rule, ...).

Prompts are rendered (the GGUF's chat template, sandboxed) and tokenized here, off the event
loop; the worker thread only decodes. A streaming request waits for its first token before the
response starts, so an error found when its sequence starts is still a proper status code. A
client that goes away (mid-stream or while waiting) cancels its request: the slot frees at once.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from .. import chat_api
from ..errors import RequestError
from ..generation.solo import GenerationResult
from ..llama.model import Model
from .engine import GenerationRequest, RequestHandle, ServerEngine
from .schema import ChatRequest, CompletionRequest, parse_chat, parse_completion, parse_json

__all__ = ["ServerConfig", "create_app"]

log = logging.getLogger("llama_spec.server")
_DISCONNECT_POLL_S = 0.25


class _ClientGone(Exception):
    """The client disconnected before its (non-streaming) answer was ready."""


@dataclass
class ServerConfig:
    """What the routes need to know besides the engine."""

    model_name: str
    api_key: str | None = None
    speculative_mode: str = "none"   # "none" | "draft-simple" | "draft-mtp" | a drafter's name
    chat_template: str | None = None  # override of the GGUF's template


def _error(e: RequestError) -> JSONResponse:
    return JSONResponse(e.body(), status_code=e.status)


def _as_request_error(e: BaseException) -> RequestError:
    """Map an exception from a request's sequence to an HTTP error."""
    if isinstance(e, RequestError):
        return e
    if isinstance(e, ValueError):
        return RequestError(str(e), None)
    return RequestError(f"internal error: {type(e).__name__}: {e}", None, status=500, type="server_error")


class _Api:
    """The route handlers, bound to one engine, model and config."""

    def __init__(self, engine: ServerEngine, model: Model, config: ServerConfig) -> None:
        self.engine = engine
        self.model = model
        self.cfg = config
        self.created = int(time.time())

    # ------------------------------------------------------------------ plumbing
    def guard(self, fn: Callable[[Request], Awaitable[Response]], *, auth: bool = True
              ) -> Callable[[Request], Awaitable[Response]]:
        """Wrap a handler: Bearer check, RequestError -> its status, anything else -> 500."""
        async def handler(request: Request) -> Response:
            if auth and self.cfg.api_key is not None:
                got = request.headers.get("authorization", "")
                want = f"Bearer {self.cfg.api_key}"
                if not hmac.compare_digest(got.encode(), want.encode()):
                    return _error(RequestError("invalid or missing API key (Authorization: Bearer KEY)", None,
                                               status=401, type="authentication_error", code="invalid_api_key"))
            try:
                return await fn(request)
            except RequestError as e:
                return _error(e)
            except _ClientGone:
                return Response(status_code=499)  # nginx's "client closed request"; nobody reads it
            except Exception as e:  # noqa: BLE001 - one bad request never takes the server down
                log.exception("request failed")
                return _error(_as_request_error(e))
        return handler

    def speculative(self, res: GenerationResult) -> dict:
        st = res.stats
        if self.cfg.speculative_mode == "none":
            rule = "none"
        else:
            rule = getattr(res, "verify", None) or ("token" if res.spec_draft_sample else "exact-match")
        return {"drafted": st.drafted, "accepted": st.accepted, "rule": rule, "mode": self.cfg.speculative_mode,
                "verifications": st.verifications, "acceptance_rate": st.acceptance_rate,
                "mean_accepted_length": st.mean_accepted_length, "decode_tps": st.decode_tps}

    def limit(self, n_prompt: int, max_tokens: int | None, param: str) -> int:
        """Tokens this request may generate; 400 when the prompt does not fit a slot."""
        n_ctx = self.engine.n_ctx_per_seq
        if n_prompt >= n_ctx:
            raise RequestError(f"the prompt has {n_prompt} tokens but a slot's context holds {n_ctx} tokens "
                               "(the prompt must leave room for at least one generated token)", param,
                               code="context_length_exceeded")
        room = n_ctx - n_prompt
        return room if max_tokens is None else min(max_tokens, room)

    def submit(self, req: ChatRequest | CompletionRequest, tokens: list[int], param: str) -> RequestHandle:
        n = self.limit(len(tokens), req.max_tokens, param)
        g = GenerationRequest(prompt=tokens, sampling=req.sampling, n_predict=n, seed=req.seed, stop=tuple(req.stop),
                              verify=req.verify, n_max=req.n_max, ignore_eos=req.ignore_eos, tree=req.tree,
                              cache_prompt=req.cache_prompt)
        return self.engine.submit(g, asyncio.get_running_loop())

    async def next_item(self, h: RequestHandle, request: Request) -> tuple[str, Any]:
        """The request's next item; cancels it (and raises CancelledError) when the client is gone."""
        while True:
            try:
                return await asyncio.wait_for(h.queue.get(), _DISCONNECT_POLL_S)
            except TimeoutError:
                if await request.is_disconnected():
                    self.engine.cancel(h)
                    raise _ClientGone from None

    async def collect(self, h: RequestHandle, request: Request) -> GenerationResult:
        """Wait for the whole result (non-streaming), cancelling if the client leaves."""
        try:
            while True:
                kind, item = await self.next_item(h, request)
                if kind == "result":
                    return item
                if kind == "error":
                    raise _as_request_error(item)
        except BaseException:
            self.engine.cancel(h)
            raise

    async def first(self, h: RequestHandle, request: Request) -> tuple[str, Any]:
        """The first item of a streaming request; an error becomes the response's status."""
        try:
            item = await self.next_item(h, request)
        except BaseException:
            self.engine.cancel(h)
            raise
        if item[0] == "error":
            raise _as_request_error(item[1])
        return item

    async def items(self, h: RequestHandle, first: tuple[str, Any]) -> AsyncIterator[tuple[str, Any]]:
        """All items of a streaming request; the ``finally`` runs when the client disconnects."""
        try:
            item = first
            while True:
                yield item
                if item[0] != "event":
                    return
                item = await h.queue.get()
        finally:
            self.engine.cancel(h)  # no-op once finished; frees the slot when the client went away

    # ------------------------------------------------------------------ routes
    async def health(self, request: Request) -> Response:
        e = self.engine
        return JSONResponse({"status": "ok", "slots": e.n_parallel, "busy": e.load, "queue_capacity": e.max_queue,
                             "n_ctx_per_slot": e.n_ctx_per_seq, "prompt_cache": e.cache_info()})

    async def models(self, request: Request) -> Response:
        return JSONResponse({"object": "list", "data": [
            {"id": self.cfg.model_name, "object": "model", "created": self.created, "owned_by": "llama-spec",
             "meta": {"n_vocab": self.model.n_vocab, "n_ctx_per_slot": self.engine.n_ctx_per_seq,
                      "speculative": self.cfg.speculative_mode}}]})

    async def completions(self, request: Request) -> Response:
        req = parse_completion(parse_json(await request.body()), self.model.n_vocab)
        p = req.prompt
        tokens = await run_in_threadpool(self.model.tokenize, p) if isinstance(p, str) else list(p)
        h = self.submit(req, tokens, "prompt")
        cid, created = "cmpl-" + uuid.uuid4().hex, int(time.time())
        if req.stream:
            first = await self.first(h, request)
            return _sse(self.completion_chunks(h, first, req, cid, created))
        res = await self.collect(h, request)
        return JSONResponse({"id": cid, "object": "text_completion", "created": created, "model": self.cfg.model_name,
                             "choices": [{"text": res.text, "index": 0, "logprobs": None,
                                          "finish_reason": _finish(res)}],
                             "usage": _usage(res).to_dict(), "speculative": self.speculative(res)})

    async def completion_chunks(self, h: RequestHandle, first: tuple[str, Any], req: CompletionRequest,
                                cid: str, created: int) -> AsyncIterator[dict]:
        def chunk(text: str, finish: str | None = None) -> dict:
            return {"id": cid, "object": "text_completion", "created": created, "model": self.cfg.model_name,
                    "choices": [{"text": text, "index": 0, "logprobs": None, "finish_reason": finish}]}

        hold = chat_api.StopHold(req.stop)
        async for kind, item in self.items(h, first):
            if kind == "event":
                safe = hold.feed(item.text) if item.text else ""
                if safe:
                    yield chunk(safe)
            elif kind == "result":
                rest = hold.finish(item.text)
                if rest:
                    yield chunk(rest)
                last = chunk("", _finish(item))
                last["speculative"] = self.speculative(item)
                if req.include_usage:
                    last["usage"] = _usage(item).to_dict()
                yield last
            else:
                yield _as_request_error(item).body()

    async def chat(self, request: Request) -> Response:
        req = parse_chat(parse_json(await request.body()), self.model.n_vocab)
        try:
            prep = await run_in_threadpool(
                chat_api.prepare_prompt, self.model, req.messages, enable_thinking=req.enable_thinking,
                tools=req.tools, chat_template=self.cfg.chat_template, **req.template_kwargs)
        except chat_api.TemplateError as e:
            raise RequestError(f"the chat template failed on these messages: {e}", "messages") from None
        h = self.submit(req, prep.tokens, "messages")
        cid, created = "chatcmpl-" + uuid.uuid4().hex, int(time.time())
        if req.stream:
            first = await self.first(h, request)
            return _sse(self.chat_chunks(h, first, req, prep, cid, created))
        res = await self.collect(h, request)
        reasoning, answer = (chat_api.split_thinking(res.text, prep.started_inside, start=prep.tags[0],
                                                     end=prep.tags[1]) if prep.has_thinking else (None, res.text))
        msg: dict[str, Any] = {"role": "assistant", "content": answer}
        if reasoning is not None:
            msg["reasoning_content"] = reasoning
        return JSONResponse({"id": cid, "object": "chat.completion", "created": created, "model": self.cfg.model_name,
                             "choices": [{"index": 0, "message": msg, "logprobs": None, "finish_reason": _finish(res)}],
                             "usage": _usage(res).to_dict(), "speculative": self.speculative(res)})

    async def chat_chunks(self, h: RequestHandle, first: tuple[str, Any], req: ChatRequest, prep: Any,
                          cid: str, created: int) -> AsyncIterator[dict]:
        def chunk(finish: str | None = None, **delta: str) -> dict:
            return {"id": cid, "object": "chat.completion.chunk", "created": created, "model": self.cfg.model_name,
                    "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}]}

        def deltas(parts: list[tuple[str, str]]) -> list[dict]:
            return [chunk(**{"reasoning_content" if k == "reasoning" else "content": t}) for k, t in parts if t]

        hold = chat_api.StopHold(req.stop)
        split = (chat_api.ThinkSplitter(prep.started_inside, *prep.tags) if prep.has_thinking else None)
        yield chunk(role="assistant", content="")
        async for kind, item in self.items(h, first):
            if kind == "event":
                safe = hold.feed(item.text) if item.text else ""
                if safe:
                    for c in deltas(split.feed(safe) if split else [("content", safe)]):
                        yield c
            elif kind == "result":
                rest = hold.finish(item.text)
                parts = (split.feed(rest) + split.finish()) if split else [("content", rest)]
                for c in deltas(parts):
                    yield c
                last = chunk(_finish(item))
                last["speculative"] = self.speculative(item)
                yield last
                if req.include_usage:
                    yield {**chunk(), "choices": [], "usage": _usage(item).to_dict()}
            else:
                yield _as_request_error(item).body()


def _finish(res: GenerationResult) -> str:
    return "length" if res.stop_reason in ("length", "context_full") else "stop"


def _usage(res: GenerationResult) -> chat_api.Usage:
    n_p, n_c = len(res.prompt_tokens), len(res.tokens)
    return chat_api.Usage(n_p, n_c, n_p + n_c, cached_tokens=res.cached_tokens)


def _sse(chunks: AsyncIterator[dict]) -> StreamingResponse:
    async def body() -> AsyncIterator[bytes]:
        async for c in chunks:
            yield b"data: " + json.dumps(c, ensure_ascii=False).encode() + b"\n\n"
        yield b"data: [DONE]\n\n"
    return StreamingResponse(body(), media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})


def create_app(engine: ServerEngine, model: Model, config: ServerConfig) -> Starlette:
    """The starlette app; the caller starts/stops ``engine`` (its worker thread) around it."""
    api = _Api(engine, model, config)
    g = api.guard
    routes = [
        Route("/health", g(api.health, auth=False), methods=["GET"]),
        Route("/v1/models", g(api.models), methods=["GET"]),
        Route("/v1/completions", g(api.completions), methods=["POST"]),
        Route("/v1/chat/completions", g(api.chat), methods=["POST"]),
        # llama-server also answers without the /v1 prefix
        Route("/models", g(api.models), methods=["GET"]),
        Route("/completions", g(api.completions), methods=["POST"]),
        Route("/chat/completions", g(api.chat), methods=["POST"]),
    ]
    return Starlette(routes=routes, exception_handlers={HTTPException: _http_error})


async def _http_error(request: Request, exc: Exception) -> Response:
    """404/405 ... in OpenAI's error shape."""
    assert isinstance(exc, HTTPException)
    return _error(RequestError(f"{request.method} {request.url.path}: {exc.detail}", None, status=exc.status_code,
                               code="not_found" if exc.status_code == 404 else None))
