import pytest
import torch

from minillm.config import ModelConfig
from minillm.llama.transformer import Transformer
from minillm.spec_decode.acceptance import expected_tokens, measure_acceptance


def test_expected_tokens_formula():
    assert expected_tokens(0.0, 4) == 1.0                     # nothing accepted: the target's own token
    assert expected_tokens(1.0, 4) == 5.0                     # everything accepted, plus the bonus
    assert expected_tokens(0.5, 1) == pytest.approx(1.5)
    a, g = 0.8, 3                                             # the series 1 + a + a^2 + a^3
    assert expected_tokens(a, g) == pytest.approx(sum(a ** k for k in range(g + 1)))


def test_alpha_of_a_model_with_itself_is_one_and_bounds_hold():
    cfg = ModelConfig.from_name("tiny", max_seq_len=32)
    a = Transformer(cfg).init_weights(0, std=0.2).eval()
    b = Transformer(cfg).init_weights(1, std=0.2).eval()
    x = torch.randint(0, cfg.vocab_size, (4, 16), generator=torch.Generator().manual_seed(0))
    same = measure_acceptance(a, a, x)
    assert same.alpha == pytest.approx(1.0) and same.alpha_greedy == 1.0 and same.positions == 64
    other = measure_acceptance(a, b, x)
    assert 0 < other.alpha < 1 and 0 <= other.alpha_greedy < 1
    # alpha = 1 - total variation distance, checked directly at one position
    with torch.no_grad():
        p, q = torch.softmax(a(x[:1, :1])[0, 0].double(), -1), torch.softmax(b(x[:1, :1])[0, 0].double(), -1)
    assert measure_acceptance(a, b, x[:1, :1]).alpha == pytest.approx(1 - 0.5 * (p - q).abs().sum().item())
