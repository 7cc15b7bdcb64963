"""Hostile requests against a live server, while 20 clients stream: each must be refused quickly and by name, no
stream may stall, /health must keep answering, and the server must live on (the hostile-user issue's check).

    python -m minillm serve --model shakespeare --port 8000 &          # a separate process: its own GIL
    python -m minillm.serve.hostile --url http://127.0.0.1:8000

starts the streams (ignore_eos, long max_tokens: they run until the hostile requests are done, then hang up), polls
GET /health every 20 ms, sends each hostile request in turn and reports, as JSON: each request's status, the field
its error names and how long the refusal took; the longest gap between two chunks of any stream; the slowest
/health answer; whether every stream streamed and the server was still healthy afterwards. Without --url it
serves on a thread of this process (clients and server then share one interpreter, so times are longer).
"""
from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass

PROMPTS = ["ROMEO:", "JULIET:", "HAMLET:", "KING LEAR:", "OTHELLO:", "MACBETH:", "PORTIA:", "BRUTUS:", "FALSTAFF:",
           "PUCK:"]


def _deep(levels: int) -> dict:
    schema = {"type": "string"}
    for _ in range(levels):
        schema = {"type": "object", "properties": {"a": schema}, "required": ["a"]}
    return schema


# (name, extra JSON fields, or raw bytes for the body): each is a user's mistake or an attack, never a bug
CASES = [
    ("n", {"n": 1_000_000_000, "temperature": 1}),
    ("best_of", {"n": 2, "best_of": 20_000, "temperature": 1}),
    ("max_tokens", {"max_tokens": 1_000_000_000}),
    ("logprobs", {"logprobs": 1000}),
    ("prompt", {"prompt": "to be " * 600_000}),                                     # 3.6 MB, under the body limit
    ("body", b"x" * (17 * 2**20)),                                                  # above it: 413, unread
    ("body_chunked", 17 * 2**20),                                                   # no Content-Length: 413 at 4 MiB
    ("guided_minlength", {"guided_json": {"type": "string", "minLength": 500}, "max_tokens": 10}),
    ("guided_slow", {"guided_json": {"type": "string", "minLength": 500}, "max_tokens": 900}),
    ("guided_optional", {"guided_json": {"type": "object", "properties": {f"p{i}": {"type": "string"}
                                                                          for i in range(300)}}}),
    ("guided_deep", {"guided_json": _deep(30)}),
    ("regex_repeat", {"guided_regex": "[a-z]{0,60000}", "max_tokens": 900}),
    ("regex_nested", {"guided_regex": "(" * 150 + "a" + ")" * 150}),
]


@dataclass
class Refusal:
    name: str
    status: int
    param: str | None
    message: str
    ms: float


async def _stream(client, url: str, model: str, prompt: str, stop: asyncio.Event, gaps: list, counts: list):
    """One stream until stop is set: gaps gets (arrival time, seconds since the last chunk) per chunk."""
    body = {"model": model, "prompt": prompt, "max_tokens": 900, "ignore_eos": True, "temperature": 0,
            "stream": True}
    last, chunks = None, 0
    async with client.stream("POST", url + "/completions", json=body, timeout=120) as r:
        async for line in r.aiter_lines():
            if not line.startswith("data: "):
                continue
            now = time.monotonic()
            if last is not None:
                gaps.append((now, now - last))
            last, chunks = now, chunks + 1
            if stop.is_set():
                break                                                # hang up: the server aborts the request
    counts.append(chunks)


async def _health(client, root: str, stop: asyncio.Event, times: list):
    """GET /health every 20 ms until stop: times gets (answer time, seconds it took, status)."""
    while not stop.is_set():
        t0 = time.monotonic()
        r = await client.get(root + "/health", timeout=30)
        times.append((time.monotonic(), time.monotonic() - t0, r.status_code))
        await asyncio.sleep(0.02)


