"""The router as a server: `python -m minillm router --worker URL --worker URL ...` in front of `minillm serve`
replicas (data parallelism over HTTP, the shape of SGLang's sgl-router and vLLM's data-parallel front end).

    client ──POST /v1/completions──> router: Router.route(the prompt) -> replica i ──> the same request, unchanged,
           <──── the replica's answer (JSON, or its server-sent events as they come) ─────  to replica i's server

The router speaks the replicas' own OpenAI API, so a client cannot tell it from one server. It decides with
minillm.cluster.router.Router (round_robin, least_loaded, prefix_aware) and forwards the request's bytes; the answer's
bytes come back as the replica sends them (a stream stays a stream). A request counts as outstanding on its replica
from routing until its answer has been passed on (or the client went away). As SGLang's router, it routes on the
prompt's TEXT: its prefix trees hold characters (token ids for a prompt given as ids), so it needs no tokenizer; a
chat's messages are routed as the text of their roles and contents. It never asks a replica what its cache holds.

GET /router says how it routed: the policy, each worker's URL and state (up or down, with why), requests routed and
outstanding, and the count of each decision.

Health (as sgl-router's): a worker is taken out of rotation when a forward to it fails (it cannot be reached, the
connection drops before its answer, or it answers 503: its engine is down) and when its GET /health does not answer
200; the router asks every worker's /health each health_interval_s and puts one that answers again back. A request
whose forward failed that way is sent once more, to a live worker (a completion has no side effects; a stream is
retried only before its first byte was passed on), so a replica that dies costs its clients at most the streams it
was in the middle of. With no worker up, the answer is 503, naming each worker and why it is down.
"""
from __future__ import annotations

import asyncio
import time
from contextlib import asynccontextmanager
from typing import Optional

import httpx  # the serve extra (fastapi, uvicorn, httpx): only this module needs it
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from ..serve.server import BackgroundApp
from .router import CacheAware, NoLiveReplica, Router, check_policy

FORWARDED = ("/v1/completions", "/v1/chat/completions", "/tokenize", "/detokenize")
FIRST_REPLICA = ("/v1/models", "/tokenizer_info")   # the same answer from every replica: asked of the first


def prompt_key(path: str, body: dict) -> list:
    """What the router routes on: the prompt as characters (code points), or as the token ids it was given. A batch
    of prompts goes by its first; a chat by its messages' roles and contents."""
    if path.endswith("/chat/completions"):
        msgs = body.get("messages") or []
        text = "".join(f"{m.get('role', '')}: {m.get('content', '')}\n" for m in msgs if isinstance(m, dict))
        return [ord(c) for c in text]
    prompt = body.get("prompt", "")
    if isinstance(prompt, list) and prompt and not isinstance(prompt[0], int):
        prompt = prompt[0]                                       # a batch: the first prompt decides
    if isinstance(prompt, list):
        return [int(t) for t in prompt if isinstance(t, int)]
    return [ord(c) for c in str(prompt)]


def check_workers(workers) -> list:
    urls = [str(w).rstrip("/") for w in (workers or [])]
    if not urls or any(not u.startswith(("http://", "https://")) for u in urls):
        raise ValueError(f"workers must be one or more http(s):// URLs of `minillm serve` replicas, got {workers!r}")
    return [u[:-3] if u.endswith("/v1") else u for u in urls]


def error(message: str, kind: str, code: int) -> JSONResponse:
    return JSONResponse({"error": {"message": message, "type": kind, "param": None, "code": code}}, status_code=code)


