"""Notebook 11's pictures (minillm/viz/scheduling.py) draw what they are given: one row per request with its waiting
bar and token ticks, one bar per order, one service curve per client, and the prefix cache both ways (the radix
tree's runs and the block-hash trie's blocks counted in the titles)."""
import matplotlib
import matplotlib.pyplot as plt
from minillm.viz import scheduling

from minillm.core.outputs import CompletionOutput, RequestOutput
from minillm.core.sequence import RequestMetrics
from minillm.scheduling.radix import RadixTree

matplotlib.use("Agg")


def out(i, arrival, times):
    m = RequestMetrics(arrival, arrival, times[0], list(times), times[-1])
    return RequestOutput(str(i), None, [1], [CompletionOutput(0, "", [5] * len(times), "length")], True, m)


def test_request_timelines_draw_a_wait_bar_and_ticks_per_request():
    runs = {"fcfs": [out(0, 0.0, [0.1, 0.2, 0.3]), out(1, 0.05, [0.4])],
            "mlfq": [out(0, 0.0, [0.1, 0.35, 0.4]), out(1, 0.05, [0.2])]}
    fig = scheduling.plot_request_timelines(runs, long_tokens=2)
    ax = fig.axes[0]
    assert len(ax.patches) == 2 and len(ax.lines) == 2                # a wait bar and a row of ticks each
    assert ax.patches[1].get_width() == 0.4 - 0.05                      # request 1 waited until its first token
    assert "mean JCT 325 ms" in ax.get_title()                          # (0.3 + 0.35) / 2
    fig = scheduling.plot_request_timelines(runs, steps=True)
    assert fig.axes[0].get_xlabel() == "engine step" and "steps" in fig.axes[0].get_title()
    plt.close("all")


def test_order_comparison_and_client_service_draw_every_series():
    metrics = {k: {"jct_mean": 0.1 * i + 0.1, "jct_p99": 0.5, "goodput": 3.0 - i} for i, k in enumerate(["a", "b"])}
    fig = scheduling.plot_order_comparison(metrics)
    assert [len(ax.patches) for ax in fig.axes] == [2, 2, 2]
    assert [p.get_height() for p in fig.axes[0].patches] == [100.0, 200.0]
    fig = scheduling.plot_client_service({"fcfs": [("A", [0.1, 0.2]), ("B", [0.15]), ("A", [0.3])]})
    (ax,) = fig.axes
    assert [line.get_label() for line in ax.lines] == ["client A", "client B"]
    assert list(ax.lines[0].get_ydata()) == [1, 2, 3]                    # cumulative tokens served to A
    fig = scheduling.plot_latency_vs_utilisation([0.5, 0.9], {"fcfs": [0.1, 0.4]}, {"theory": [0.1, 0.5]})
    assert len(fig.axes[0].lines) == 2
    plt.close("all")


def test_prefix_caches_count_runs_and_blocks():
    seqs = [[1, 2, 3, 4, 5, 6], [1, 2, 3, 4, 9], [7, 8]]
    tree = RadixTree()
    for s in seqs:
        tree.insert(s)
    fig = scheduling.draw_prefix_caches(tree, seqs, block_size=2)
    left, right = fig.axes
    assert left.get_title() == "radix tree: 4 runs, 9 tokens stored once"           # [1 2 3 4] [5 6] [9] [7 8]
    assert right.get_title() == "block hashes (block_size 2): 4 cached blocks, 1 partial"   # [9] is partial
    assert len(left.patches) == 4 and len(right.patches) == 5
    plt.close("all")
