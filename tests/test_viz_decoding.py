"""minillm.viz.decoding (notebook 10's pictures) on small hand-made data under Agg: what each draws is checked where it
can be wrong (which bars are grey, which prefixes are pruned, which DFA states a merged chain hides)."""
import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import minillm.viz as viz  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402
from minillm.viz.decoding import _chains, byte_label  # noqa: E402

from minillm.guided import compile_dfa  # noqa: E402


@pytest.fixture(autouse=True)
def close_figures():
    yield
    plt.close("all")


def test_strategies_grey_out_the_dropped_tokens():
    p = torch.tensor([0.5, 0.3, 0.15, 0.05])
    fig = viz.plot_strategies({"model": p, "top-k = 2": torch.tensor([0.625, 0.375, 0.0, 0.0])},
                              labels=["a", " b", "\n", "d"], k=4, marked={1})
    bars = fig.axes[1].patches
    assert [b.get_height() for b in bars] == pytest.approx([0.625, 0.375, 0.0, 0.0])
    assert "2 tokens kept" in fig.axes[1].get_title() and "4 tokens kept" in fig.axes[0].get_title()
    assert bars[0].get_facecolor() != bars[2].get_facecolor()          # kept vs dropped
    assert [t.get_text() for t in fig.axes[0].get_xticklabels()][1:3] == ["\u2423b", "\\n"]


def test_beam_tree_marks_pruned_prefixes_only():
    steps = [[[1], [2]], [[1, 3], [1, 4]], [[1, 3, 5], [1, 4, 6]]]         # [2] is pruned after step 1
    fig = viz.draw_beam_tree(steps, labels={t: f"t{t}" for t in range(7)}, best=[1, 3, 5])
    ax = fig.axes[0]
    crosses = [line for line in ax.lines if line.get_marker() == "x"]
    assert len(crosses) == 1
    assert crosses[0].get_xdata()[0] == pytest.approx(1.32)             # beside the depth-1 node "t2"
    assert {t.get_text() for t in ax.texts} >= {"prompt", "t1", "t2", "t3", "t4", "t5", "t6"}


def test_byte_labels_and_merged_chains():
    assert byte_label([(97, 122)]) == "a-z" and byte_label([(32, 32)]) == "\u2423" and byte_label([(46, 46)]) == "'.'"
    assert byte_label([(48, 57), (65, 70)]) == "0-9,A-F" and byte_label([(0x80, 0xBF)]) == "0x80-0xBF"
    dfa = compile_dfa(r"(Romeo|Juliet) [a-z]+")
    merged = _chains(dfa.num_states, dfa.edges(), dfa.accepting)
    assert {label for _, _, label in merged} >= {"Romeo", "Juliet", "a-z"}
    # every merged edge spells a byte path of the DFA between the two kept states
    for a, b, label in merged:
        if label in ("Romeo", "Juliet"):
            assert dfa.walk(a, label.encode()) == b


def test_dfa_masks_and_cost_draw():
    dfa = compile_dfa(r"-?(0|[1-9][0-9]*)(\.[0-9]+)?")
    fig = viz.draw_dfa(dfa.num_states, dfa.edges(), dfa.accepting)
    assert f"{dfa.num_states} states" in fig.axes[0].get_title()
    fig = viz.plot_masks_per_step([7, 2, 2718, 1], ["Rome", "o", " d", "EOS"], 4096, [False, True, False, False])
    assert [b.get_height() for b in fig.axes[0].patches][:4] == [7, 2, 2718, 1]
    fig = viz.plot_mask_cost({"plain": (6.0, 0.0), "regex": (6.5, 0.4)})
    widths = [b.get_width() for b in fig.axes[0].patches]
    assert np.allclose(widths, [6.0, 6.1, 0.0, 0.4])
