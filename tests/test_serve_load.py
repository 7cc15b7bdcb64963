"""Load: many concurrent streaming clients (the official openai client, AsyncOpenAI) against one server. Every
stream must equal its request run alone (greedy, text and token ids: no lost, duplicated or mixed-up token);
clients that leave mid-stream are aborted; no block is held once all are done. 20 clients here, 200 under -m slow.
Equality is exact because the default backend on a CPU (numba) is batch-invariant bit for bit (DESIGN rule 7).
Speed is reported, never asserted: `python -m minillm.serve.load --clients 200` prints TTFT and tokens/s."""
import asyncio
import time

import pytest

from minillm import LLM

pytest.importorskip("openai")
httpx = pytest.importorskip("httpx")
pytest.importorskip("fastapi")
from minillm.serve.load import references, run_load, sample_prompts  # noqa: E402
from minillm.serve.server import BackgroundServer  # noqa: E402

MAX_TOKENS = 16


def run(clients: int, leave_every: int):
    prompts = sample_prompts(clients)
    llm = LLM("shakespeare", max_num_seqs=256)
    assert llm.engine.backend == "numba"                       # batch-invariant: exact equality is the right test
    refs = references(llm, prompts, MAX_TOKENS)
    leave = {i: 2 for i in range(0, clients, leave_every)}     # these leave after 2 chunks of a 400-token answer
    with BackgroundServer(llm, "shakespeare") as server:
        result = asyncio.run(run_load(server.url, "shakespeare", prompts, MAX_TOKENS, leave))
        deadline, stats = time.monotonic() + 20, None
        while time.monotonic() < deadline:
            stats = httpx.get(f"http://{server.host}:{server.port}/stats").json()
            if stats["requests"] == 0:
                break
            time.sleep(0.05)
    return result, refs, stats, leave


def check(result, refs, stats, leave, clients):
    assert result.wrong(refs) == [], "streams that differ from the same request run alone"
    done = [r for r in result.records if not r.disconnected]
    assert len(done) == clients - len(leave) and all(r.finish_reason == "length" for r in done)
    assert all(len(r.token_ids) == MAX_TOKENS for r in done)
    assert stats["requests"] == 0 and stats["streams"] == 0
    assert stats["free_blocks"] == stats["num_blocks"], "blocks still held after every client is gone"
    assert stats["added"] == clients and stats["aborted"] == len(leave) and stats["finished"] == clients - len(leave)
    print(result.summary())


def test_20_concurrent_streams_each_equal_their_request_run_alone():
    result, refs, stats, leave = run(20, leave_every=5)
    check(result, refs, stats, leave, 20)


@pytest.mark.slow
def test_200_concurrent_streams_each_equal_their_request_run_alone():
    result, refs, stats, leave = run(200, leave_every=10)
    check(result, refs, stats, leave, 200)
