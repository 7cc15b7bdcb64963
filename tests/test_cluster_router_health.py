"""Router health with real processes: two `minillm serve` replicas behind the router (round_robin, health checks
every 0.2 s), four clients sending completions in a loop. Replica 1 is killed (SIGKILL) mid-load: no request fails
(a failed forward is sent once more, to replica 0), from its first failure on nothing is routed to it, and GET /router
shows it down with why. Restarted on the same port, it is back up at the next health check and answers requests
again. Loopback only, bounded: about 40 short requests."""
import os
import subprocess
import sys
import threading
import time

import httpx

from minillm.cluster.http_router import BackgroundRouter

ROOT = os.path.join(os.path.dirname(__file__), "..")
BODY = {"model": "shakespeare", "prompt": "ROMEO.\n", "max_tokens": 16, "temperature": 0}


def free_port() -> int:
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_replica(port: int) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "minillm", "serve", "--model", "shakespeare", "--backend", "torch",
                             "--port", str(port)], cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)


def wait_for(what: str, ok, timeout_s: float = 120.0, proc=None):
    deadline = time.monotonic() + timeout_s
    while not ok():
        assert proc is None or proc.poll() is None, f"{what}: the replica exited with code {proc.returncode}"
        assert time.monotonic() < deadline, f"{what}: not within {timeout_s} s"
        time.sleep(0.05)


def answers(url: str) -> bool:
    try:
        return httpx.get(url + "/v1/models", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def test_a_replica_killed_mid_load_costs_no_request_and_rejoins_when_restarted():
    ports = [free_port(), free_port()]
    urls = [f"http://127.0.0.1:{p}" for p in ports]
    procs = [start_replica(p) for p in ports]
    try:
        for url, proc in zip(urls, procs):
            wait_for(f"{url} starts", lambda: answers(url), proc=proc)
        with BackgroundRouter(urls, "round_robin", health_interval_s=0.2) as r:
            base, results, stop = r.url.removesuffix("/v1"), [], threading.Event()

            def client():                                       # (sent at, status, replica that answered, text)
                with httpx.Client(timeout=60) as c:
                    while not stop.is_set():
                        t = time.monotonic()
                        a = c.post(r.url + "/completions", json=BODY)
                        text = a.json()["choices"][0]["text"] if a.status_code == 200 else a.text
                        results.append((t, a.status_code, a.headers.get("x-minillm-replica"), text))

            threads = [threading.Thread(target=client, daemon=True) for _ in range(4)]
            for t in threads:
                t.start()
            wait_for("both replicas answer", lambda: {"0", "1"} <= {x[2] for x in results}, 60)
            procs[1].kill()
            procs[1].wait()
            killed = time.monotonic()
            wait_for("the router takes replica 1 out", lambda: not r.router.up[1], 10)
            seen = len(r.router.decisions)                      # routing decisions made up to now
            wait_for("more requests are served", lambda: sum(x[0] > killed for x in results) >= 12, 60)
            stop.set()
            for t in threads:
                t.join(60)
            failed = [x for x in results if x[1] != 200]
            assert not failed, failed                           # goal: <= 1 per dead worker; a retry serves them
            assert all(x[2] == "0" for x in results if x[0] > killed)
            assert [i for i, _ in r.router.decisions[seen:]] == [0] * (len(r.router.decisions) - seen)
            stats = httpx.get(base + "/router").json()
            assert stats["state"] == ["up", "down"] and stats["why_down"][0] is None and stats["why_down"][1]
            assert stats["outstanding"] == [0, 0]

            procs[1] = start_replica(ports[1])                  # restarted on the same port: rejoins
            wait_for("replica 1 restarts", lambda: answers(urls[1]), proc=procs[1])
            wait_for("the router puts replica 1 back", lambda: r.router.up[1], 10)
            again = [httpx.post(r.url + "/completions", json=BODY, timeout=60) for _ in range(4)]
            assert [a.status_code for a in again] == [200] * 4
            assert {a.headers["x-minillm-replica"] for a in again} == {"0", "1"}
            texts = {x[3] for x in results} | {a.json()["choices"][0]["text"] for a in again}
            assert len(texts) == 1                              # greedy: the same text from either replica
            stats = httpx.get(base + "/router").json()
            assert stats["state"] == ["up", "up"] and stats["why_down"] == [None, None]
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()