def build_router_app(workers: list, policy: str = "prefix_aware", cache_aware: Optional[CacheAware] = None,
                     timeout_s: float = 600.0, health_interval_s: float = 10.0, health_timeout_s: float = 5.0):
    """The router's FastAPI app. workers: the replicas' base URLs (http://host:port, with or without /v1);
    health_interval_s: seconds between health checks of every worker (0: none, only failed forwards take one out)."""
    urls = check_workers(workers)
    if isinstance(health_interval_s, bool) or not isinstance(health_interval_s, (int, float)) \
            or not health_interval_s >= 0:
        raise ValueError(f"health_interval_s must be a number of seconds >= 0 (0: no health checks), "
                         f"got {health_interval_s!r}")
    router = Router(policy, len(urls), cache_aware)             # used by the event loop only: no lock
    why_down: list = [None] * len(urls)                         # per worker: why it is out of rotation

    def mark(i: int, reason: Optional[str]):
        """reason None: worker i answers (back in rotation); else it is taken out, for this reason."""
        why_down[i] = reason
        router.set_up(i, reason is None)

    async def probe(i: int):
        try:
            answer = await client().get(urls[i] + "/health", timeout=health_timeout_s)
            mark(i, None if answer.status_code == 200 else f"GET /health answered {answer.status_code}")
        except httpx.HTTPError as e:
            mark(i, f"GET /health failed ({type(e).__name__}: {e})")

    async def watch():
        while True:
            await asyncio.sleep(health_interval_s)
            await asyncio.gather(*(probe(i) for i in range(len(urls))), return_exceptions=True)

    @asynccontextmanager
    async def lifespan(app):
        task = asyncio.create_task(watch()) if health_interval_s else None
        yield
        if task is not None:
            task.cancel()
        if app.state.client is not None:
            await app.state.client.aclose()

    app = FastAPI(title="minillm router", lifespan=lifespan)
    app.state.router, app.state.client = router, None

    def client() -> httpx.AsyncClient:
        if app.state.client is None:
            app.state.client = httpx.AsyncClient(timeout=httpx.Timeout(timeout_s, connect=10.0))
        return app.state.client

    def none_up():
        down = "; ".join(f"replica {i} at {u}: {why_down[i]}" for i, u in enumerate(urls))
        return error(f"no replica is up ({down})", "service_unavailable", 503)

    async def attempt(i: int, path: str, raw: bytes, stream: bool):
        """Forward to replica i. -> a response to pass on, or the reason the forward failed (i is taken out)."""
        req = client().build_request("POST", urls[i] + path, content=raw, headers={"content-type": "application/json"})
        try:
            answer = await client().send(req, stream=True)
        except httpx.HTTPError as e:
            router.done(i)
            return f"replica {i} at {urls[i]} cannot be reached ({type(e).__name__}: {e})"
        headers = {"x-minillm-replica": str(i)}
        kind = answer.headers.get("content-type", "application/json")
        if answer.status_code == 503:                            # its engine is down (EngineDown): not this request's
            await answer.aclose()
            router.done(i)
            return f"replica {i} at {urls[i]} answered 503: its engine is down"
        if stream:
            async def relay():                                   # the replica's events, as they come
                try:
                    async for chunk in answer.aiter_raw():
                        yield chunk
                except httpx.HTTPError as e:                     # it died mid-stream: this stream ends here
                    mark(i, f"its stream broke ({type(e).__name__}: {e})")
                finally:                                         # also when the client went away: the replica's
                    await answer.aclose()                        # connection closes, which aborts the request there
                    router.done(i)
            return StreamingResponse(relay(), status_code=answer.status_code, media_type=kind, headers=headers)
        try:
            content = await answer.aread()
        except httpx.HTTPError as e:
            return f"replica {i} at {urls[i]} dropped the answer ({type(e).__name__}: {e})"
        finally:
            await answer.aclose()
            router.done(i)
        return Response(content, status_code=answer.status_code, media_type=kind, headers=headers)

    async def forward(request: Request):
        raw = await request.body()
        try:
            body = await request.json()
        except ValueError:
            body = None
        if not isinstance(body, dict):
            return error("the request body must be a JSON object", "invalid_request_error", 400)
        failed = []
        for _ in range(2):                                       # a failed forward is sent once more, elsewhere
            try:
                i = router.route(prompt_key(request.url.path, body))
            except NoLiveReplica:
                return none_up()
            out = await attempt(i, request.url.path, raw, bool(body.get("stream")))
            if not isinstance(out, str):
                return out
            failed.append(out)
            mark(i, out)
        return error("; ".join(failed), "bad_gateway", 502)

    for path in FORWARDED:
        app.post(path)(forward)

    async def first_replica(request: Request):
        live = [i for i, u in enumerate(router.up) if u] or [0]
        try:
            answer = await client().get(urls[live[0]] + request.url.path)
        except httpx.HTTPError as e:
            mark(live[0], f"cannot be reached ({type(e).__name__}: {e})")
            return error(f"replica {live[0]} at {urls[live[0]]} cannot be reached ({type(e).__name__}: {e})",
                         "bad_gateway", 502)
        return Response(answer.content, status_code=answer.status_code, media_type="application/json")

    for path in FIRST_REPLICA:
        app.get(path)(first_replica)

    @app.get("/health")
    async def health():
        return {"status": "ok"}

    @app.get("/router")
    async def stats():
        return {**router.summary(), "workers": urls, "outstanding": list(router.load), "why_down": list(why_down)}

    return app


class BackgroundRouter(BackgroundApp):
    """The router on a thread of this process (tests, notebooks): `with BackgroundRouter([s.url, t.url]) as r:
    OpenAI(base_url=r.url, ...)`; r.router is its Router (routed, load, decisions)."""

    def __init__(self, workers: list, policy: str = "prefix_aware", host: str = "127.0.0.1", port: int = 0,
                 cache_aware: Optional[CacheAware] = None, timeout_s: float = 30.0, health_interval_s: float = 10.0):
        app = build_router_app(workers, policy, cache_aware, health_interval_s=health_interval_s)
        self.router = app.state.router
        super().__init__(app, host, port, timeout_s, "router")


