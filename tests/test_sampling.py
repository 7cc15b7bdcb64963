"""Sampling transforms and the sampler's statistics."""
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from minillm.core.sampling import SamplingParams, probs_from_logits, sample


@settings(deadline=None, derandomize=True, max_examples=60)
@given(st.integers(2, 60), st.floats(0.05, 1.0), st.integers(0, 70), st.floats(0.1, 3.0), st.integers(0, 2**31 - 1))
def test_top_k_top_p_keep_the_right_set(V, p, k, t, seed):
    logits = torch.randn(V, generator=torch.Generator().manual_seed(seed), dtype=torch.float64) * 3
    probs = probs_from_logits(logits, t, k, p)
    assert abs(float(probs.sum()) - 1) < 1e-5
    kept = probs > 0
    full = torch.softmax(logits.float() / t, -1)
    order = torch.argsort(full, descending=True)
    n_kept = int(kept.sum())
    assert set(order[:n_kept].tolist()) == set(torch.nonzero(kept).flatten().tolist())  # a top set
    if 0 < k < V:
        assert n_kept <= k
    # the kept set is the smallest top set whose (top-k renormalised) mass reaches p
    base = probs_from_logits(logits, t, k, 1.0)
    mass = torch.sort(base, descending=True).values.cumsum(0)
    assert n_kept == min(int((mass < p - 1e-6).sum()) + 1, int((base > 0).sum()))


def test_sampling_frequencies_follow_the_distribution():
    logits = torch.tensor([2.0, 1.0, 0.0, -1.0, -5.0])
    params = SamplingParams(temperature=0.7, top_k=0, top_p=1.0)
    g = torch.Generator().manual_seed(0)
    n = 20000
    counts = torch.bincount(torch.tensor([sample(logits, params, g) for _ in range(n)]), minlength=5).double()
    want = torch.softmax(logits / 0.7, -1).double() * n
    # each count is binomial: within 5 standard deviations (fails by chance with p < 1e-5)
    assert ((counts - want).abs() <= 5 * (want * (1 - want / n)).sqrt() + 1).all(), (counts, want)


def test_greedy_takes_the_first_maximum():
    assert sample(torch.tensor([0.0, 3.0, 3.0, 1.0]), SamplingParams(temperature=0), None) == 1


def test_stop_accepts_a_single_string():
    assert SamplingParams(stop="\n").stop == ["\n"]


def test_top_p_keeps_the_smallest_set_that_reaches_p_exactly():
    """p = [0.5, 0.25, 0.25] (exact in float32), top_p = 0.75: the first two tokens already reach 0.75, so the
    third is dropped (mass strictly before a token >= top_p drops it; '>' would keep it)."""
    import math

    import torch

    from minillm.core.sampling import probs_from_logits
    logits = torch.tensor([math.log(2.0), 0.0, 0.0])
    p = probs_from_logits(logits, 1.0, 0, 0.75)
    assert p[2] == 0.0 and torch.allclose(p, torch.tensor([2 / 3, 1 / 3, 0.0]))
    assert probs_from_logits(logits, 1.0, 0, 0.7500001)[2] > 0.0   # just past the boundary: the third is needed
