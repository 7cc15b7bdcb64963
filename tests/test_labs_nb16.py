"""Notebook 16's checkers name the mistakes: seats counted in tokens or with blocks rounded down, and a
configuration below the reference (with what to switch on), one that changes the budget, or a wrong shape."""
from minillm.labs import check_capstone, check_kv_seats


def seats_in_tokens(budget, per_token, bs, lengths):
    free, n = budget // per_token // bs * bs, 0
    for length in lengths:
        if length > free:
            break
        free, n = free - length, n + 1
    return n


def seats_rounded_down(budget, per_token, bs, lengths):
    free, n = budget // (bs * per_token), 0
    for length in lengths:
        if length // bs > free:
            break
        free, n = free - length // bs, n + 1
    return n


def test_kv_seats_names_tokens_and_rounding():
    assert "counted tokens, not whole blocks" in check_kv_seats(seats_in_tokens).message
    assert "round a sequence's blocks up" in check_kv_seats(seats_rounded_down).message


def test_capstone_grades_the_configuration():
    plain = check_capstone(lambda: ({}, None))
    assert not plain.passed and "prefix caching computes it once" in plain.message and "0.0" not in plain.message[:8]
    assert "kv_cache_bytes" in check_capstone(lambda: ({"kv_cache_bytes": 10**9}, None)).message
    assert "return (options, order)" in check_capstone(lambda: {"block_size": 16}).message
    reference = dict(block_size=16, enable_prefix_caching=True, enable_chunked_prefill=True,
                     max_num_batched_tokens=256, kv_cache_dtype="int8", quantization="int8",
                     scheduling_policy="priority")
    result = check_capstone(lambda: (reference, None))
    assert result.passed and "1.00x the reference" in result.message
