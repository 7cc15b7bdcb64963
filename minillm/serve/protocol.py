"""The OpenAI API's requests and responses, as `minillm serve` speaks them (pydantic models; plain dicts out).

Requests: /v1/completions and /v1/chat/completions take OpenAI's fields, plus vLLM's extra sampling fields (top_k,
min_p, repetition_penalty, ignore_eos, stop_token_ids, best_of, guided_regex / guided_json / guided_choice,
priority, return_token_ids). Structure (types of prompt, messages, stream, ...) is checked by pydantic; the
sampling values are passed to SamplingParams AS SENT (typed Any here), so a bad one is refused with SamplingParams'
own message, the same words LLM.generate would raise. An unknown field is refused, naming it: a typo must not be
silently ignored. Every refusal is HTTP 400 in OpenAI's error shape (404 for an unknown model, as OpenAI and vLLM):

    {"error": {"message": "...", "type": "invalid_request_error", "param": "temperature", "code": null}}

Responses follow OpenAI's objects: text_completion / chat.completion, and their streamed chunks
(text_completion chunks and chat.completion.chunk) sent as server-sent events, ended by `data: [DONE]`.
"""
from __future__ import annotations

import json
import re
import time
from typing import Any, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, StrictStr

from ..core.sampling import SamplingParams


# ---------------------------------------------------------------------------- requests
class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class StreamOptions(_Strict):
    include_usage: StrictBool = False


class _Sampling(_Strict):
    """Fields both endpoints take. Sampling values are Any: SamplingParams checks them (see the module doc)."""
    model: StrictStr
    n: Any = None
    best_of: Any = None
    temperature: Any = None
    top_p: Any = None
    top_k: Any = None
    min_p: Any = None
    max_tokens: Any = None
    stop: Any = None
    stop_token_ids: Any = None
    ignore_eos: Any = None
    seed: Any = None
    presence_penalty: Any = None
    frequency_penalty: Any = None
    repetition_penalty: Any = None
    guided_regex: Any = None
    guided_json: Any = None
    guided_choice: Any = None
    stream: StrictBool = False
    stream_options: Optional[StreamOptions] = None
    user: Optional[StrictStr] = None           # who sent it: the client scheduling_policy="fair" counts by
    priority: StrictInt = 0                     # scheduling_policy="priority" (vLLM's extra field)
    return_token_ids: StrictBool = False        # each choice (and chunk) also carries its token ids (vLLM's)


class CompletionRequest(_Sampling):
    prompt: Union[StrictStr, list[StrictStr], list[StrictInt], list[list[StrictInt]]]
    logprobs: Any = None                        # an integer k: the top-k per token (OpenAI allows up to 5)
    echo: StrictBool = False                    # the prompt before the completion (with logprobs: scored too)
    suffix: Optional[StrictStr] = None
    prompt_logprobs: Any = None                 # vLLM's extra field: the top-k at every prompt token


class TextPart(_Strict):
    type: Literal["text"]
    text: StrictStr


class ChatMessage(_Strict):
    role: Literal["system", "user", "assistant"]
    content: Union[StrictStr, list[TextPart]]
    name: Optional[StrictStr] = None


class ChatCompletionRequest(_Sampling):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: Any = None           # OpenAI's newer name for max_tokens
    logprobs: StrictBool = False
    top_logprobs: Any = None
    response_format: Optional[dict] = None      # {"type": "text" | "json_schema", ...} (json_object is refused)
    add_generation_prompt: StrictBool = True    # vLLM's extra field


class TokenizeRequest(_Strict):
    """vLLM's /tokenize (lm-evaluation-harness's remote tokenizer uses it): text, or a chat to render first."""
    model: Optional[StrictStr] = None
    prompt: Optional[StrictStr] = None
    messages: Optional[list[ChatMessage]] = None
    add_special_tokens: StrictBool = True        # BOS first, where the model's tokenizer adds one
    add_generation_prompt: StrictBool = True
    return_token_strs: StrictBool = False


class DetokenizeRequest(_Strict):
    model: Optional[StrictStr] = None
    tokens: list[StrictInt]


def _given(value, default):
    """OpenAI sends null for "the default"."""
    return default if value is None else value


