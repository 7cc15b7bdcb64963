"""What a GPU would show, computed from datasheets (minillm.bench.gpus): the roofline bound, its ridge, its label."""
import pytest

from minillm.bench.gpus import GPU, PUBLISHED, published


def test_the_bound_is_the_slower_of_moving_the_bytes_and_doing_the_flops():
    g = GPU("toy", bandwidth=100.0, fp16_flop_s=1000.0, fp32_flop_s=250.0, memory=1.0)
    assert g.ridge("fp16") == 10 and g.ridge("fp32") == 2.5
    assert g.seconds(flops=500, nbytes=10) == 0.5             # 5 flop/B, under the fp16 ridge of 10: compute 0.5 s
    assert g.seconds(flops=500, nbytes=200) == 2.0            # 2.5 flop/B: memory, 2 s
    assert g.seconds(flops=500, nbytes=10, dtype="fp32") == 2.0
    assert g.seconds(flops=0, nbytes=0) == 0
    with pytest.raises(ValueError, match="dtype"):
        g.seconds(1, 1, dtype="int8")
    with pytest.raises(ValueError, match=">= 0"):
        g.seconds(-1, 1)


def test_published_gpus_read_as_their_datasheets_say_and_label_themselves_as_computed():
    h100 = published("H100 SXM")
    assert h100.ridge("fp16") == pytest.approx(295, abs=1)       # 989 TFLOP/s over 3.35 TB/s
    for g in PUBLISHED.values():
        assert 1e11 < g.bandwidth < 1e13 and g.fp32_flop_s < g.fp16_flop_s
        assert g.ridge("fp16") > 100                                # every GPU here: decode (~1 flop/B) far below
        assert "not a measurement" in g.label() and g.name in g.label()
    with pytest.raises(ValueError, match="unknown GPU 'H300'.*H100 SXM"):
        published("H300")
