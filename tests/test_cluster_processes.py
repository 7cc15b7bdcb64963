"""minillm.cluster for real: replicas, and a prefill and a decode engine, as separate processes on the wall clock.
Tokens are compared with one in-process engine (float64, DESIGN rule 7: batch composition cannot flip a token); the
handovers' bytes are counted on the receiving side and equal the formula; a worker's failure is raised here with
its message. No timing is asserted (transfer seconds are only checked to be measured)."""
import pytest
import torch

from minillm.cluster.processes import disagg_processes, replay_routed_processes
from minillm.config import EngineConfig
from minillm.core.sampling import SamplingParams
from minillm.engine.engine import LLMEngine
from minillm.formats.loader import load
from minillm.llama.kv_cache import KVCache
from minillm.workload import Request

OPTS = dict(backend="torch", dtype="float64", max_model_len=128, block_size=8, max_num_seqs=8)
TRACE = [Request(0.02 * i, [1] + [300 + (5 * i + j) % 150 for j in range(3 + 9 * i)], 8) for i in range(6)]


@pytest.fixture(scope="module")
def reference():
    """Each request's greedy tokens from one in-process engine."""
    net, tok = load("random:tiny", dtype="float64")
    e = LLMEngine.from_model(net, tok, EngineConfig(**OPTS))
    for i, r in enumerate(TRACE):
        e.add_request(r.prompt_ids, SamplingParams(temperature=0, max_tokens=r.max_tokens, ignore_eos=True),
                      request_id=str(i))
    done = {}
    while e.has_unfinished_requests():
        e.step()
        done.update((o.request_id, o.token_ids) for o in e.pop_finished())
    return done, net.config


def test_replica_processes_behind_the_router(reference):
    want, _ = reference
    # round robin: which replica gets a request does not depend on the wall clock (least loaded does: a request
    # that finished before the next arrived leaves both replicas at load 0, and the tie goes to replica 0)
    run = replay_routed_processes("random:tiny", None, TRACE, "round_robin", 2, **OPTS)
    assert {o.request_id: o.token_ids for o in run.outputs} == want
    assert run.router.routed == [3, 3] and run.router.load == [0, 0]
    assert all(b > 0 for b in run.busy_s)                       # both replicas ran steps


def test_prefill_and_decode_processes_hand_kv_over_a_pipe(reference):
    want, cfg = reference
    res = disagg_processes("random:tiny", None, TRACE, **OPTS)
    assert {o.request_id: o.token_ids for o in res["outputs"]} == want
    per_block = 8 * KVCache.bytes_per_token(cfg, torch.float64)
    got = {t["request_id"]: t for t in res["transfers"]}
    assert sorted(got) == [str(i) for i in range(6)]
    for i, r in enumerate(TRACE):
        t = got[str(i)]
        assert t["blocks"] == -(-len(r.prompt_ids) // 8) and t["bytes"] == t["blocks"] * per_block
        assert t["seconds"] > 0


def test_bad_options_are_refused_before_any_process_starts():
    with pytest.raises(ValueError, match="block_size must be a positive integer"):
        replay_routed_processes("random:tiny", None, TRACE[:1], "round_robin", 1, **dict(OPTS, block_size=0))
    with pytest.raises(ValueError, match="batching='sometimes' is not one of"):
        disagg_processes("random:tiny", None, TRACE[:1], **dict(OPTS, batching="sometimes"))
    with pytest.raises(ValueError, match="unknown routing policy"):
        replay_routed_processes("random:tiny", None, TRACE[:1], "nearest", 1, **OPTS)


def test_a_failing_worker_is_raised_with_its_message():
    with pytest.raises(RuntimeError, match="(?s)worker 0 failed.*unknown model 'no-such-model'"):
        replay_routed_processes("no-such-model", None, TRACE[:1], "round_robin", 1, **OPTS)
