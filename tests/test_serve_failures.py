"""One failing request never ends the other streams (issue 36): 20 concurrent streams through the server, a failure
injected, every other stream equal to its request run alone, no block leaked, the server still answering.

- a request's own failure (its logits processor, its guided state's jump-forward): that request alone ends with an
  error event; the engine turns it into that request's error (minillm.core.verify, minillm.guided.processor);
- a failure no request explains (the model call itself): the requests in that step end with an error event, their
  blocks freed; the requests waiting beside them run on, and new requests are served.
"""
import concurrent.futures as cf
import json

import pytest

from minillm import LLM, SamplingParams
from minillm.guided.processor import GuidedProcessor

httpx = pytest.importorskip("httpx")
pytest.importorskip("fastapi")
from serve_helpers import wait_idle  # noqa: E402

from minillm.serve.server import BackgroundServer  # noqa: E402

MODEL = "shakespeare"
PROMPTS = [f"{name}:" for name in ("ROMEO", "JULIET", "HAMLET", "KING LEAR", "OTHELLO", "MACBETH", "PORTIA",
                                   "BRUTUS", "FALSTAFF", "PUCK")] * 2
MAX_TOKENS = 24
GUIDED = {"guided_regex": "[a-z]+( [a-z]+)*"}


@pytest.fixture(scope="module")
def llm():
    return LLM(MODEL, max_num_seqs=8)        # 20 streams: 8 run, the rest wait (the no-culprit failure's bystanders)


@pytest.fixture(scope="module")
def alone(llm):
    """Each stream's text run alone (greedy, so a batch must not change it)."""
    params = [SamplingParams(temperature=0, max_tokens=MAX_TOKENS, seed=i) for i in range(len(PROMPTS))]
    return [llm.generate(p, sp)[0].text for p, sp in zip(PROMPTS, params)]


@pytest.fixture(scope="module")
def server(llm, alone):
    with BackgroundServer(llm, MODEL) as s:
        yield s


def stream(server, body: dict) -> tuple[str, str]:
    """A streamed completion's text, and "ok" or the error event's message."""
    text = ""
    with httpx.stream("POST", server.url + "/completions", json={"model": MODEL, "stream": True, **body},
                      timeout=60) as r:
        if r.status_code != 200:                                   # refused before it streamed
            return text, json.loads(r.read())["error"]["message"]
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            event = json.loads(line[6:])
            if "error" in event:
                return text, event["error"]["message"]
            text += event["choices"][0]["text"]
    return text, "ok"


def run_streams(server, extra: list) -> list:
    """The 20 greedy streams and `extra` requests, all at once -> (text, status) for each, in that order."""
    bodies = [{"prompt": p, "max_tokens": MAX_TOKENS, "temperature": 0} for p in PROMPTS] + extra
    with cf.ThreadPoolExecutor(len(bodies)) as pool:
        return list(pool.map(lambda b: stream(server, b), bodies))


@pytest.mark.parametrize("where", ["__call__", "jump"])
def test_a_requests_own_failure_ends_it_alone(server, alone, monkeypatch, where):
    """GuidedProcessor.__call__ is the request's logits processor; .jump its jump-forward (a post-processor)."""
    def broken(self, *args):
        raise RuntimeError(f"injected {where} failure")
    monkeypatch.setattr(GuidedProcessor, where, broken)
    results = run_streams(server, [{"prompt": "ROMEO:", "max_tokens": 16, "temperature": 0, **GUIDED}])
    *others, (_, failed) = results
    assert f"injected {where} failure" in failed
    assert [t for t, _ in others] == alone and all(s == "ok" for _, s in others)   # 20 of 20, each as run alone
    after = wait_idle(server)
    assert after["free_blocks"] == after["num_blocks"] and after["streams"] == 0


@pytest.mark.parametrize("error", [RuntimeError("injected model failure"), KeyboardInterrupt("injected")])
def test_a_failure_no_request_explains_ends_that_steps_requests_only(server, llm, alone, error):
    """A model call that raises: its step's requests end with an error event, their blocks freed, the others run
    on. A KeyboardInterrupt or SystemExit raised by code in the step (the step thread gets no signals) once killed
    the loop task for good, and every stream and later request hung: it is a failed step like any other."""
    runner, real = llm.engine.runner, llm.engine.runner.run
    failed_step, seen = [], []

    def broken(batch, *args):
        seen.append(1)
        if not failed_step and len(llm.engine.requests) == len(PROMPTS) and len(seen) > 3:
            failed_step.extend(sorted({r.seq.request_id for r in batch.rows}))
            raise error
        return real(batch, *args)
    runner.run = broken
    try:
        results = run_streams(server, [])
    finally:
        runner.run = real
    errors = [i for i, (_, s) in enumerate(results) if s != "ok"]
    assert failed_step and 0 < len(errors) == len(failed_step) <= 8       # that step's rows, at most max_num_seqs
    assert all(type(error).__name__ in results[i][1] for i in errors)
    survivors = [i for i in range(len(PROMPTS)) if i not in errors]
    assert len(survivors) >= len(PROMPTS) - 8 and [results[i][0] for i in survivors] == [alone[i] for i in survivors]
    after = wait_idle(server)
    assert after["free_blocks"] == after["num_blocks"] and after["streams"] == 0
    assert httpx.get(server.url.removesuffix("/v1") + "/health").json() == {"status": "ok"}
    assert stream(server, {"prompt": PROMPTS[0], "max_tokens": MAX_TOKENS, "temperature": 0}) == (alone[0], "ok")


