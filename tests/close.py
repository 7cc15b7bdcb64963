"""assert_close: one tolerance policy for every numeric comparison, printing the worst mismatches."""
import torch

# Tolerances by dtype: float64 compares implementations that differ only in summation order
# (rounding ~1e-16 per op, grown by depth); float32 carries ~1e-7 relative per op over a few
# hundred sequential ops; half types carry 3 decimal digits.
TOL = {torch.float64: 1e-10, torch.float32: 1e-4, torch.float16: 1e-2, torch.bfloat16: 5e-2}


def assert_close(got, want, atol=None, rtol=None, name="", show=5):
    got, want = torch.as_tensor(got), torch.as_tensor(want)
    assert got.shape == want.shape, f"{name}: shape {tuple(got.shape)} != {tuple(want.shape)}"
    tol = TOL.get(want.dtype, 1e-4)
    atol = tol if atol is None else atol
    rtol = tol if rtol is None else rtol
    diff = (got.double() - want.double()).abs()
    bad = diff > atol + rtol * want.double().abs()
    if bad.any():
        flat = diff.flatten()
        worst = torch.topk(flat, min(show, flat.numel())).indices
        rows = [f"  at {tuple(int(i) for i in torch.unravel_index(w, diff.shape))}: got {got.flatten()[w].item():.6g}, "
                f"want {want.flatten()[w].item():.6g}" for w in worst]
        raise AssertionError(f"{name}: {int(bad.sum())} of {bad.numel()} elements differ beyond atol={atol:g}, "
                             f"rtol={rtol:g}; max abs diff {diff.max().item():.3g}\n" + "\n".join(rows))
