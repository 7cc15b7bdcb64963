"""Paged attention against a plain reference: per sequence, contiguous K/V, matmul + softmax, float64."""
import math

import pytest
import torch

from minillm.llama.attention import AttentionMetadata, gather_kv, paged_attention


def reference(q, k, v, positions, n):
    """One sequence: q (T, H, D); k, v (n, Hkv, D) contiguous; query t sees keys j <= positions[t], j < n."""
    T, H, D = q.shape
    rep = H // k.shape[1]
    k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)      # (n, H, D)
    s = torch.einsum("thd,jhd->htj", q, k) / math.sqrt(D)                  # (H, T, n)
    j = torch.arange(n)
    s = s.masked_fill(~(j[None, :] <= positions[:, None])[None], float("-inf"))
    return torch.einsum("htj,jhd->thd", torch.softmax(s, -1), v)           # (T, H, D)


@pytest.mark.parametrize("block_size,T", [(1, 1), (4, 1), (5, 3), (16, 7), (64, 2)])
def test_paged_attention_equals_contiguous_reference(block_size, T):
    g = torch.Generator().manual_seed(block_size * 10 + T)
    H, Hkv, D = 4, 2, 8
    lens = [3, 17, 9, 40]                         # cached tokens per sequence once this step's are written
    M = -(-max(lens) // block_size)
    nb = len(lens) * M + 3
    k_pool = torch.randn(nb, block_size, Hkv, D, generator=g, dtype=torch.float64)
    v_pool = torch.randn(nb, block_size, Hkv, D, generator=g, dtype=torch.float64)
    tables = torch.randperm(nb, generator=g)[:len(lens) * M].view(len(lens), M)   # scattered blocks
    # each sequence's last min(T, n) tokens are this step's queries; shorter rows are right-padded
    positions = torch.zeros(len(lens), T, dtype=torch.long)
    for b, n in enumerate(lens):
        t = min(T, n)
        positions[b, :t] = torch.arange(n - t, n)
    attn = AttentionMetadata.build(positions, tables, torch.tensor(lens), block_size)
    q = torch.randn(len(lens), T, H, D, generator=g, dtype=torch.float64)
    got = paged_attention(q, k_pool, v_pool, attn)                                # (B, T, H, D)
    for b, n in enumerate(lens):
        k = gather_kv(k_pool, tables[b:b + 1], n)[0]                              # (n, Hkv, D)
        # contiguous K/V from the flat pool, slot by slot, independent of gather_kv's block arithmetic
        slots = [int(tables[b, p // block_size]) * block_size + p % block_size for p in range(n)]
        assert torch.equal(k, k_pool.view(-1, Hkv, D)[slots])
        t = min(T, n)
        want = reference(q[b, :t], k, v_pool.view(-1, Hkv, D)[slots], positions[b, :t], n)
        torch.testing.assert_close(got[b, :t], want, rtol=1e-12, atol=1e-12)     # float64: only rounding differs
