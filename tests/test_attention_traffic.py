"""Notebook 04's bytes-moved model (minillm.bench.attention_traffic) against cases worked by hand."""
import pytest

from minillm.bench.attention_traffic import attention_bytes_moved, attention_flops


def test_naive_by_hand():
    # T = 4, D = 2, one head, 1 byte a number: Q, K, V read (3 x 8), O written (8), S and P each written and read
    # (4 x 16): 24 + 8 + 64 = 96.
    got = attention_bytes_moved(4, 1, 2, "naive", itemsize=1)
    assert got == {"inputs": 24, "output": 8, "quadratic": 64, "total": 96}
    assert attention_bytes_moved(4, 3, 2, "naive", itemsize=2)["total"] == 96 * 3 * 2      # per head, per byte


def test_flash_by_hand():
    # T = 4, D = 2, query tiles of 2 rows. Causal: tile 0 (rows 0-1) reads keys 0-1, tile 1 (rows 2-3) keys 0-3:
    # 6 keys read, 4 of them the first time; the 2 re-read keys cost K and V: 2 x 2 x 2 = 8.
    got = attention_bytes_moved(4, 1, 2, "flash", q_tile=2, itemsize=1)
    assert got == {"inputs": 24, "output": 8, "quadratic": 8, "total": 40}
    # Not causal: both tiles read all 4 keys: 4 re-read, 2 x 2 x 4 = 16.
    assert attention_bytes_moved(4, 1, 2, "flash", q_tile=2, causal=False, itemsize=1)["total"] == 48
    # Tiles of 3 rows over T = 4 (the last tile is short), causal: tile 0 reads keys 0-2, tile 1 keys 0-3: 3 re-read.
    assert attention_bytes_moved(4, 1, 2, "flash", q_tile=3, itemsize=1)["quadratic"] == 2 * 2 * 3


def test_one_query_tile_reads_everything_once():
    for T in (1, 5, 128):
        assert attention_bytes_moved(T, 2, 8, "flash", q_tile=128, itemsize=4)["total"] == 4 * T * 8 * 2 * 4


def test_at_long_t_naive_moves_about_4_q_tile_over_d_times_more():
    T, D = 1 << 15, 64
    for q_tile in (16, 64, 128):
        naive = attention_bytes_moved(T, 1, D, "naive")["total"]
        flash = attention_bytes_moved(T, 1, D, "flash", q_tile=q_tile)["total"]
        assert naive / flash == pytest.approx(4 * q_tile / D, rel=0.03)
    ratios = [attention_bytes_moved(T, 4, D, "naive")["total"] / attention_bytes_moved(T, 4, D, "flash")["total"]
              for T in (64, 256, 1024, 4096)]
    assert all(a < b for a, b in zip(ratios, ratios[1:]))         # the gap widens as T grows


def test_bad_arguments():
    with pytest.raises(ValueError, match="method"):
        attention_bytes_moved(8, 1, 1, "fast")
    with pytest.raises(ValueError, match="q_tile"):
        attention_bytes_moved(8, 1, 1, "flash", q_tile=0)


def test_flops_by_hand():
    # naive computes every (query, key) pair, masked or not: 4 D flops each (2 D for q . k, 2 D for p v).
    assert attention_flops(4, 1, 2, "naive") == 4 * 2 * 16
    assert attention_flops(4, 3, 2, "naive") == 3 * attention_flops(4, 1, 2, "naive")
    # flash, causal, one-row query tiles: exactly the T (T + 1) / 2 pairs on or below the diagonal.
    assert attention_flops(4, 1, 2, "flash", q_tile=1) == 4 * 2 * 10
    # tiles of 2 rows over T = 4: tile 0 scores 2 rows x keys 0-1, tile 1 2 rows x keys 0-3: 4 + 8 pairs.
    assert attention_flops(4, 1, 2, "flash", q_tile=2) == 4 * 2 * 12
    # one tile covering everything, or no causal skipping: naive's count.
    assert attention_flops(4, 1, 2, "flash", q_tile=8) == attention_flops(4, 1, 2, "naive")
    assert attention_flops(4, 1, 2, "flash", q_tile=2, causal=False) == attention_flops(4, 1, 2, "naive")
    # at long T, causal flash does about half of naive's work
    assert attention_flops(1 << 14, 1, 64, "flash") / attention_flops(1 << 14, 1, 64, "naive") == pytest.approx(
        0.5, rel=0.01)
    with pytest.raises(ValueError, match="method"):
        attention_flops(8, 1, 1, "fast")
    with pytest.raises(ValueError, match="q_tile"):
        attention_flops(8, 1, 1, "flash", q_tile=0)