def test_an_adapter_that_fails_to_load_ends_its_request_alone(monkeypatch):
    """The third kind: a request's LoRA adapter raises while it is put in a slot (at admission, before any step):
    that request ends with an error event; the 20 base-model streams beside it equal their runs alone."""
    import minillm.lora.adapters as adapters
    llm = LLM(MODEL, max_num_seqs=8, enable_lora=True)
    params = SamplingParams(temperature=0, max_tokens=MAX_TOKENS)
    alone = [llm.generate(p, params)[0].text for p in PROMPTS]
    real = adapters.load_slot

    def broken(model, s, adapter):
        if adapter is not None and adapter.name == "comedies":
            raise RuntimeError("injected adapter failure")
        return real(model, s, adapter)
    monkeypatch.setattr(adapters, "load_slot", broken)
    with BackgroundServer(llm, MODEL, lora_modules={"comedy": "comedies"}) as server:
        results = run_streams(server, [{"model": "comedy", "prompt": "ROMEO:", "max_tokens": 16, "temperature": 0}])
        *others, (_, failed) = results
        assert "injected adapter failure" in failed and "'comedies' could not be loaded" in failed
        assert [t for t, _ in others] == alone and all(s == "ok" for _, s in others)
        after = wait_idle(server)
        assert after["free_blocks"] == after["num_blocks"] and after["streams"] == 0 and after["errors"] == 1


def test_a_loop_that_dies_ends_every_stream_and_health_says_so():
    """A bug in the loop itself (outside any step): no request may hang; /health is 503 naming it; new requests
    get a 503 at once."""
    llm = LLM(MODEL, max_num_seqs=8)
    engine = llm.engine
    with BackgroundServer(llm, MODEL) as server:
        real, seen = engine.pop_finished, []

        def broken():
            seen.append(1)
            if len(seen) == 5:
                raise RuntimeError("injected loop bug")
            return real()
        engine.pop_finished = broken
        results = run_streams(server, [])
        assert all("engine loop stopped" in s for _, s in results)      # every one told (or refused), none hung
        health = httpx.get(server.url.removesuffix("/v1") + "/health")
        assert health.status_code == 503 and "injected loop bug" in health.json()["reason"]
        r = httpx.post(server.url + "/completions", json={"model": MODEL, "prompt": "hi", "max_tokens": 2})
        assert r.status_code == 503 and "injected loop bug" in r.json()["error"]["message"]


@pytest.mark.parametrize("body, param, words", [
    ({"n": 1_000_000_000, "temperature": 1}, "n", "above this engine's max_n=128"),
    ({"n": 2, "best_of": 20_000, "temperature": 1}, "best_of", "SamplingParams.best_of=20000 is above"),
    ({"prompt": "to be " * 600_000}, "prompt", "bytes (>= "),                          # 3.6 MB: refused untokenized
])
def test_huge_requests_are_refused_before_anything_is_built(server, body, param, words):
    """N1: n=10^9 once built 10^9 sequences (22 GB) before any check; a 12 MB prompt was tokenized on the loop (a
    body over 4 MiB is now a 413, unread: test_a_body_above_the_limit_is_413_unread)."""
    r = httpx.post(server.url + "/completions", json={"model": MODEL, "prompt": "hi", "max_tokens": 4, **body},
                   timeout=30)
    assert r.status_code == 400 and r.json()["error"]["param"] == param and words in r.json()["error"]["message"]
    assert wait_idle(server)["requests"] == 0


def test_a_body_above_the_limit_is_413_unread(server):
    r = httpx.post(server.url + "/completions", content=b"x" * (5 * 2**20),
                   headers={"content-type": "application/json"}, timeout=30)
    error = r.json()["error"]
    assert r.status_code == 413 and "5242880 bytes, above this server's limit of 4194304" in error["message"]
    assert error["type"] == "invalid_request_error"                   # the client's to fix (OpenAI's 4xx type)


def test_a_chunked_body_is_cut_off_at_the_limit(server):
    """Without a Content-Length the body was read whole, however large: now the read stops where it passes 4 MiB."""
    def body():
        for _ in range(64):                      # 64 MiB offered
            yield b"x" * 2**20
    r = httpx.post(server.url + "/completions", content=body(), headers={"content-type": "application/json"},
                   timeout=30)
    assert r.status_code == 413 and "more than 4194304 bytes" in r.json()["error"]["message"]
    ok = httpx.post(server.url + "/completions", json={"model": MODEL, "prompt": "hi", "max_tokens": 2}, timeout=30)
    assert ok.status_code == 200


def test_the_engine_api_refuses_the_same_values(llm):
    with pytest.raises(ValueError, match=r"SamplingParams.n=1000000000 is above this engine's max_n=128"):
        llm.generate("hi", SamplingParams(n=1_000_000_000, temperature=1))
    assert LLM(MODEL, max_n=2).engine.config.max_n == 2
