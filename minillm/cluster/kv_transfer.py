"""Handing a sequence from one engine to another with its KV cache: what prefill/decode disaggregation moves.

When a prefill engine has run a prompt and sampled the first token, the sequence's state is its tokens, its
sampling state (generator, detokenized text, logprobs) and its K/V: for every layer, K and V at every computed
position, which live in the sequence's blocks of the pool (DESIGN.md's layout: per layer (num_blocks, block_size,
Hkv, D)). export_sequence gathers exactly those blocks, so the bytes handed over are

    blocks x block bytes,   block bytes = 2 (K, V) x n_layers x block_size x Hkv x D x bytes per element
                            (+ the per-token-and-head float32 scales of an int8 pool)

and frees them in the prefill engine (a block holding a named prefix stays cached there). import_sequence takes
fresh blocks in the decode engine's own pool (different block ids: only the contents travel), writes them, and
puts the sequence straight into its running set: the next step decodes it. This is what DistServe (Zhong et al.
2024) and Splitwise (Patel et al. 2024) transfer between instances, and what vLLM's KV connectors and Mooncake's
transfer engine move (there over NVLink / RDMA, here by a copy in one process or a pipe between two).

    h = export_sequence(prefill_engine, seq)       # KVHandover: the state + (L, n, block_size, Hkv, D) tensors
    seq = import_sequence(decode_engine, h)        # None if its pool (or its seats) has no room yet: retry later
    send_handover(conn, h); h = recv_handover(conn)    # the same over a multiprocessing pipe, as raw bytes
"""
from __future__ import annotations

import hashlib
import pickle
import time
from dataclasses import dataclass, field, replace
from typing import Optional

import torch

from ..core.request import Request
from ..core.sampling import SamplingParams
from ..core.sequence import RequestMetrics, Sequence, Status
from ..kernels import cdiv
from ..llama.kv_cache import KVCache


@dataclass
class KVHandover:
    request_id: str
    prompt: Optional[str]              # the prompt text, when it was text
    prompt_ids: list
    output_ids: list                   # the first token (more if a guided pattern forced some)
    params: SamplingParams
    num_computed: int                  # positions whose K/V are in kv (the newest token's is not yet computed)
    kv: list                           # per pool tensor (K, V [, K scale, V scale]): (L, n_blocks, block_size, ...)
    generator_state: torch.Tensor      # the sequence's sampling generator, as it stands after the first token
    metrics: RequestMetrics            # arrival, first token time ... (the decode engine appends to token_times)
    text: str = ""
    text_bytes: bytes = b""
    logprobs: list = field(default_factory=list)
    cumulative_logprob: float = 0.0
    prompt_logprobs: Optional[list] = None
    priority: int = 0
    client: object = None
    sent_at: float = 0.0               # the prefill engine's clock when it let go of the sequence
    copy_s: float = 0.0                # wall seconds gathering the blocks (+ writing them, once imported)

    @property
    def num_blocks(self) -> int:
        return self.kv[0].shape[1]

    @property
    def nbytes(self) -> int:
        """Bytes of K/V handed over (counted from the tensors)."""
        return sum(t.numel() * t.element_size() for t in self.kv)


def block_bytes(engine) -> int:
    """Bytes of one block of the engine's pool, every layer, K and V (and scales): the formula, from the model."""
    cfg, kv = engine.model.config, engine.kv
    return kv.block_size * KVCache.bytes_per_token(cfg, torch.int8 if kv.quantized else kv.k.dtype)


