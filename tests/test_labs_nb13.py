"""Notebook 13's core exercise: check_wanda_mask names each common mistake, and survives bad student code."""
import pytest
import torch

from minillm.labs import check_wanda_mask


def wanda(weight, x, sparsity, norm=lambda x: x.norm(dim=0), sign=1.0, per_layer=False, invert=False):
    """The exercise's solution, with the common mistakes as switches."""
    score = sign * weight.abs() * norm(x)[None, :]                              # (N, K)
    N, K = weight.shape
    drop = int(K * sparsity)
    mask = torch.ones(N * K if per_layer else (N, K), dtype=torch.bool)
    if per_layer:
        mask[torch.sort(score.flatten(), stable=True).indices[:N * drop]] = False
        mask = mask.view(N, K)
    else:
        mask.scatter_(1, torch.sort(score, dim=1, stable=True).indices[:, :drop], False)
    return ~mask if invert else mask


def check(**mistake):
    return check_wanda_mask(lambda weight, x, sparsity: wanda(weight, x, sparsity, **mistake))


def test_the_solution_passes_on_the_shipped_model():
    result = check()
    assert result and result.kind == "core" and "56 transformer linears" in result.message, repr(result)


MISTAKES = [
    (dict(norm=lambda x: torch.ones(x.shape[1])), "magnitude pruning's"),
    (dict(norm=lambda x: x.norm(dim=0) ** 2), "||X_j||^2"),
    (dict(norm=lambda x: x.abs().mean(0)), "mean |X_j|"),
    (dict(sign=-1.0), "HIGHEST scores were dropped"),
    (dict(per_layer=True), "within each output row"),
    (dict(invert=True), "the mask is True for the weights KEPT"),
]


@pytest.mark.parametrize("mistake,said", MISTAKES)
def test_a_common_mistake_is_named(mistake, said):
    result = check(**mistake)
    assert not result and said in result.message, repr(result)


def test_bad_code_fails_cleanly_and_the_next_attempt_passes():
    def raises(weight, x, sparsity):
        raise RuntimeError("oops")

    def float_mask(weight, x, sparsity):
        return wanda(weight, x, sparsity).float()

    def wrong_shape(weight, x, sparsity):
        return wanda(weight, x, sparsity).T

    assert "oops" in check_wanda_mask(raises).message
    assert "expected torch.bool" in check_wanda_mask(float_mask).message
    assert "expected the weight's" in check_wanda_mask(wrong_shape).message
    assert not check_wanda_mask(lambda weight, x: None)                     # wrong signature
    assert check()


def nm_mask(score, n, m, lowest=False, columns=False):
    """The warm-up's solution, with the common mistakes as switches."""
    if columns:
        return nm_mask(score.t().contiguous(), n, m).t()
    N, K = score.shape
    groups = (-score if lowest else score).reshape(N, K // m, m)
    keep = torch.sort(groups, dim=-1, descending=True, stable=True).indices[..., :n]
    return torch.zeros_like(groups, dtype=torch.bool).scatter_(-1, keep, True).reshape(N, K)


def test_nm_mask_checker_passes_the_solution_and_names_the_mistakes():
    from minillm.labs import check_nm_mask
    assert check_nm_mask(nm_mask).passed
    lowest = check_nm_mask(lambda s, n, m: nm_mask(s, n, m, lowest=True))
    assert not lowest.passed and "LOWEST" in lowest.message, lowest
    inverted = check_nm_mask(lambda s, n, m: ~nm_mask(s, n, m))
    assert not inverted.passed and "inverted" in inverted.message, inverted
    raises = check_nm_mask(lambda s, n, m: 1 / 0)
    assert not raises.passed and "ZeroDivisionError" in raises.message, raises
    columns = check_nm_mask(lambda s, n, m: nm_mask(s, n, m, columns=True))
    assert not columns.passed and ("column" in columns.message or "group keeps" in columns.message), columns
