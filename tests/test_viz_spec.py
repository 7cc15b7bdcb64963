"""minillm.viz.spec: the coloured speculative text and each plot draw small hand-made data under Agg."""
import re

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import minillm.viz as viz  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402
from minillm.viz.spec import STYLE, ancestor_mask  # noqa: E402

from minillm.formats.loader import load_tokenizer  # noqa: E402

TOKENIZER = "minillm/models/tokenizer.bin"


@pytest.fixture(autouse=True)
def close_figures():
    yield
    plt.close("all")


class FakeTokenizer:
    """Token t is the word WORDS[t]; records the prev_token each decode_bytes call got."""
    WORDS = ["A", " cat", " sat", " on", " <mat>", " dog", " ran", "\n", " &", " hat"]

    def __init__(self):
        self.prevs = []

    def decode_bytes(self, ids, prev_token=None):
        self.prevs.append(prev_token)
        return "".join(self.WORDS[t] for t in ids).encode()


class DecodeOnly:
    def decode(self, ids):
        return "".join(FakeTokenizer.WORDS[t] for t in ids)


# step 0: drafted cat sat on, all accepted, bonus <mat>; step 1: drafted dog ran, dog accepted, ran
# rejected, the target's correction is the newline; step 2: drafted hat, rejected, target emits &.
EVENTS = [{"drafted": [1, 2, 3], "accepted": 3, "emitted": [1, 2, 3, 4]},
          {"drafted": [5, 6], "accepted": 1, "emitted": [5, 7]},
          {"drafted": [9], "accepted": 0, "emitted": [8]}]


def spans(html_text, kind):
    return re.findall(rf'<span style="{re.escape(STYLE[kind])}"[^>]*>(.*?)</span>', html_text)


def text_part(html_text):
    return html_text[html_text.index("white-space:pre-wrap"):]          # after the legend


def test_spec_counts_totals_and_alpha():
    c = viz.spec_counts(EVENTS)
    assert (c["steps"], c["drafted"], c["accepted"], c["emitted"]) == (3, 6, 4, 7)
    assert c["acceptance_rate"] == pytest.approx(4 / 6)
    assert c["tokens_per_step"] == pytest.approx(7 / 3)
    assert np.isnan(viz.spec_counts([])["acceptance_rate"])
    with pytest.raises(ValueError):
        viz.spec_counts([{"drafted": [1], "accepted": 2, "emitted": [1]}])        # more accepted than drafted
    with pytest.raises(ValueError):
        viz.spec_counts([{"drafted": [1, 2], "accepted": 1, "emitted": [5, 6]}])   # emitted not the accepted draft


def test_spec_text_html_colours_each_outcome_and_escapes():
    tok = FakeTokenizer()
    h = viz.spec_text_html(EVENTS, tok, prompt_ids=[0])
    body = text_part(h)
    assert spans(body, "accepted") == [" cat", " sat", " on", " dog"]
    assert spans(body, "rejected") == [" ran", " hat"]
    assert "line-through" in STYLE["rejected"] and "green" not in STYLE["rejected"]
    assert spans(body, "target") == [" &lt;mat&gt;", "<br>", " &amp;"]            # bonus, correction, correction
    assert "<mat>" not in h and "&lt;mat&gt;" in h
    assert spans(body, "prompt") == ["A"]
    # rejected drafts sit inline, after the accepted ones and before the target's correction
    assert body.index("> dog<") < body.index("> ran<") < body.index("><br><")
    # prev_token: the prompt's last token first, then each emitted token; a rejected draft follows the last accepted
    assert tok.prevs[1:] == [0, 1, 2, 3, 4, 5, 5, 7, 7]
    assert "4 of 6 drafts accepted (acceptance rate, accepted / drafted = 0.67)" in h      # the legend's summary
    for kind in ("accepted", "rejected", "target"):
        assert STYLE[kind] in h[:h.index("white-space:pre-wrap")]                  # the legend
    assert viz.spec_text_html(EVENTS, FakeTokenizer(), prompt_ids=[0]) == h        # deterministic


