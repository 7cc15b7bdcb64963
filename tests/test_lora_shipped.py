"""The shipped LoRA adapters (minillm/models/lora/): they load, their PEFT config says what the card says, they are
small, and each lowers its own genre's held-out loss on the shipped held-out slice (the card's numbers): text from the
second halves of the genre's unseen plays, the adapter having trained on the first halves (minillm.training.lora)."""
import json
import os

import pytest
from safetensors import safe_open

from minillm.formats.loader import MODELS_DIR, load
from minillm.formats.peft import CONFIG, WEIGHTS, load_adapter, resolve_adapter, shipped_adapters
from minillm.training.lora import SLICES, slice_losses

CARD = json.load(open(os.path.join(MODELS_DIR, "card.json")))["lora"]
HF_NAMES = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "down_proj", "up_proj"]


@pytest.fixture(scope="module")
def shakespeare():
    return load("shakespeare")


def test_three_adapters_ship_one_per_genre():
    assert shipped_adapters() == sorted(SLICES)
    assert set(CARD["adapters"]) == set(SLICES)


@pytest.mark.parametrize("name", SLICES)
def test_a_shipped_adapter_loads_and_its_config_matches_the_card(shakespeare, name):
    model, _ = shakespeare
    path = resolve_adapter(name)
    config, entry = json.load(open(os.path.join(path, CONFIG))), CARD["adapters"][name]
    assert config["peft_type"] == "LORA" and config["task_type"] == "CAUSAL_LM"
    assert (config["r"], config["lora_alpha"]) == (entry["rank"], entry["alpha"]) == (8, 16)
    assert config["target_modules"] == HF_NAMES and config["base_model_name_or_path"] == "shakespeare"
    size = os.path.getsize(os.path.join(path, WEIGHTS))
    assert size == entry["file_bytes"] and size < 1_000_000
    with safe_open(os.path.join(path, WEIGHTS), "pt") as f:
        assert len(list(f.keys())) == 2 * len(HF_NAMES) * model.config.n_layers
    adapter = load_adapter(name, model.config, max_rank=16)
    assert adapter.rank == 8 and adapter.scaling == 2.0 and adapter.nbytes == entry["adapter_bytes_fp32"]
    assert adapter.weights[(0, "attention.wq")][1].abs().max() > 0       # trained: B moved from its zero init


def test_each_adapter_lowers_its_own_genres_heldout_loss(shakespeare):
    model, tok = shakespeare
    texts = {g: open(os.path.join(MODELS_DIR, "lora", f"val_{g}.txt"), encoding="utf-8").read() for g in SLICES}
    base = slice_losses(model, {}, texts, tok)["base"]
    for g in SLICES:
        own = slice_losses(model, {g: load_adapter(g, model.config)}, {g: texts[g]}, tok)[g][g]
        assert own < base[g], f"the {g} adapter: {own:.4f} on its held-out slice, the base model {base[g]:.4f}"
        # the card's numbers, measured by the same code: float32 sums in another order differ by ~1e-6
        assert abs(own - CARD["table_slices"][g][g]) < 1e-3 and abs(base[g] - CARD["table_slices"]["base"][g]) < 1e-3


def test_every_work_of_the_corpus_has_its_first_folio_genre_or_none():
    from minillm.training.data import VAL_WORKS
    from minillm.training.lora import GENRES
    corpus = json.load(open(os.path.join(MODELS_DIR, "card.json")))["corpus"]
    works = corpus["train_works"] + corpus["val_works"]
    assert set(GENRES) <= set(works)                                      # no typo in the table
    outside = {"sonnets", "rape_of_lucrece", "phoenix_and_the_turtle", "lovers_complaint", "passionate_pilgrim",
               "pericles"}                                                # not in the First Folio
    assert set(works) - set(GENRES) == outside
    assert {w: GENRES[w] for w in VAL_WORKS} == {"twelfth_night": "comedies", "tempest": "comedies",
                                                 "julius_caesar": "tragedies", "richard_ii": "histories"}
    assert [sum(g == s for g in GENRES.values()) for s in SLICES] == [14, 12, 10]   # the Folio's 14 / 11 + Troilus / 10
