"""The HTTP side of `minillm serve`: a FastAPI app speaking OpenAI's /v1/completions, /v1/chat/completions and
/v1/models (streaming as server-sent events), in front of an AsyncEngine (minillm.serve.async_engine).

A handler parses and checks the request (minillm.serve.protocol), submits it to the engine loop's queue and turns
the updates that come back into OpenAI's objects. It never touches the engine itself (it reads only the tokenizer,
which holds no state, for the chat template's BOS and logprobs' token texts). A client that disconnects
cancels its handler (Starlette cancels a streaming response on http.disconnect; a non-streaming one is watched
here, as vLLM's `with_cancellation` does), and the handler's `finally` aborts its requests.
"""
from __future__ import annotations

import asyncio
import time
import uuid
from contextlib import asynccontextmanager
from dataclasses import replace
from typing import Optional

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, StreamingResponse
from starlette.exceptions import HTTPException

from ..formats.chat_template import CHAT_STOP, CHAT_TEMPLATE, render_chat
from . import protocol as P
from .async_engine import AsyncEngine, EngineDown
from .body_limit import MAX_BODY_BYTES, BodyLimit
from .echo import Echo
from .protocol import ServeError
from .stream import Delta


def build_app(engine, model_name: str, chat_template: Optional[str] = None, max_logprobs: int = 20,
              lora_modules: Optional[dict] = None, max_body_bytes: int = MAX_BODY_BYTES) -> FastAPI:
    """engine: an LLMEngine (llm.engine); it belongs to the app's engine loop while the app runs. max_logprobs:
    the most top-k a request may ask per token (logprobs, prompt_logprobs, top_logprobs; vLLM's default 20).
    lora_modules: {served name: a LoRA adapter's shipped name or PEFT directory} (needs enable_lora): a request
    whose `model` is such a name runs with that adapter, as vLLM's --lora-modules; each is read now.
    max_body_bytes: a larger request body is a 413 (see BodyLimit). The engine's own limits (max_n samples,
    max_model_len, the prompt's bytes) refuse the rest before anything is built."""
    aengine = AsyncEngine(engine)
    served = Served(aengine, model_name, engine.tokenizer, engine.config.max_model_len, chat_template, max_logprobs)
    for name, spec in (lora_modules or {}).items():
        if name == model_name:
            raise ValueError(f"LoRA module name {name!r} is the base model's served name: choose another")
        served.adapters[name] = (spec, engine.lora_adapter(spec))

    @asynccontextmanager
    async def lifespan(app):
        await aengine.start()
        yield
        await aengine.stop()

    app = FastAPI(title="minillm", lifespan=lifespan)
    app.state.engine = aengine
    _add_error_handlers(app)
    app.add_middleware(BodyLimit, max_bytes=max_body_bytes)
    _add_info_routes(app, served)
    _add_completion_routes(app, served)
    _add_chat_routes(app, served)
    _add_tokenizer_routes(app, served)
    return app


class Served:
    """What every handler reads: the model's name, tokenizer, chat template and creation time, and the engine loop
    (through which alone a handler reaches the engine)."""

    def __init__(self, aengine: AsyncEngine, model_name: str, tokenizer, max_model_len: int,
                 chat_template: Optional[str] = None, max_logprobs: int = 20):
        self.aengine, self.model_name = aengine, model_name
        self.tokenizer, self.max_model_len = tokenizer, max_model_len
        self.max_logprobs = max_logprobs                 # the most top-k a request may ask per token (vLLM's 20)
        self.adapters: dict = {}                         # served name -> (what it was given as, its LoRAAdapter)
        self.template = chat_template or getattr(tokenizer, "chat_template", None) or CHAT_TEMPLATE
        self.created = int(time.time())

    def check_model(self, name: str):
        """A request's `model` -> the LoRA adapter it names (None: the base model), or a 404."""
        if name == self.model_name:
            return None
        if name in self.adapters:
            return self.adapters[name][1]
        served = ", ".join(repr(n) for n in [self.model_name, *self.adapters])
        raise ServeError(f"The model `{name}` does not exist (this server serves {served}: GET /v1/models)", 404,
                         "model")

    async def submit(self, prompts, params, req, rid, context="refuse"):
        if req.stream and params.num_samples > params.n:
            raise ServeError(f"best_of={params.best_of} > n={params.n} cannot stream: the best samples are known "
                             "only when all have finished", param="best_of")
        try:
            return await self.aengine.submit(prompts, params, request_id=rid, priority=req.priority,
                                             client=req.user, context=context,
                                             lora=self.check_model(req.model))
        except ValueError as e:
            raise ServeError(str(e)) from None
        except EngineDown as e:                          # the engine loop is down (health() says why)
            raise ServeError(str(e), 503) from None


