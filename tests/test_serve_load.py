"""Load: many concurrent streaming clients (the official openai client, AsyncOpenAI) against one server. Every
stream must equal its request run alone (greedy, text and token ids: no lost, duplicated or mixed-up token);
clients that leave mid-stream are aborted; no block is held once all are done. 20 clients here, 200 under -m slow.
Equality is exact because the default backend on a CPU (numba) is batch-invariant bit for bit (DESIGN rule 7).
Speed is reported, never asserted: `python -m minillm.serve.load --clients 200` prints TTFT and tokens/s."""
import asyncio
import time

import pytest

from minillm import LLM
from minillm.guided.processor import GuidedProcessor

pytest.importorskip("openai")
httpx = pytest.importorskip("httpx")
pytest.importorskip("fastapi")
from minillm.serve.load import references, run_load, sample_prompts  # noqa: E402
from minillm.serve.server import BackgroundServer  # noqa: E402

MAX_TOKENS = 16


def run(clients: int, leave_every: int, failing: int, monkeypatch):
    """clients streams, every leave_every-th leaving after 2 chunks, and `failing` of the others whose own logits
    processor raises (a guided pattern whose processor is made to fail): those end with an error event alone."""
    prompts = sample_prompts(clients)
    llm = LLM("shakespeare", max_num_seqs=256)
    assert llm.engine.backend == "numba"                       # batch-invariant: exact equality is the right test
    refs = references(llm, prompts, MAX_TOKENS)
    leave = {i: 2 for i in range(0, clients, leave_every)}     # these leave after 2 chunks of a 400-token answer
    guided = {"guided_regex": "[a-z ]+", "ignore_eos": False}
    fail = {i: guided for i in range(1, clients, clients // failing)[:failing] if i not in leave}

    def broken(self, *args):
        raise RuntimeError("injected failure")
    monkeypatch.setattr(GuidedProcessor, "__call__", broken)
    with BackgroundServer(llm, "shakespeare") as server:
        result = asyncio.run(run_load(server.url, "shakespeare", prompts, MAX_TOKENS, leave, extra=fail))
        deadline, stats = time.monotonic() + 20, None
        while time.monotonic() < deadline:
            stats = httpx.get(f"http://{server.host}:{server.port}/stats").json()
            if stats["requests"] == 0:
                break
            time.sleep(0.05)
        answer = httpx.post(server.url + "/completions", json={"model": "shakespeare", "prompt": prompts[0],
                                                               "max_tokens": MAX_TOKENS, "temperature": 0,
                                                               "ignore_eos": True}, timeout=30).json()
        assert answer["choices"][0]["text"] == refs[0][0]      # and the server still answers
    return result, refs, stats, leave, fail


def check(result, refs, stats, leave, fail, clients):
    assert result.wrong(refs, failing=fail) == [], "streams that differ from the same request run alone"
    assert all("injected failure" in result.records[i].error for i in fail)
    done = [r for r in result.records if not r.disconnected and r.error is None]
    assert len(done) == clients - len(leave) - len(fail) and all(r.finish_reason == "length" for r in done)
    assert all(len(r.token_ids) == MAX_TOKENS for r in done)
    assert stats["requests"] == 0 and stats["streams"] == 0
    assert stats["free_blocks"] == stats["num_blocks"], "blocks still held after every client is gone"
    assert stats["added"] == clients and stats["aborted"] == len(leave) and stats["finished"] == clients - len(leave)
    assert stats["errors"] == len(fail)
    print(result.summary())


def test_20_concurrent_streams_each_equal_their_request_run_alone(monkeypatch):
    result, refs, stats, leave, fail = run(20, leave_every=5, failing=1, monkeypatch=monkeypatch)
    check(result, refs, stats, leave, fail, 20)


@pytest.mark.slow
def test_200_concurrent_streams_each_equal_their_request_run_alone(monkeypatch):
    """200 clients, 20 leaving mid-stream, 5 failing requests (issue 36's goal)."""
    result, refs, stats, leave, fail = run(200, leave_every=10, failing=5, monkeypatch=monkeypatch)
    assert len(leave) == 20 and len(fail) == 5
    check(result, refs, stats, leave, fail, 200)