def weights_fingerprint(model) -> str:
    """SHA-256 of every parameter and buffer's bytes: two engines run the same model only if these agree."""
    h = hashlib.sha256()
    for name, t in sorted(model.state_dict().items()):
        h.update(name.encode())
        h.update(t.detach().cpu().contiguous().view(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def check_compatible(prefill, decode):
    """A decode engine can take the prefill engine's blocks only with the same model (shapes and weights), the same
    block size and the same KV dtype; anything else is a ValueError naming both values."""
    pc, dc = prefill.model.config, decode.model.config
    if pc != dc:
        diff = {k: (getattr(pc, k), getattr(dc, k)) for k in vars(pc) if getattr(pc, k) != getattr(dc, k)}
        raise ValueError(f"the decode engine's model differs from the prefill engine's: {diff} (prefill, decode); "
                         f"handed-over K/V is only meaningful to the model that computed it")
    if prefill.config.block_size != decode.config.block_size:
        raise ValueError(f"the decode engine's block_size={decode.config.block_size} differs from the prefill "
                         f"engine's block_size={prefill.config.block_size}: blocks are handed over whole, so both "
                         f"pools need one block size")
    pk, dk = (prefill.kv.k.dtype, prefill.kv.quantized), (decode.kv.k.dtype, decode.kv.quantized)
    if pk != dk:
        raise ValueError(f"the decode engine's KV dtype {dk[0]} differs from the prefill engine's {pk[0]} "
                         f"(kv_cache_dtype / dtype): the blocks' bytes would be misread")
    if prefill.model is not decode.model and weights_fingerprint(prefill.model) != weights_fingerprint(decode.model):
        raise ValueError("the decode engine's model has the same shapes as the prefill engine's but different "
                         "weights (a different checkpoint, seed or quantization): its K/V would not match")


def export_sequence(engine, seq: Sequence) -> KVHandover:
    """Take a running sequence (prompt computed, first token sampled) out of `engine`: its computed blocks' K/V,
    every layer, copied out; its blocks freed; its request dropped from the engine's bookkeeping."""
    bs, n = engine.kv.block_size, seq.num_computed
    blocks = seq.block_table[:cdiv(n, bs)]
    t0 = time.perf_counter()
    index = torch.tensor(blocks, dtype=torch.long)
    kv = [t.index_select(1, index.to(t.device)) for t in engine.kv.tensors()]   # (L, n_blocks, block_size, ...)
    copy_s = time.perf_counter() - t0
    request = engine.requests.pop(seq.request_id)
    engine.scheduler.running.remove(seq)
    engine.block_manager.free_seq(seq)               # named prefix blocks stay in the prefill engine's cache
    seq.status = Status.FINISHED
    m = seq.metrics
    metrics = replace(m, token_times=list(m.token_times))
    return KVHandover(seq.request_id, request.prompt, list(seq.prompt_ids), list(seq.output_ids), seq.params, n, kv,
                      seq.generator.get_state(), metrics, seq.text, seq.text_bytes, list(seq.logprobs),
                      seq.cumulative_logprob, seq.prompt_logprobs, seq.priority, seq.client, engine.clock(), copy_s)


def import_sequence(engine, h: KVHandover) -> Optional[Sequence]:
    """Put a handed-over sequence into `engine`'s running set with its K/V in fresh blocks of its pool. None when
    the pool lacks blocks for its tokens plus the next one, or every seat (max_num_seqs) is taken: nothing changed,
    try again after a step."""
    bm, sched = engine.block_manager, engine.scheduler
    seq = Sequence(next(engine._seq_ids), h.request_id, 0, h.prompt_ids, h.params, 0, h.metrics.arrival_time)
    seq.output_ids = list(h.output_ids)
    if len(sched.running) >= engine.config.max_num_seqs or not bm.can_allocate(seq, len(seq)):
        return None
    t0 = time.perf_counter()
    bm.allocate(seq, h.num_computed)
    index = torch.tensor(seq.block_table, dtype=torch.long)
    for pool, part in zip(engine.kv.tensors(), h.kv):
        pool.index_copy_(1, index.to(pool.device), part.to(pool.device))           # (L, n_blocks, block_size, ...)
    h.copy_s += time.perf_counter() - t0
    seq.generator.set_state(h.generator_state)
    seq.metrics = replace(h.metrics, token_times=list(h.metrics.token_times))
    seq.text, seq.text_bytes, seq.logprobs = h.text, h.text_bytes, list(h.logprobs)
    seq.cumulative_logprob, seq.prompt_logprobs = h.cumulative_logprob, h.prompt_logprobs
    seq.priority, seq.client = h.priority, h.client
    seq.num_computed, seq.status = h.num_computed, Status.RUNNING
    bm.mark_computed(seq)                            # with prefix caching, its full blocks become reusable here too
    request = Request(h.request_id, h.prompt, list(h.prompt_ids), h.params, h.metrics.arrival_time, [seq])
    engine.requests[h.request_id] = request
    engine.use_steps(request)                        # logprobs or a guided pattern go on in this engine
    sched.running.append(seq)
    return seq


# ---------------------------------------------------------------------------- over a pipe, as raw bytes
def send_handover(conn, h: KVHandover) -> int:
    """Send h over a multiprocessing Connection: a small pickled header, then each K/V tensor's raw bytes (no
    pickling of the tensors, no shared memory: the bytes really cross). -> K/V bytes sent."""
    header = replace(h, kv=[(str(t.dtype).removeprefix("torch."), tuple(t.shape)) for t in h.kv])
    conn.send_bytes(pickle.dumps(header))
    for t in h.kv:
        conn.send_bytes(t.contiguous().view(-1).view(torch.uint8).numpy())
    return h.nbytes


def recv_handover(conn) -> KVHandover:
    """The other end of send_handover: the header, then each tensor read into a fresh buffer. An empty message
    (the sender's end marker) raises EOFError, as a closed pipe does."""
    header = conn.recv_bytes()
    if not header:
        raise EOFError("the sender has no more handovers")
    h = pickle.loads(header)
    kv = []
    for dtype, shape in h.kv:
        dt = getattr(torch, dtype)
        buf = bytearray(torch.Size(shape).numel() * torch.empty(0, dtype=dt).element_size())
        conn.recv_bytes_into(buf)
        kv.append(torch.frombuffer(buf, dtype=dt).view(shape))          # (L, n_blocks, block_size, ...)
    return replace(h, kv=kv)