def test_spec_text_html_rejected_newline_is_not_a_line_break_and_decode_fallback():
    h = viz.spec_text_html([{"drafted": [7, 2], "accepted": 0, "emitted": [1]}], DecodeOnly())
    assert spans(text_part(h), "rejected") == ["\u21b5", " sat"]
    assert spans(text_part(h), "target") == [" cat"]
    assert "<br>" not in text_part(h)


def test_spec_text_html_with_the_shipped_tokenizer():
    tok = load_tokenizer(TOKENIZER)
    ids = tok.encode("ROMEO:\nBut soft")                                        # BOS first
    prompt, gen = ids[:3], ids[3:]
    assert len(gen) == 6
    e_bytes = tok.encode("é")[-2:]                                              # é is two byte tokens
    events = [{"drafted": gen[:2], "accepted": 2, "emitted": gen[:3]},
              {"drafted": gen[3:5] + [tok.encode("x")[-1]], "accepted": 2, "emitted": gen[3:]},
              {"drafted": e_bytes, "accepted": 1, "emitted": e_bytes}]
    h = viz.spec_text_html(events, tok, prompt_ids=prompt)
    body = text_part(h)
    rejected_style = re.escape(STYLE["rejected"])
    shown = "".join(re.findall(rf'<span style="(?!{rejected_style})[^"]*"[^>]*>(.*?)</span>', body))
    # the output, without the rejected drafts
    assert shown.replace("<br>", "\n") == "ROMEO:\nBut softé"
    assert spans(body, "rejected") == ["x", "\ufffd"]                            # a lone continuation byte is not text
    assert spans(body, "accepted")[-1] == "" and spans(body, "target")[-1] == "é"  # é whole on the byte completing it


def test_plot_spec_vs_gamma_predicted_dashed_measured_solid_and_no_gain_line():
    rows = [{"proposer": p, "gamma": g, "alpha": a, "predicted": 1 + a * g / 4, "measured": 0.9 + a * g / 5}
            for p, a in (("draft model", 0.7), ("n-gram", 0.4)) for g in (4, 1, 2)]
    fig = viz.plot_spec_vs_gamma(rows)
    assert isinstance(fig, Figure) and len(fig.axes) == 2
    ax_a, ax_s = fig.axes
    assert sorted(ln.get_label() for ln in ax_a.lines) == ["draft model", "n-gram"]
    np.testing.assert_allclose(ax_a.lines[0].get_xdata(), [1, 2, 4])                # sorted by gamma
    lines = {ln.get_label(): ln for ln in ax_s.lines}
    for p in ("draft model", "n-gram"):
        pred, meas = lines[f"{p}: predicted"], lines[f"{p}: measured"]
        assert pred.get_linestyle() == "--" and meas.get_linestyle() == "-"
        assert pred.get_color() == meas.get_color()
    assert lines["draft model: predicted"].get_color() != lines["n-gram: predicted"].get_color()
    np.testing.assert_allclose(lines["n-gram: measured"].get_ydata(), [0.9 + 0.4 * g / 5 for g in (1, 2, 4)])
    no_gain = [ln for ln in ax_s.lines if "no gain" in ln.get_label()]
    assert len(no_gain) == 1 and set(no_gain[0].get_ydata()) == {1.0}
    assert len(ax_s.lines) == 2 * 2 + 1
    with pytest.raises(ValueError):
        viz.plot_spec_vs_gamma([])


def test_plot_spec_vs_batch_one_line_per_proposer_log2_x():
    fig = viz.plot_spec_vs_batch({"draft model": [(8, 1.1), (1, 2.0), (4, 1.4)], "medusa": [(1, 1.8), (8, 0.9)]})
    ax = fig.axes[0]
    assert ax.get_xscale() == "log"
    lines = {ln.get_label(): ln for ln in ax.lines if "no gain" not in ln.get_label()}
    assert sorted(lines) == ["draft model", "medusa"]
    np.testing.assert_allclose(lines["draft model"].get_xdata(), [1, 4, 8])
    np.testing.assert_allclose(lines["draft model"].get_ydata(), [2.0, 1.4, 1.1])
    assert lines["medusa"].get_marker() == "o"
    assert sum("no gain" in ln.get_label() for ln in ax.lines) == 1