def _params_of(req, **kw):
    try:
        return P.sampling_params(req, **kw)
    except ValueError as e:
        raise ServeError(str(e)) from None


# ---------------------------------------------------------------------------- errors, in OpenAI's shape
def _add_error_handlers(app: FastAPI):
    @app.exception_handler(RequestValidationError)
    async def _invalid(request, exc: RequestValidationError):
        message, param = P.validation_message(exc.errors())
        return JSONResponse(P.error_body(message, 400, param), status_code=400)

    @app.exception_handler(ServeError)
    async def _refused(request, exc: ServeError):
        return JSONResponse(P.error_body(str(exc), exc.status, exc.param), status_code=exc.status)

    @app.exception_handler(HTTPException)
    async def _http(request, exc: HTTPException):
        return JSONResponse(P.error_body(str(exc.detail), exc.status_code), status_code=exc.status_code)

    @app.exception_handler(Exception)
    async def _bug(request, exc: Exception):
        return JSONResponse(P.error_body(f"internal error: {type(exc).__name__}: {exc}", 500), status_code=500)


# ---------------------------------------------------------------------------- routes
def _add_info_routes(app: FastAPI, served: Served):
    """/health, /stats and /v1/models."""
    @app.get("/health")
    async def health():
        down = served.aengine.health()
        return JSONResponse({"status": "down", "reason": down}, status_code=503) if down else {"status": "ok"}

    @app.get("/stats")
    async def stats():
        """The engine's counters (not OpenAI's API): requests, running, waiting, free_blocks of num_blocks."""
        return await served.aengine.stats()

    @app.get("/metrics")
    async def metrics():
        """Prometheus text (vLLM's names, prefix minillm:): requests running and waiting, KV blocks, tokens."""
        return PlainTextResponse(P.prometheus(await served.aengine.stats(), served.model_name),
                                 media_type="text/plain; version=0.0.4")

    @app.get("/v1/models")
    async def models():
        base = {"id": served.model_name, "object": "model", "created": served.created, "owned_by": "minillm",
                "root": served.model_name, "parent": None, "max_model_len": served.max_model_len}
        adapters = [{**base, "id": name, "root": str(spec), "parent": served.model_name}
                    for name, (spec, _) in served.adapters.items()]
        return {"object": "list", "data": [base, *adapters]}


def _add_completion_routes(app: FastAPI, served: Served):
    """/v1/completions: one prompt, a list of prompts, or token ids."""
    @app.post("/v1/completions")
    async def completions(req: P.CompletionRequest, request: Request):
        served.check_model(req.model)
        prompts = [req.prompt] if isinstance(req.prompt, str) or (req.prompt and isinstance(req.prompt[0], int)) \
            else list(req.prompt)
        if not prompts:
            raise ServeError("prompt is empty: pass text, a list of texts, or token ids", param="prompt")
        echo = Echo.of(req, served.max_logprobs)
        params = _params_of(req, logprobs=req.logprobs, prompt_logprobs=echo.prompt_k,
                            max_tokens=1 if echo.score_only else None)
        rid = f"cmpl-{uuid.uuid4().hex}"
        group = await served.submit(prompts, params, req, rid, context="clip" if echo.score_only else "refuse")
        shape = Shape(rid, req.model, params.n, served.tokenizer, chat=False, token_ids=req.return_token_ids,
                      echo=echo)
        if req.stream:
            return stream_response(group, shape, req.stream_options)
        return await unless_disconnected(request, group, shape)


def _add_chat_routes(app: FastAPI, served: Served):
    """/v1/chat/completions: the messages rendered by the chat template, then one completion."""
    @app.post("/v1/chat/completions")
    async def chat(req: P.ChatCompletionRequest, request: Request):
        served.check_model(req.model)
        tokenizer, template = served.tokenizer, served.template
        try:
            schema = P.response_format_schema(req.response_format)
            text = chat_text(_messages(req.messages), template, tokenizer, req.add_generation_prompt)
        except ValueError as e:
            raise ServeError(str(e)) from None
        top = req.top_logprobs if req.top_logprobs is not None else 0
        if isinstance(top, int) and top > served.max_logprobs:
            raise ServeError(f"top_logprobs={top} is above this server's limit of {served.max_logprobs}",
                             param="top_logprobs")
        fill = req.max_tokens is None and req.max_completion_tokens is None   # then: what the context leaves (vLLM)
        params = _params_of(req, logprobs=top if req.logprobs else None, guided_json=schema)
        guided = params.guided_regex or params.guided_json or params.guided_choice   # the pattern ends the reply
        if template == CHAT_TEMPLATE and CHAT_STOP not in params.stop and not guided:   # a reply is one speech
            params = replace(params, stop=params.stop + [CHAT_STOP])
        rid = f"chatcmpl-{uuid.uuid4().hex}"
        group = await served.submit([text], params, req, rid, context="fill" if fill else "refuse")
        shape = Shape(rid, req.model, params.n, tokenizer, chat=True, token_ids=req.return_token_ids,
                      top_logprobs=top if req.logprobs else None)
        if req.stream:
            return stream_response(group, shape, req.stream_options)
        return await unless_disconnected(request, group, shape)


