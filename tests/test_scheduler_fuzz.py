"""Scheduler and block-manager fuzzing with a fake model whose next token hashes the K/V it reads back
through the block table (DESIGN rule 7): any paging bug (a wrong block, a missed copy-on-write, a stale
prefix-cache block, a lost preempted sequence) changes the output."""
import torch
from hypothesis import given, settings, strategies as st

from minillm.attention import gather_kv
from minillm.config import EngineConfig, ModelConfig
from minillm.engine import LLMEngine
from minillm.loader import sample_tokenizer
from minillm.sampling import SamplingParams

V = 300
CFG = ModelConfig(dim=8, hidden_dim=8, n_layers=1, n_heads=1, n_kv_heads=1, vocab_size=V, max_seq_len=64)


def next_token(context: list[int]) -> int:
    h = 0
    for t in context:
        h = (h * 1_000_003 + t + 1) % 2_147_483_647
    return 3 + h % (V - 3)  # never BOS/EOS, so lengths are exact


class HashModel(torch.nn.Module):
    """Stores each token id (and its position) as its 'K/V', then reads the context back through the
    block table and predicts next_token(context) with a one-hot logit."""

    def __init__(self):
        super().__init__()
        self.config = ModelConfig(dim=2, hidden_dim=2, n_layers=1, n_heads=1, n_kv_heads=1, vocab_size=V, max_seq_len=64)
        self.dummy = torch.nn.Parameter(torch.zeros(1, dtype=torch.float64))

    def forward(self, tokens, positions, kv, attn, last_index):
        B, T = tokens.shape
        kvals = torch.stack([tokens, positions], -1).to(torch.float64)[:, :, None, :]   # (B, T, Hkv=1, D=2)
        kv.update(0, attn.slot_mapping, kvals, kvals)
        logits = torch.full((B, 1, V), -1e9, dtype=torch.float64)                        # (B, 1, V)
        for b in range(B):
            p = int(attn.positions[b, last_index[b]])
            ctx = gather_kv(kv.k[0], attn.block_tables[b:b + 1], p + 1)[0, :, 0]         # (p+1, 2)
            assert ctx[:, 1].tolist() == list(range(p + 1)), "positions read back out of order"
            logits[b, 0, next_token([int(t) for t in ctx[:, 0]])] = 0.0
        return logits


def reference(prompt, n):
    ids = list(prompt)
    for _ in range(n):
        ids.append(next_token(ids))
    return ids[len(prompt):]


request = st.tuples(st.lists(st.integers(3, 12), min_size=1, max_size=30),  # prompt (few distinct tokens: shared prefixes)
                    st.integers(1, 25),                                      # max_tokens
                    st.integers(0, 6),                                       # arrival step
                    st.sampled_from([1, 1, 2]),                              # n
                    st.booleans())                                           # aborted later


@settings(deadline=None, derandomize=True, max_examples=200)
@given(st.lists(request, min_size=1, max_size=8), st.sampled_from([1, 2, 4, 16]),
       st.sampled_from(["continuous", "static", "chunked"]), st.booleans(), st.integers(4, 12),
       st.sampled_from(["recompute", "swap"]))
def test_fuzz_outputs_equal_sequential_and_nothing_leaks(reqs, block_size, mode, caching, pool_blocks16, preempt):
    tok = sample_tokenizer(V)
    model = HashModel()
    kv_tokens = max(64, pool_blocks16 * 16)           # at least one full-length sequence; often far less than all
    cfg = EngineConfig(block_size=block_size, dtype="float64", max_model_len=64, max_num_seqs=4,
                       kv_cache_bytes=kv_tokens * model.config.kv_bytes_per_token(8) + block_size * 32,
                       batching="static" if mode == "static" else "continuous",
                       enable_chunked_prefill=mode == "chunked", max_num_batched_tokens=9 if mode == "chunked" else None,
                       enable_prefix_caching=caching, preemption_mode=preempt,
                       swap_bytes=(2 if preempt == "swap" else 0) * 64 * model.config.kv_bytes_per_token(8))
    engine = LLMEngine(model, tok, cfg)
    pending = sorted(enumerate(reqs), key=lambda r: r[1][2])
    ids, step, finished = {}, 0, {}
    while pending or engine.has_unfinished_requests():
        while pending and pending[0][1][2] <= step:
            i, (prompt, max_tokens, _, n, abort) = pending.pop(0)
            prompt = [1] + prompt[:60]
            ids[i] = engine.add_request(prompt, SamplingParams(n=n, temperature=0, max_tokens=max_tokens, ignore_eos=True))
        engine.step()
        step += 1
        if step == 3:
            for i, r in enumerate(reqs):
                if r[4] and i in ids and ids[i] in engine.requests:  # (finished ones are popped already)
                    engine.abort(ids[i])
        for out in engine.pop_finished():
            assert out.request_id not in finished, "a request finished twice"
            finished[out.request_id] = out
        assert step < 2000, "the engine stopped making progress"
    assert set(finished) == set(ids.values())
    for i, rid in ids.items():
        prompt, max_tokens, _, n, _ = reqs[i]
        prompt = [1] + prompt[:60]
        want = reference(prompt, min(max_tokens, 64 - len(prompt)))
        for c in finished[rid].outputs:
            if c.finish_reason == "abort":
                assert c.token_ids == want[:len(c.token_ids)]
            else:
                assert c.token_ids == want, (i, c.finish_reason)
    bm = engine.block_manager
    bm.check([])
    assert bm.num_free == bm.num_blocks and sum(bm.ref_count) == 0 and len(bm.swap_free) == bm.swap_blocks
