"""`minillm router`: two `minillm serve` replicas behind the router, driven by the official openai client. Every
answer through the router equals LLM.generate's (greedy, one request at a time: nothing else in a replica's batch);
prefix_aware keeps each system prompt on one replica and gives the two prompts different replicas; a stream stays a
stream; a replica's own error passes through; an unreachable replica is taken out of rotation and its request served
by a live one; with none up the answer names each (a killed and restarted process: test_cluster_router_health.py)."""
import os
import signal
import socket
import subprocess
import sys
import time

import httpx
import pytest
from openai import OpenAI

from minillm import LLM, SamplingParams
from minillm.cluster.http_router import BackgroundRouter, check_workers, prompt_key
from minillm.serve.server import BackgroundServer

SYSTEMS = ["ROMEO.\nBut soft, what light through yonder window breaks?\n", "KING RICHARD.\nOld John of Gaunt, "
           "time-honoured Lancaster,\n"]
QUESTIONS = ["JULIET.\n", "NURSE.\n", "GAUNT.\n"]
CASES = [(k, SYSTEMS[k] + q) for q in QUESTIONS for k in (0, 1)]   # (system prompt, prompt), the two interleaved
PROMPTS = [p for _, p in CASES]
TOKENS = 12


@pytest.fixture(scope="module")
def replicas():
    ref = LLM("shakespeare", backend="torch")
    want = {p: ref.generate(p, SamplingParams(temperature=0, max_tokens=TOKENS))[0].outputs[0].text for p in PROMPTS}
    servers = [BackgroundServer(LLM("shakespeare", backend="torch"), model_name="shakespeare") for _ in range(2)]
    yield servers, want
    for s in servers:
        s.stop()


def free_port() -> int:
    with socket.socket() as s:                                  # a port nobody listens on (until it is reused)
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def settled(r, timeout_s: float = 5.0) -> list:
    """The router's outstanding requests once the last answer's end has been passed on (a client can read a
    stream's last event a moment before the router's relay finishes)."""
    deadline = time.monotonic() + timeout_s
    while any(r.router.load) and time.monotonic() < deadline:
        time.sleep(0.01)
    return r.router.load


def complete(url: str, prompt: str, **kw):
    return OpenAI(base_url=url, api_key="none").completions.create(model="shakespeare", prompt=prompt,
                                                                   max_tokens=TOKENS, temperature=0, **kw)


def test_prefix_aware_keeps_each_system_prompt_on_one_replica(replicas):
    servers, want = replicas
    with BackgroundRouter([s.url for s in servers], "prefix_aware") as r:
        for p in PROMPTS:
            assert complete(r.url, p).choices[0].text == want[p]
        where = {}
        for (k, _), (i, _) in zip(CASES, r.router.decisions):
            where.setdefault(k, set()).add(i)
        assert all(len(replicas_of) == 1 for replicas_of in where.values())       # a system prompt stays put
        assert where[0] != where[1]                                                # and the two are spread
        stats = httpx.get(r.url.removesuffix("/v1") + "/router").json()
        assert stats["policy"] == "prefix_aware" and stats["routed"] == [3, 3] and stats["outstanding"] == [0, 0]
        assert stats["decisions"] == {"smallest tree": 2, "cache hit": 4}


def test_round_robin_streams_through_the_router(replicas):
    servers, want = replicas
    with BackgroundRouter([s.url for s in servers], "round_robin") as r:
        for p in PROMPTS[:4]:
            chunks = list(complete(r.url, p, stream=True))
            assert len(chunks) > 1 and "".join(c.choices[0].text for c in chunks if c.choices) == want[p]
        assert r.router.routed == [2, 2] and settled(r) == [0, 0]


def test_a_replicas_error_passes_through_and_is_not_left_outstanding(replicas):
    servers, _ = replicas
    with BackgroundRouter([s.url for s in servers], "least_loaded") as r:
        answer = httpx.post(r.url + "/completions", json={"model": "shakespeare", "prompt": "ROMEO.",
                                                          "max_tokens": 4, "temperature": -1.0})
        assert answer.status_code == 400 and "temperature" in answer.json()["error"]["message"]
        bad = httpx.post(r.url + "/completions", content=b"[1, 2]", headers={"content-type": "application/json"})
        assert bad.status_code == 400 and "JSON object" in bad.json()["error"]["message"]
        assert settled(r) == [0, 0]


def test_an_unreachable_replica_is_taken_out_and_its_request_served_by_a_live_one(replicas):
    servers, want = replicas
    dead = f"http://127.0.0.1:{free_port()}"
    with BackgroundRouter([servers[0].url, dead], "round_robin", health_interval_s=0) as r:
        assert complete(r.url, PROMPTS[0]).choices[0].text == want[PROMPTS[0]]
        assert complete(r.url, PROMPTS[1]).choices[0].text == want[PROMPTS[1]]     # its turn: dead, sent on to 0
        assert complete(r.url, PROMPTS[2]).choices[0].text == want[PROMPTS[2]]
        stats = httpx.get(r.url.removesuffix("/v1") + "/router").json()
        assert stats["routed"] == [3, 1] and stats["state"] == ["up", "down"] and settled(r) == [0, 0]
        assert dead in stats["why_down"][1] and "cannot be reached" in stats["why_down"][1]