def sampling_params(req: _Sampling, max_tokens_default: int = 16, logprobs=None, guided_json=None,
                    prompt_logprobs=None, max_tokens=None) -> SamplingParams:
    """The request's SamplingParams (SamplingParams' ValueError if a value is bad); max_tokens: instead of the
    request's."""
    max_tokens = req.max_tokens if max_tokens is None else max_tokens
    if isinstance(req, ChatCompletionRequest) and req.max_completion_tokens is not None:
        max_tokens = req.max_completion_tokens
    return SamplingParams(
        n=_given(req.n, 1), best_of=req.best_of, temperature=_given(req.temperature, 1.0),
        top_p=_given(req.top_p, 1.0), top_k=_given(req.top_k, 0), min_p=_given(req.min_p, 0.0),
        max_tokens=_given(max_tokens, max_tokens_default), stop=req.stop, stop_token_ids=req.stop_token_ids,
        ignore_eos=_given(req.ignore_eos, False), seed=req.seed,
        presence_penalty=_given(req.presence_penalty, 0.0), frequency_penalty=_given(req.frequency_penalty, 0.0),
        repetition_penalty=_given(req.repetition_penalty, 1.0), logprobs=logprobs, prompt_logprobs=prompt_logprobs,
        guided_regex=req.guided_regex, guided_json=_given(req.guided_json, guided_json),
        guided_choice=req.guided_choice)


def response_format_schema(fmt: Optional[dict]):
    """OpenAI's response_format -> a JSON schema for guided_json (None: free text)."""
    if fmt is None or fmt.get("type") == "text":
        return None
    if fmt.get("type") == "json_object":       # "any JSON object" has no finite regex in guided_json's subset
        raise ValueError("response_format {'type': 'json_object'} (any JSON object) is outside guided_json's "
                         "supported subset: pass {'type': 'json_schema', 'json_schema': {'schema': ...}} with an "
                         "object's properties")
    if fmt.get("type") == "json_schema" and isinstance(fmt.get("json_schema"), dict) \
            and "schema" in fmt["json_schema"]:
        return fmt["json_schema"]["schema"]
    raise ValueError(f"response_format must be {{'type': 'text'}} or {{'type': 'json_schema', "
                     f"'json_schema': {{'schema': ...}}}}, got {fmt!r:.200}")


# ---------------------------------------------------------------------------- errors
class ServeError(Exception):
    """A request the server refuses (400: a bad field, named by param; 404: an unknown model)."""

    def __init__(self, message: str, status: int = 400, param: Optional[str] = None):
        super().__init__(message)
        self.status, self.param = status, param


def error_body(message: str, status: int = 400, param: Optional[str] = None) -> dict:
    kind = "invalid_request_error" if 400 <= status < 500 else "server_error"     # OpenAI: the client's fault or not
    code = "model_not_found" if status == 404 and param == "model" else None
    if param is None:                           # SamplingParams names its field: "SamplingParams.top_p must be"
        m = re.search(r"SamplingParams\.(\w+)", message) or re.match(r"(?:prompt \d+: )?(guided_\w+)", message)
        param = m.group(1) if m else "prompt" if re.match(r"(prompt \d+: )?prompt", message) else None
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def validation_message(errors: list) -> tuple[str, Optional[str]]:
    """pydantic's errors for a request body -> (one message, the field it names)."""
    e = errors[0]
    loc = [str(x) for x in e.get("loc", ()) if x != "body"]
    where = ".".join(loc) or None
    if e.get("type") == "json_invalid":
        return f"malformed JSON body: {e.get('ctx', {}).get('error', e.get('msg'))}", None
    if e.get("type") == "extra_forbidden":
        return f"unsupported parameter {where!r}: this server does not take it", where
    if e.get("type") in ("model_attributes_type", "dict_type") and not loc:
        return "the request body must be a JSON object", None
    if e.get("type") == "missing" and not loc:                  # no body at all
        return "the request has no body: send a JSON object (model, prompt or messages, ...)", None
    if e.get("type") == "missing":
        return f"missing required parameter {where!r}", where
    got = json.dumps(e.get("input"), default=str)[:100] if "input" in e else "?"
    return f"{where}: {e.get('msg')} (got {got})", where


# ---------------------------------------------------------------------------- responses
def usage(prompt_tokens: int, completion_tokens: int) -> dict:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


def token_text(tokenizer, token: int) -> str:
    """A token as text for logprobs (llama2.c vocabularies: its piece, e.g. ' the' or '<0x0A>'; BOS and EOS as
    <s> and </s>)."""
    if hasattr(tokenizer, "pieces"):
        if token in (tokenizer.bos_id, tokenizer.eos_id):             # pieces "\n<s>\n", "\n</s>\n": not text
            return "</s>" if token == tokenizer.eos_id else "<s>"
        return tokenizer.pieces[token].decode("utf-8", errors="replace")
    return tokenizer.decode([token])


def completion_logprobs(tokenizer, entries: list, text_offset: int, token_ids: Optional[list] = None) -> dict:
    """Per token {id: logprob} (the token's first) -> the completions API's logprobs object. An entry None (an
    echoed prompt's first token, which nothing predicts) is null there, as in OpenAI's legacy API; its token is
    token_ids[i]."""
    out = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
    for i, d in enumerate(entries):
        (tok, lp), *_ = d.items() if d is not None else [(token_ids[i], None)]
        text = token_text(tokenizer, tok)
        out["tokens"].append(text)
        out["token_logprobs"].append(lp)
        out["top_logprobs"].append({token_text(tokenizer, t): x for t, x in d.items()} if d is not None else None)
        out["text_offset"].append(text_offset)
        text_offset += len(text)
    return out