def _messages(messages: list) -> list[dict]:
    """ChatMessages -> the dicts a chat template reads (a content of text parts joined)."""
    return [{"role": m.role, "content": m.content if isinstance(m.content, str)
             else "".join(part.text for part in m.content)} for m in messages]


def _add_tokenizer_routes(app: FastAPI, served: Served):
    """vLLM's /tokenize, /detokenize and /tokenizer_info: the served model's own tokenizer over HTTP
    (lm-evaluation-harness's remote tokenizer splits context and continuation with them)."""
    tokenizer = served.tokenizer

    @app.post("/tokenize")
    async def tokenize(req: P.TokenizeRequest):
        if req.model is not None:
            served.check_model(req.model)
        if (req.prompt is None) == (req.messages is None):
            raise ServeError("pass one of prompt (text) and messages (a chat)", param="prompt")
        text = req.prompt if req.prompt is not None else \
            chat_text(_messages(req.messages), served.template, tokenizer, req.add_generation_prompt)
        specials = {special_text(tokenizer, t): t for t in (tokenizer.bos_id, tokenizer.eos_id)}
        ids = [specials[text]] if text in specials else tokenizer.encode(text, bos=req.add_special_tokens)
        return {"count": len(ids), "max_model_len": served.max_model_len, "tokens": ids,
                "token_strs": [P.token_text(tokenizer, t) for t in ids] if req.return_token_strs else None}

    @app.post("/detokenize")
    async def detokenize(req: P.DetokenizeRequest):
        if req.model is not None:
            served.check_model(req.model)
        bad = [t for t in req.tokens if not 0 <= t < tokenizer.vocab_size]
        if bad:
            raise ServeError(f"tokens must be integers in [0, {tokenizer.vocab_size}), got {bad[:5]}", param="tokens")
        return {"prompt": tokenizer.decode(req.tokens)}

    @app.get("/tokenizer_info")
    async def tokenizer_info():
        return {"tokenizer_class": type(tokenizer).__name__, "bos_token": special_text(tokenizer, tokenizer.bos_id),
                "eos_token": special_text(tokenizer, tokenizer.eos_id), "pad_token": None,
                "chat_template": served.template, "model_max_length": served.max_model_len,
                "vocab_size": tokenizer.vocab_size}


def chat_text(messages: list, template: str, tokenizer, add_generation_prompt: bool = True) -> str:
    """The prompt text of a chat: the template rendered as transformers renders it, then without its leading BOS
    where the engine's tokenizer adds BOS itself (so it is there once; Qwen's adds none and its templates write
    none)."""
    bos = special_text(tokenizer, tokenizer.bos_id)
    text = render_chat(messages, template, bos_token=bos, add_generation_prompt=add_generation_prompt)
    return text.removeprefix(bos) if getattr(tokenizer, "adds_bos", True) else text


def special_text(tokenizer, token: int) -> str:
    """BOS or EOS as a chat template (and tokenizer_info) writes it: "<s>" and "</s>" for llama2.c vocabularies
    (as export_hf names them), the token's own name in a tokenizer.json."""
    hf = getattr(tokenizer, "_tok", None)                  # a tokenizer.json (minillm.formats.hf.HFTokenizer)
    return hf.id_to_token(token) if hf is not None else "</s>" if token == tokenizer.eos_id else "<s>"


