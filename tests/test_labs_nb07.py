"""Notebook 07's core exercise: check_quantize_int4 names each common mistake, and survives bad student code."""
import numpy as np
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


def test_nibble_order_swapped_is_named():
    result = check(low_first=False)
    assert not result and "nibble order swapped: even k goes in the LOW nibble" in result.message, repr(result)


def test_no_offset_is_named():
    result = check(offset=0)
    assert not result and "no +8 offset" in result.message, repr(result)


def test_scale_per_row_is_named():
    result = check(per_row=True)
    assert not result and "one scale per row" in result.message, repr(result)


def test_max_over_8_is_named_with_the_engines_choice():
    result = check(divisor=8.0)
    assert not result and "scale = max|w| / 8; the engine uses max|w| / 7" in result.message, repr(result)


def test_zero_group_divided_by_zero_is_named():
    result = check(guard_zero=False)
    assert not result and "all-zero group" in result.message, repr(result)


def test_truncation_is_named():
    result = check(rounding=np.trunc)
    assert not result and "truncated" in result.message, repr(result)


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
