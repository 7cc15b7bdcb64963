"""Notebook 04's GPU timing (minillm.bench.attention_gpu) runs in the simulator: flash_attention_cuda and torch's
naive attention agree on the tensors it times, and it reports seconds, flops and bytes per length. Its timings
here are the simulator's (meaningless); on a GPU, make gpu-check runs it for real."""
from minillm.kernels.flash_attention import naive_attention

from minillm.bench.attention_gpu import naive_attention_torch, time_attention
from minillm.bench.attention_traffic import attention_flops


def test_time_attention_agrees_and_reports_each_length():
    got = time_attention([8, 20], H=2, D=16, repeats=1, device="cpu")
    assert got["lengths"] == [8, 20] and got["device"] == "cpu"
    assert all(e < 1e-5 for e in got["max_error"]), got["max_error"]
    assert all(s > 0 for s in got["naive"] + got["flash"])
    assert got["flops"]["naive"] == [attention_flops(T, 2, 16, "naive") for T in (8, 20)]
    assert got["bytes"]["naive"][1] > got["bytes"]["flash"][1] > 0


def test_torch_naive_is_numpy_naive():
    import numpy as np
    import torch
    rng = np.random.default_rng(1)
    q, k, v = (rng.standard_normal((12, 3, 8)).astype(np.float32) for _ in range(3))
    got = naive_attention_torch(*(torch.from_numpy(x) for x in (q, k, v))).numpy()
    assert np.abs(got - naive_attention(q, k, v)).max() < 1e-5
