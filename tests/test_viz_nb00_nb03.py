"""Plots that read cleanly (issue 23): 00's token labels show whitespace and its T = 2 bars stay visible on a
log axis; 03's access diagrams size their read counts to the cells, so a 4x4 tile's numbers are readable."""
import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import minillm.viz as viz  # noqa: E402
import torch  # noqa: E402
from minillm.kernels.access_trace import Access, AccessLog  # noqa: E402
from minillm.viz.sampling import visible  # noqa: E402


def test_whitespace_pieces_get_visible_labels():
    assert visible("\n") == "\\n" and visible(" a") == "\u2423a" and visible("\t") == "\\t"
    assert visible("") == "''" and visible("ab") == "ab" and visible("\n<s>\n") == "\\n<s>\\n"


def test_the_distribution_plot_labels_whitespace_tokens_and_can_use_a_log_axis():
    labels = ["\n", " ", " the", "a", "\t"]
    logits = torch.tensor([5.0, 4.0, 3.0, 2.0, 1.0])
    fig = viz.plot_next_token_distribution(logits, temperatures=(0.5, 2.0), k=5, labels=labels, log=True)
    ax = fig.axes[0]
    ticks = [t.get_text() for t in ax.get_xticklabels()]
    assert ticks == ["\\n", "\u2423", "\u2423the", "a", "\\t"] and all(t.strip() for t in ticks)
    assert ax.get_yscale() == "log"
    plt.close(fig)
    fig = viz.plot_next_token_distribution(logits, k=3, labels=labels)
    assert fig.axes[0].get_yscale() == "linear"
    plt.close(fig)


def _grid_log(rows, cols):
    log = AccessLog((1, 1, 1), (1, 1, 1), shapes={"a": (rows, cols)}, spaces={"a": "global"})
    log.events += [Access((0, 0, 0), (0, 0, 0), "a", i, "read") for i in range(rows * cols)]
    return log


def _number_size(fig):
    sizes = {t.get_fontsize() for t in fig.axes[0].texts}
    assert len(sizes) == 1
    return sizes.pop()


def test_access_diagram_numbers_grow_when_the_cells_are_few():
    small, large = viz.plot_access_diagram(_grid_log(4, 4), "a"), viz.plot_access_diagram(_grid_log(20, 20), "a")
    assert _number_size(small) >= 10 and _number_size(small) > _number_size(large) >= 5
    plt.close("all")
