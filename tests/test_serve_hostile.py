"""Hostile requests while 20 clients stream (the hostile-user issue, N1 and N2): each is refused by name, no stream
stalls, /health keeps answering, the server lives on and holds no block afterwards. minillm.serve.hostile runs the
check (also against a separate `minillm serve` process, where its times are the server's own: see the README).

Times asserted here are ceilings two orders of magnitude above what a refusal takes, set to catch a stall of the
kind fixed (a 20 s guided compile on the event loop froze every stream; a 12 MB prompt tokenized there), not to
measure speed: the clients share this process's interpreter with the server.
"""
import asyncio
import socket

import pytest

pytest.importorskip("httpx")
pytest.importorskip("fastapi")
from serve_helpers import wait_idle  # noqa: E402

from minillm import LLM  # noqa: E402
from minillm.serve import hostile  # noqa: E402
from minillm.serve.server import BackgroundServer, bind  # noqa: E402

MODEL = "shakespeare"
PARAM = {"n": "n", "best_of": "best_of", "max_tokens": "max_tokens", "logprobs": "logprobs", "prompt": "prompt",
         "body": None, "body_chunked": None, "guided_minlength": "guided_json", "guided_slow": "guided_json",
         "guided_optional": "guided_json", "guided_deep": "guided_json", "regex_repeat": "guided_regex",
         "regex_nested": "guided_regex"}


@pytest.fixture(scope="module")
def report():
    llm = LLM(MODEL, guided_compile_timeout_s=1.0)
    with BackgroundServer(llm, MODEL) as server:
        result = asyncio.run(hostile.run(server.url, MODEL, clients=20))
        result["idle"] = wait_idle(server)
    return result


def test_every_hostile_request_is_refused_by_name(report):
    got = {r["name"]: (r["status"], r["param"]) for r in report["refusals"]}
    assert got == {name: (413 if name.startswith("body") else 400, param) for name, param in PARAM.items()}
    slow = next(r for r in report["refusals"] if r["name"] == "guided_slow")
    assert "budget of 1 s" in slow["message"] or "pattern too large" in slow["message"]
    slow_ones = ("guided_slow", "regex_repeat", "body", "body_chunked")
    fast = [r for r in report["refusals"] if r["name"] not in slow_ones]
    assert max(r["ms"] for r in fast) < 1000, fast                  # no compile, no tokenizing: no wait at all


def test_no_stream_stalls_and_the_server_lives_on(report):
    assert report["streams_that_streamed"] == 20
    assert report["max_stream_gap_s"] < 1.0, report["refusals"]
    assert report["max_health_s"] < 1.0 and report["health_not_ok"] == 0
    assert report["healthy_after"]
    idle = report["idle"]
    assert idle["requests"] == 0 and idle["free_blocks"] == idle["num_blocks"]


def test_the_listening_socket_turns_nagle_off():
    """asyncio sets TCP_NODELAY only on sockets whose proto is IPPROTO_TCP (accepted ones inherit the listener's);
    bound with proto 0, every answer waited 40 ms for the client's delayed ACK (44 ms per /health)."""
    async def main():
        seen = []

        def serve(reader, writer):
            seen.append(writer.get_extra_info("socket").getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))
            writer.close()
        server = await asyncio.start_server(serve, sock=bind("127.0.0.1", 0))
        port = server.sockets[0].getsockname()[1]
        _, writer = await asyncio.open_connection("127.0.0.1", port)
        for _ in range(100):
            if seen:
                break
            await asyncio.sleep(0.01)
        writer.close()
        server.close()
        return seen
    assert asyncio.run(main()) == [1]
