"""Notebook 07's core exercise: check_quantize_int4 names each common mistake, and survives bad student code."""
import numpy as np
import pytest
import torch

from minillm.labs import check_quantize_int4


def int4(w, group, divisor=7.0, per_row=False, offset=8, low_first=True, guard_zero=True, rounding=np.rint):
    """The exercise's solution, with the common mistakes as switches."""
    N, K = w.shape
    G = K if per_row else group
    wg = w.reshape(N, K // G, G)
    scales = np.abs(wg).max(axis=2) / divisor                               # (N, K/G)
    safe = np.where(scales > 0, scales, 1.0)[:, :, None] if guard_zero else scales[:, :, None]
    q = np.clip(rounding(wg / safe), -8, 7).astype(np.int8).reshape(N, K)      # unguarded: nan cast to int8
    u = ((q + offset) & 15).astype(np.uint8)                                   # offset 0: two's complement nibbles
    lo, hi = (u[:, 0::2], u[:, 1::2]) if low_first else (u[:, 1::2], u[:, 0::2])
    if per_row:
        scales = np.repeat(scales, K // group, axis=1)
    return lo | (hi << 4), scales.astype(np.float32)


def check(**mistake):
    return check_quantize_int4(lambda w, group: int4(w, group, **mistake))


def test_the_solution_passes():
    result = check()
    assert result and result.kind == "core", repr(result)


MISTAKES = [
    (dict(low_first=False), "nibble order swapped: even k goes in the LOW nibble"),
    (dict(offset=0), "no +8 offset"),
    (dict(per_row=True), "one scale per row"),
    (dict(divisor=8.0), "scale = max|w| / 8; the engine uses max|w| / 7"),
    (dict(guard_zero=False), "all-zero group"),
    (dict(rounding=np.trunc), "truncated"),
]


@pytest.mark.parametrize("mistake,said", MISTAKES)
def test_a_common_mistake_is_named(mistake, said):
    result = check(**mistake)
    assert not result and said in result.message, repr(result)


def test_a_torch_solution_passes():
    def torch_int4(w, group):
        w = torch.from_numpy(w)
        N, K = w.shape
        wg = w.reshape(N, K // group, group)
        s = wg.abs().amax(-1) / 7                                                # (N, K/G)
        q = torch.round(wg / torch.where(s > 0, s, 1.0)[..., None]).to(torch.int16).reshape(N, K) + 8
        return (q[:, 0::2] | (q[:, 1::2] << 4)).to(torch.uint8), s
    assert check_quantize_int4(torch_int4)


def test_bad_student_code_fails_cleanly_and_leaves_nothing_behind():
    def raises(w, group):
        raise ValueError("nope")
    assert "ValueError: nope" in check_quantize_int4(raises).message
    result = check_quantize_int4(lambda w, group: (int4(w, group)[0].astype(np.int8), int4(w, group)[1]))
    assert not result and "expected uint8" in result.message
    result = check_quantize_int4(lambda w, group: w)
    assert not result and "return (packed, scales)" in result.message
    before = torch.get_default_dtype()
    assert check(), "the next, correct attempt passes"
    assert torch.get_default_dtype() == before