def _run(sock, host: str, urls: list, policy: str, cache_aware: Optional[CacheAware] = None,
         health_interval_s: float = 10.0):
    """The router in the foreground on an already bound socket, until Ctrl-C."""
    from ..serve.server import _server
    print(f"minillm router ({policy}) at http://{host}:{sock.getsockname()[1]}/v1 in front of {len(urls)} "
          f"replicas: {', '.join(urls)} (GET /router: how it routed; Ctrl-C stops)", flush=True)
    app = build_router_app(urls, policy, cache_aware, health_interval_s=health_interval_s)
    _server(app, log_level="info").run(sockets=[sock])


def _without(argv: list, flags: tuple) -> list:
    """argv without these flags and their values (--flag V or --flag=V)."""
    out, skip = [], False
    for x in argv:
        if skip:
            skip = False
        elif x in flags:
            skip = True
        elif not x.startswith(tuple(f + "=" for f in flags)):
            out.append(x)
    return out


def serve_replicas(argv: list, n: int, policy: str, host: str, port: int, start_timeout_s: float = 300.0) -> int:
    """`python -m minillm serve --data-parallel-size N ...`: N `minillm serve` processes with the same flags on free
    ports of this machine, then the router on host:port in the foreground; Ctrl-C stops them all."""
    import subprocess
    import sys

    from ..serve.server import bind
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"--data-parallel-size must be an integer >= 1, got {n!r}")
    check_policy(policy)
    sock = bind(host, port)                                     # the router's port: taken or not, known now
    ports = []
    for _ in range(n):
        with bind("127.0.0.1", 0) as s:
            ports.append(s.getsockname()[1])
    base = _without(argv, ("--data-parallel-size", "--router-policy", "--port", "--host"))
    procs = [subprocess.Popen([sys.executable, "-m", "minillm", "serve", *base, "--host", "127.0.0.1",
                               "--port", str(p)]) for p in ports]
    urls = [f"http://127.0.0.1:{p}" for p in ports]
    try:
        deadline = time.monotonic() + start_timeout_s
        for i, (proc, url) in enumerate(zip(procs, urls)):
            while True:
                if proc.poll() is not None:
                    raise ValueError(f"replica {i} (`minillm serve` on {url}) exited with code {proc.returncode} "
                                     "before it served: its error is printed above")
                try:
                    httpx.get(url + "/v1/models", timeout=2.0).raise_for_status()
                    break
                except httpx.HTTPError:
                    if time.monotonic() > deadline:
                        raise ValueError(f"replica {i} on {url} did not answer within {start_timeout_s:.0f} s")
                    time.sleep(0.2)
        _run(sock, host, urls, policy)
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
        sock.close()
    return 0


def main(argv: list) -> int:
    """`python -m minillm router --worker URL ... [--policy P] [--port N]`: serve the router in the foreground."""
    import argparse

    from ..serve.server import bind
    from .router import ROUTING_POLICIES
    ap = argparse.ArgumentParser(prog="python -m minillm router", description="one OpenAI-compatible server in "
                                 "front of `minillm serve` replicas: each request goes to the replica the policy picks")
    ap.add_argument("--worker", action="append", required=True, help="a replica's URL (repeat: one per replica), "
                                                                       "e.g. http://127.0.0.1:8001")
    ap.add_argument("--policy", default="prefix_aware", choices=ROUTING_POLICIES)
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8000)
    ap.add_argument("--cache-threshold", type=float, default=CacheAware.cache_threshold)
    ap.add_argument("--health-interval", type=float, default=10.0, help="seconds between GET /health of every "
                    "worker: one that fails is taken out of rotation, one that answers again is put back (0: never)")
    a = ap.parse_args(argv)
    if not a.health_interval >= 0:
        raise SystemExit(f"--health-interval must be >= 0 seconds, got {a.health_interval}")
    urls = check_workers(a.worker)
    for u in urls:                                              # every replica answers before the router starts
        try:
            httpx.get(u + "/v1/models", timeout=10.0).raise_for_status()
        except httpx.HTTPError as e:
            raise SystemExit(f"replica {u} does not answer GET /v1/models ({type(e).__name__}: {e}): start it "
                             f"with `python -m minillm serve --model M --port N` first")
    _run(bind(a.host, a.port), a.host, urls, a.policy, CacheAware(cache_threshold=a.cache_threshold),
         a.health_interval)
    return 0
