"""Bytes attention moves through a GPU's main memory (HBM), naive against FlashAttention (notebook 04).

On a GPU, attention's softmax and its per-head matmuls do little arithmetic per byte, so the bytes that
cross between HBM and the chip decide its time. This counts them, per head, for attention over T tokens
with head dim D, the way Dao et al. 2022 (section 3.2) count them:

naive (their Algorithm 0, three kernels): read Q and K, write the scores S (T x T); read S, write the
    probabilities P (T x T); read P and V, write the output O. Every (query, key) pair crosses HBM four
    times, masked or not (the masked half is written too):
        bytes = itemsize * H * (4 T D + 4 T^2)
flash (FlashAttention-2's loop order, and this package's kernels): a tile of `q_tile` query rows reads its
    rows of Q once, walks the key tiles reading K and V (the scores stay on chip), and writes its rows of
    O once. Causal, the tile ending at row r reads only the first r keys:
        bytes = itemsize * H * (2 T D + 2 D * (keys read, summed over the query tiles))
    about itemsize * H * (3 T D + D T^2 / q_tile) when causal: K and V re-read once per query tile is still
    quadratic in T, but naive moves about 4 q_tile / D times as many bytes at long T. A bigger query tile
    means fewer re-reads (it must fit on chip). Re-reads that hit the GPU's L2 cache cost less than counted:
    this is flash's upper bound.
"""
from __future__ import annotations


def _check_sizes(**sizes):
    for name, val in sizes.items():
        if val < 1:
            raise ValueError(f"{name} must be >= 1, got {val}")


def attention_bytes_moved(T: int, H: int, D: int, method: str, q_tile: int = 128, causal: bool = True,
                          itemsize: int = 2) -> dict:
    """HBM bytes of one causal (or, causal=False, full) attention call over T tokens, H heads of dim D, one
    sequence, each head reading its own K and V (no GQA sharing), `itemsize` bytes a number (2: fp16).
    -> {"inputs": Q, K and V read once, "output": O written once, "quadratic": what grows with T^2 (naive: S
    and P each written and read back; flash: K and V read again by every query tile after the first),
    "total": their sum}, in bytes."""
    _check_sizes(T=T, H=H, D=D, q_tile=q_tile, itemsize=itemsize)
    if method == "naive":
        quadratic = 4 * T * T                                        # S written, S read, P written, P read
    elif method == "flash":
        keys_read = sum(min(T, q0 + q_tile) if causal else T for q0 in range(0, T, q_tile))   # over query tiles
        quadratic = 2 * D * (keys_read - T)                          # the last tile reads all T keys: >= T
    else:
        raise ValueError(f"method must be 'naive' or 'flash', got {method!r}")
    parts = {"inputs": 3 * T * D, "output": T * D, "quadratic": quadratic}
    return {k: itemsize * H * v for k, v in parts.items()} | {"total": itemsize * H * sum(parts.values())}


def attention_flops(T: int, H: int, D: int, method: str, q_tile: int = 128, causal: bool = True) -> int:
    """Multiply-add flops of the same call: 2 D for a score (q . k) and 2 D for its share of P V, per (query, key)
    pair computed. Naive computes every pair, masked or not (T^2); flash, causal, skips the key tiles wholly
    above the diagonal (each query tile reads keys up to its last row): about half at long T."""
    _check_sizes(T=T, H=H, D=D, q_tile=q_tile)
    if method == "naive":
        pairs = T * T
    elif method == "flash":
        pairs = sum(min(q_tile, T - q0) * (min(T, q0 + q_tile) if causal else T) for q0 in range(0, T, q_tile))
    else:
        raise ValueError(f"method must be 'naive' or 'flash', got {method!r}")
    return 4 * D * H * pairs