async def _chunks(n: int):
    """n bytes of a JSON-looking body, sent chunked (no Content-Length), a MiB at a time."""
    yield b'{"prompt": "'
    for _ in range(n // 2**20):
        yield b"x" * 2**20


def _worst(events: list, t0: float, t1: float) -> float:
    """The largest value among (time, value, ...) events that ended between t0 and t1 (0 if none)."""
    return max((e[1] for e in events if t0 <= e[0] <= t1), default=0.0)


async def run(url: str, model: str, clients: int = 20, warmup_s: float = 1.0) -> dict:
    """The whole check against the server at url (its /v1 base); see the module docstring."""
    import httpx
    root = url.removesuffix("/v1")
    bodies = [(name, body if isinstance(body, (bytes, int)) else    # encoded before the clock starts: a 3 MB
               json.dumps({"model": model, "prompt": "hi", "max_tokens": 4, **body}).encode())   # body takes time
              for name, body in CASES]
    stop, gaps, counts, health = asyncio.Event(), [], [], []
    limits = httpx.Limits(max_connections=clients + 8)
    async with httpx.AsyncClient(limits=limits) as client:
        streams = [asyncio.create_task(_stream(client, url, model, PROMPTS[i % len(PROMPTS)], stop, gaps, counts))
                   for i in range(clients)]
        poller = asyncio.create_task(_health(client, root, stop, health))
        await asyncio.sleep(warmup_s)                                # every stream under way
        refusals, windows = [], []
        for name, body in bodies:
            t0 = time.monotonic()
            r = await client.post(url + "/completions", content=_chunks(body) if isinstance(body, int) else body,
                                  timeout=120, headers={"content-type": "application/json"})
            t1 = time.monotonic()
            error = (r.json().get("error") or {}) if r.headers.get("content-type", "").startswith("application/json") \
                else {}
            refusals.append(Refusal(name, r.status_code, error.get("param"), str(error.get("message", ""))[:160],
                                    (t1 - t0) * 1e3))
            windows.append((t0, t1 + 0.1))                          # what a stall then shows just after
            await asyncio.sleep(0.2)                                 # the streams between two cases
        stop.set()
        await asyncio.gather(*streams, poller)
        after = await client.get(root + "/health", timeout=30)
    rows = [{**r.__dict__, "ms": round(r.ms, 1), "max_stream_gap_ms": round(_worst(gaps, *w) * 1e3, 1),
             "max_health_ms": round(_worst(health, *w) * 1e3, 1)} for r, w in zip(refusals, windows)]
    return {"refusals": rows, "streams": clients, "streams_that_streamed": sum(c > 1 for c in counts),
            "max_stream_gap_s": round(max(g for _, g in gaps), 3) if gaps else None,
            "max_health_s": round(max(t for _, t, _ in health), 3) if health else None,
            "health_not_ok": sum(code != 200 for *_, code in health),
            "healthy_after": after.status_code == 200}


def main(argv=None) -> int:
    import argparse
    import contextlib
    ap = argparse.ArgumentParser(prog="python -m minillm.serve.hostile")
    ap.add_argument("--url", default=None, help="a running server's base, e.g. http://127.0.0.1:8000 (default: "
                    "serve --model on a thread of this process)")
    ap.add_argument("--model", default="shakespeare")
    ap.add_argument("--clients", type=int, default=20)
    ap.add_argument("--json", action="store_true", help="(the report is always JSON; accepted for bench symmetry)")
    a = ap.parse_args(argv)
    with contextlib.ExitStack() as stack:
        if a.url:
            url = a.url.rstrip("/").removesuffix("/v1") + "/v1"
        else:
            from ..engine.llm import LLM
            from .server import BackgroundServer
            url = stack.enter_context(BackgroundServer(LLM(a.model), a.model)).url
        report = asyncio.run(run(url, a.model, a.clients))
    print(json.dumps(report, indent=1))
    ok = report["healthy_after"] and all(r["status"] in (400, 413) for r in report["refusals"])
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