def test_draw_medusa_tree_edges_nodes_and_mask_image():
    #        0
    #      /   \
    #     1     2
    #    / \    |
    #   3   4   5
    parents = [-1, 0, 0, 1, 1, 2]
    tokens = [10, 11, 12, 13, 14, 15]
    mask = ancestor_mask(parents)
    assert mask[3].tolist() == [True, True, False, True, False, False]
    labels = ["The", " cat", " dog", " sat", " ran", " <b>"]
    fig = viz.draw_medusa_tree(tokens, parents, torch.from_numpy(mask), labels=labels, accepted=[0, 1, 4])
    assert isinstance(fig, Figure) and len(fig.axes) == 2
    ax_t, ax_m = fig.axes
    assert len(ax_t.lines) == len(parents) - 1                                    # one edge per non-root node
    texts = [t.get_text() for t in ax_t.texts]
    assert all(lab in texts for lab in labels)
    # layout: root at the top, children one row down, a parent centred over its children
    pos = {t.get_text(): t.get_position() for t in ax_t.texts if t.get_text() in labels}
    assert pos["The"][1] == 0 and pos[" cat"][1] == -1 and pos[" sat"][1] == -2
    assert pos[" cat"][0] == (pos[" sat"][0] + pos[" ran"][0]) / 2
    assert len({pos[lab][0] for lab in (" sat", " ran", " <b>")}) == 3               # leaves do not overlap
    # the accepted path's edges are highlighted
    widths = sorted(ln.get_linewidth() for ln in ax_t.lines)
    assert widths.count(max(widths)) == 2
    assert len(ax_m.images) == 1
    np.testing.assert_array_equal(ax_m.images[0].get_array(), mask.astype(float))
    assert [t.get_text() for t in ax_m.get_xticklabels()] == [str(i) for i in range(6)]
    # numpy mask and no labels: the token ids are printed
    fig2 = viz.draw_medusa_tree(tokens, parents, mask)
    assert "15" in [t.get_text() for t in fig2.axes[0].texts]
    with pytest.raises(ValueError):
        viz.draw_medusa_tree(tokens, parents, mask[:5, :5])


def test_plot_acceptance_bars_one_bar_per_method():
    fig = viz.plot_acceptance_bars({"draft model": 0.72, "n-gram": 0.35, "medusa": 0.6})
    ax = fig.axes[0]
    assert [round(b.get_height(), 2) for b in ax.patches] == [0.72, 0.35, 0.6]
    assert [t.get_text() for t in ax.get_xticklabels()] == ["draft model", "n-gram", "medusa"]


def test_pass_cost_and_exactness_plots_draw_their_data():
    fig = viz.plot_pass_cost({1: 2.0, 2: 2.2, 4: 2.6})
    lines = fig.axes[0].get_lines()
    assert list(lines[0].get_ydata()) == pytest.approx([1.0, 1.1, 1.3]) and list(lines[1].get_ydata()) == [1, 2, 4]
    # torch, as verification gives
    fig = viz.plot_exactness(torch.tensor([0.5, 0.25, 0.25]), torch.tensor([48.0, 27.0, 25.0]))
    heights = [r.get_height() for r in fig.axes[0].patches]
    assert heights == pytest.approx([0.5, 0.25, 0.25, 0.48, 0.27, 0.25])


def test_medusa_tree_labels_whitespace_tokens_visibly():
    from minillm.viz.medusa_tree import visible_label
    assert visible_label(" ") == "\u2423" and visible_label("  ") == "\u2423\u2423"
    assert visible_label("\n") == "\\n" and visible_label("\t") == "\\t" and visible_label("") == "''"
    assert visible_label(" the") == " the" and visible_label("ab") == "ab"             # words keep their spaces
    fig = viz.draw_medusa_tree([5, 6, 7, 8], [-1, 0, 0, 1], ancestor_mask([-1, 0, 0, 1]),
                               labels=["The", " ", "\n", ""])
    texts = [t.get_text() for t in fig.axes[0].texts]
    assert "\u2423" in texts and "\\n" in texts and "''" in texts
    assert not any(t.strip() == "" for t in texts)                                  # no blank box
