"""Draft (minillm.core.batch): the one place a draft tree's depths, ancestors and attention mask are built; the
engine's runner, Medusa's candidate tree and minillm.viz all read it."""
import pytest
import torch

from minillm.core.batch import Draft
from minillm.spec_decode.medusa_tree import DEFAULT_CHOICES, build_tree


def brute_mask(d: Draft) -> torch.Tensor:
    k = len(d)
    return torch.tensor([[j in d.ancestors(i) for j in range(k)] for i in range(k)])   # (k, k)


@pytest.mark.parametrize("parents", [None, [-1, -1, 0, 1, 1, 3], [-1], [-1, 0, 1, 2]])
def test_mask_and_depths_follow_the_ancestors(parents):
    n = 4 if parents is None else len(parents)
    d = Draft(list(range(10, 10 + n)), None, parents).check()
    assert torch.equal(d.mask(), brute_mask(d))
    assert d.depths() == [len(d.ancestors(i)) for i in range(n)]


def test_medusa_tree_reads_its_mask_and_depths_from_its_draft():
    tree = build_tree(7, torch.randn(3, 50, generator=torch.Generator().manual_seed(0)), DEFAULT_CHOICES)
    d = tree.draft
    assert torch.equal(tree.mask[1:, 1:], d.mask()) and bool(tree.mask[:, 0].all())
    assert tree.depths == [0] + d.depths()


@pytest.mark.parametrize("parents", [[0], [-1, 2, 0], [-1, -2], [-1, 0, 0, 5]])
def test_a_tree_whose_parents_do_not_come_first_is_refused(parents):
    with pytest.raises(ValueError, match="parents come first"):
        Draft([1] * len(parents), None, parents).check()