def top(entry: Optional[dict], k: int) -> Optional[dict]:
    """One position's {id: logprob} (the token's first, then the most likely) cut to the token and the top k."""
    if entry is None:
        return None
    (tok, lp), *_ = entry.items()
    best = sorted(entry.items(), key=lambda kv: -kv[1])[:k]
    return {tok: lp, **{t: x for t, x in best if t != tok}}


def vllm_prompt_logprobs(tokenizer, entries: list, k: int) -> list:
    """prompt_logprobs as vLLM's completions answer them: per prompt token None (the first) or
    {token id: {"logprob", "rank", "decoded_token"}}; rank is the position among the top k (1 = most likely),
    null for a prompt token outside them (the engine keeps no full ranking)."""
    out = []
    for d in entries:
        if d is None:
            out.append(None)
            continue
        ranked = {t: r for r, (t, _) in enumerate(sorted(d.items(), key=lambda kv: -kv[1])[:k], 1)}
        out.append({str(t): {"logprob": x, "rank": ranked.get(t), "decoded_token": token_text(tokenizer, t)}
                    for t, x in d.items()})
    return out


def chat_logprobs(tokenizer, entries: list, top: int) -> dict:
    """Per token {id: logprob} -> the chat API's logprobs object (token, logprob, bytes, top_logprobs)."""
    content = []
    for d in entries:
        (tok, lp), *_ = d.items()
        ranked = sorted(d.items(), key=lambda kv: -kv[1])[:top]
        content.append({"token": token_text(tokenizer, tok), "logprob": lp,
                        "bytes": list(token_text(tokenizer, tok).encode()),
                        "top_logprobs": [{"token": token_text(tokenizer, t), "logprob": x,
                                          "bytes": list(token_text(tokenizer, t).encode())} for t, x in ranked]})
    return {"content": content}


def completion_object(rid: str, model: str, choices: list, usage_: Optional[dict], chunk: bool) -> dict:
    obj = {"id": rid, "object": "text_completion", "created": int(time.time()), "model": model, "choices": choices}
    if usage_ is not None or not chunk:
        obj["usage"] = usage_
    return obj


def chat_object(rid: str, model: str, choices: list, usage_: Optional[dict], chunk: bool) -> dict:
    obj = {"id": rid, "object": "chat.completion.chunk" if chunk else "chat.completion",
           "created": int(time.time()), "model": model, "choices": choices}
    if usage_ is not None or not chunk:
        obj["usage"] = usage_
    return obj


def prometheus(stats: dict, model: str) -> str:
    """The engine loop's counters (AsyncEngine.stats) as Prometheus text, under vLLM's metric names."""
    label = '{model_name="' + model.replace("\\", "\\\\").replace('"', '\\"') + '"}'
    rows = [("num_requests_running", "gauge", "requests in the running batch", stats["running"]),
            ("num_requests_waiting", "gauge", "requests waiting to be scheduled", stats["waiting"]),
            ("num_requests_swapped", "gauge", "requests swapped out to host memory", stats["swapped"]),
            ("kv_blocks_used", "gauge", "KV cache blocks in use", stats["num_blocks"] - stats["free_blocks"]),
            ("kv_blocks_total", "gauge", "KV cache blocks in the pool", stats["num_blocks"]),
            ("kv_cache_usage_perc", "gauge", "fraction of KV blocks in use",
             1 - stats["free_blocks"] / max(1, stats["num_blocks"])),
            ("generation_tokens_per_second", "gauge", "tokens generated per second, the last 10 s",
             stats["tokens_per_s"]),
            ("prompt_tokens_total", "counter", "prompt tokens of the requests queued", stats["prompt_tokens"]),
            ("generation_tokens_total", "counter", "tokens generated", stats["generation_tokens"]),
            ("request_success_total", "counter", "requests finished", stats["finished"] - stats["errors"]),
            ("request_failure_total", "counter", "requests that ended with an error", stats["errors"]),
            ("request_abort_total", "counter", "requests aborted (a client left, a step failed)", stats["aborted"])]
    out = []
    for name, kind, doc, value in rows:
        out += [f"# HELP minillm:{name} {doc}", f"# TYPE minillm:{name} {kind}", f"minillm:{name}{label} {value}"]
    return "\n".join(out) + "\n"


def sse(obj) -> str:
    """One server-sent event."""
    return f"data: {obj if isinstance(obj, str) else json.dumps(obj, ensure_ascii=False)}\n\n"