def test_with_every_replica_down_the_answer_is_a_503_naming_each():
    dead = [f"http://127.0.0.1:{free_port()}" for _ in range(2)]
    with BackgroundRouter(dead, "round_robin", health_interval_s=0) as r:
        first = httpx.post(r.url + "/completions", json={"model": "shakespeare", "prompt": "x", "max_tokens": 2})
        assert first.status_code == 502 and all(d in first.json()["error"]["message"] for d in dead)  # tried both
        then = httpx.post(r.url + "/completions", json={"model": "shakespeare", "prompt": "x", "max_tokens": 2})
        message = then.json()["error"]["message"]
        assert then.status_code == 503 and "no replica is up" in message and all(d in message for d in dead)
        assert r.router.routed == [1, 1] and settled(r) == [0, 0]


def test_what_the_router_routes_on():
    assert prompt_key("/v1/completions", {"prompt": "ab"}) == [97, 98]                # characters, as SGLang's
    assert prompt_key("/v1/completions", {"prompt": [1, 5, 9]}) == [1, 5, 9]          # token ids as given
    assert prompt_key("/v1/completions", {"prompt": ["ab", "cd"]}) == [97, 98]        # a batch: the first
    chat = prompt_key("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]})
    assert "".join(map(chr, chat)) == "user: hi\n"


@pytest.mark.parametrize("workers", [[], ["localhost:8000"], None])
def test_workers_must_be_urls(workers):
    with pytest.raises(ValueError, match="http"):
        check_workers(workers)
    assert check_workers(["http://a:1/v1/", "http://b:2"]) == ["http://a:1", "http://b:2"]


def test_serve_with_data_parallel_size_starts_the_replicas_and_the_router(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    root = os.path.join(os.path.dirname(__file__), "..")
    proc = subprocess.Popen([sys.executable, "-m", "minillm", "serve", "--model", "shakespeare", "--backend", "torch",
                             "--data-parallel-size", "2", "--router-policy", "round_robin", "--port", str(port)],
                            cwd=root, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            assert proc.poll() is None, proc.stdout.read()
            try:
                stats = httpx.get(url + "/router", timeout=2).json()
                break
            except httpx.HTTPError:
                assert time.monotonic() < deadline, "the router did not answer within 120 s"
                time.sleep(0.5)
        texts = [complete(url + "/v1", p).choices[0].text for p in PROMPTS[:2]]
        stats = httpx.get(url + "/router").json()
        assert stats["routed"] == [1, 1] and len(stats["workers"]) == 2 and all(texts)
    finally:
        proc.send_signal(signal.SIGINT)                        # Ctrl-C: the router stops, then its replicas
        proc.wait(timeout=60)
    for worker in stats["workers"]:                             # nothing left listening
        with pytest.raises(httpx.ConnectError):
            httpx.get(worker + "/v1/models", timeout=2)


def test_data_parallel_size_and_policy_are_checked_before_anything_starts():
    from minillm.cluster.http_router import serve_replicas
    with pytest.raises(ValueError, match="data-parallel-size"):
        serve_replicas([], 0, "round_robin", "127.0.0.1", 0)
    with pytest.raises(ValueError, match="routing policy"):
        serve_replicas([], 2, "fastest", "127.0.0.1", 0)


def test_evaluation_requests_pass_through_the_router(replicas):
    """An evaluation harness behind the router: echo scoring and the tokenizer endpoints answer as one server."""
    servers, _ = replicas
    with BackgroundRouter([s.url for s in servers], "round_robin") as r:
        base = r.url.removesuffix("/v1")
        info = httpx.get(base + "/tokenizer_info").json()
        ids = httpx.post(base + "/tokenize", json={"prompt": PROMPTS[0], "add_special_tokens": False}).json()["tokens"]
        assert info["eos_token"] == "</s>" and httpx.get(base + "/health").json() == {"status": "ok"}
        assert httpx.post(base + "/detokenize", json={"tokens": ids}).json()["prompt"] == PROMPTS[0]
        body = {"model": "shakespeare", "prompt": ids, "echo": True, "logprobs": 1, "max_tokens": 0}
        scored = [httpx.post(r.url + "/completions", json=body).json()["choices"][0]["logprobs"]["token_logprobs"]
                  for _ in range(2)]                              # once on each replica: the same numbers
        assert scored[0][0] is None and scored[0] == scored[1] and len(scored[0]) == len(ids)
        assert settled(r) == [0, 0]