# ---------------------------------------------------------------------------- updates -> OpenAI objects
class Shape:
    """How one call's updates become OpenAI choices: choice index = prompt index * n + sample index (as vLLM)."""

    def __init__(self, rid, model, n, tokenizer, chat: bool, token_ids: bool, top_logprobs=None,
                 echo: Optional[Echo] = None):
        self.rid, self.model, self.n, self.tokenizer, self.chat = rid, model, n, tokenizer, chat
        self.token_ids, self.top_logprobs, self.echo = token_ids, top_logprobs, echo or Echo()
        self.offsets: dict = {}                   # choice index -> characters of text so far (logprobs offsets)

    def choice(self, prompt_index: int, d, final: bool = False) -> dict:
        index = prompt_index * self.n + d.index
        c = {"index": index}
        if self.chat:
            c["message" if final else "delta"] = {"role": "assistant", "content": d.text} if final else \
                {"content": d.text}
            lp = P.chat_logprobs(self.tokenizer, d.logprobs, self.top_logprobs) if d.logprobs else None
        else:
            c["text"] = d.text
            lp = P.completion_logprobs(self.tokenizer, d.logprobs, self.offsets.get(index, 0), d.token_ids) \
                if d.logprobs else None
            self.offsets[index] = self.offsets.get(index, 0) + len(d.text)
        c["logprobs"] = lp
        c["finish_reason"] = d.finish_reason
        c["stop_reason"] = d.stop_reason if isinstance(d.stop_reason, (str, int)) else None
        if self.token_ids:
            c["token_ids"] = d.token_ids
        return c

    def final(self, prompt_index: int, output, i: int) -> dict:
        """Sample i of a finished request's output as its choice (the prompt echoed, prompt_logprobs added)."""
        c = output.outputs[i]
        d = Delta(i, c.text, list(c.token_ids), c.finish_reason, c.stop_reason, c.error, list(c.logprobs or []))
        choice = self.choice(prompt_index, self.echo.apply(self.tokenizer, output, d), final=True)
        if self.echo.prompt_logprobs is not None:
            choice["prompt_logprobs"] = P.vllm_prompt_logprobs(self.tokenizer, output.prompt_logprobs,
                                                               self.echo.prompt_logprobs)
        return choice

    def obj(self, choices, usage, chunk: bool) -> dict:
        return (P.chat_object if self.chat else P.completion_object)(self.rid, self.model, choices, usage, chunk)


def _error_of(update) -> Optional[str]:
    return next((d.error or "the request failed" for d in update.deltas if d.finish_reason == "error"), None)


async def unless_disconnected(request: Request, group, shape: Shape):
    """Collect the whole answer, unless the client goes away first (then its requests are aborted)."""
    collect = asyncio.ensure_future(collect_all(group, shape))
    gone = asyncio.ensure_future(_disconnected(request))
    try:
        await asyncio.wait([collect, gone], return_when=asyncio.FIRST_COMPLETED)
        if not collect.done():
            collect.cancel()
            return JSONResponse(P.error_body("client disconnected", 499), status_code=499)
        return collect.result()
    finally:
        gone.cancel()
        group.close()


async def _disconnected(request: Request):
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def collect_all(group, shape: Shape):
    """The final output of every prompt (with best_of, the n best samples, renumbered 0..n-1) as one object."""
    outputs = {}
    async for pi, update in group:
        error = _error_of(update)
        if error:
            return JSONResponse(P.error_body(error, 500), status_code=500)
        if update.finished:
            outputs[pi] = update.output
    choices = [shape.final(pi, outputs[pi], i) for pi in sorted(outputs) for i in range(len(outputs[pi].outputs))]
    completion_tokens = 0 if shape.echo.score_only else \
        sum(len(c.token_ids) for o in outputs.values() for c in o.outputs)
    return shape.obj(choices, P.usage(sum(len(ids) for ids in group.prompt_ids), completion_tokens), chunk=False)


def stream_response(group, shape: Shape, options) -> StreamingResponse:
    include_usage = bool(options and options.include_usage)

    async def events():
        completion_tokens = 0
        try:
            if shape.chat:                        # the role comes first, as OpenAI's streams do
                first = [{"index": pi * shape.n + i, "delta": {"role": "assistant", "content": ""},
                          "logprobs": None, "finish_reason": None}
                         for pi in range(len(group.request_ids)) for i in range(shape.n)]
                yield P.sse(shape.obj(first, None, chunk=True))
            async for pi, update in group:
                error = _error_of(update)
                if error:
                    yield P.sse(P.error_body(error, 500))
                    break
                choices = [shape.choice(pi, d) for d in update.deltas]
                completion_tokens += sum(len(d.token_ids) for d in update.deltas)
                if choices:
                    yield P.sse(shape.obj(choices, None, chunk=True))
            else:
                if include_usage:
                    prompt_tokens = sum(len(ids) for ids in group.prompt_ids)
                    yield P.sse(shape.obj([], P.usage(prompt_tokens, completion_tokens), chunk=True))
            yield P.sse("[DONE]")
        finally:                                  # a disconnect cancels this generator: abort what still runs
            group.close()

    return StreamingResponse(events(), media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
