"""Training: a few steps lower the loss; resuming continues the same run; distillation's loss is right."""
import json
import os

import numpy as np
import pytest
import torch

from minillm.config import ModelConfig
from minillm.formats.loader import SAMPLE_TEXT, sample_tokenizer
from minillm.training.train import TrainConfig, kd_loss, lr_at, train, unigram_loss


@pytest.fixture(scope="module")
def tokens():
    tok = sample_tokenizer(300)
    ids = np.asarray(tok.encode(open(SAMPLE_TEXT).read()), dtype=np.uint16)
    return ids[: int(len(ids) * 0.9)], ids[int(len(ids) * 0.9):]


def tiny_cfg():
    return ModelConfig(dim=32, hidden_dim=64, n_layers=1, n_heads=2, n_kv_heads=1, vocab_size=300, max_seq_len=64)


def test_training_lowers_the_loss_and_beats_unigram(tmp_path, tokens):
    tr, va = tokens
    tc = TrainConfig(out_dir=str(tmp_path), batch_size=8, seq_len=32, lr=3e-3, warmup_steps=10, max_steps=120,
                     eval_every=40, eval_windows=8, patience=10, dropout=0.0)
    s = train(tiny_cfg(), tr, va, tc, log=lambda *_: None)
    rows = [json.loads(line) for line in open(tmp_path / "log.jsonl")]
    assert [r["step"] for r in rows] == [40, 80, 120]
    assert rows[-1]["val_loss"] < rows[0]["val_loss"] < np.log(300)  # below a uniform guess, and improving
    assert s["best_val_loss"] < unigram_loss(tr, va, 300)            # learned context, not just frequencies
    assert os.path.exists(tmp_path / "model.bin") and s["tokens"] == 120 * 8 * 32


def test_resume_equals_uninterrupted(tmp_path, tokens):
    tr, va = tokens
    kw = dict(batch_size=4, seq_len=16, warmup_steps=2, max_steps=12, eval_every=6, eval_windows=4, patience=9, seed=3)
    full = train(tiny_cfg(), tr, va, TrainConfig(out_dir=str(tmp_path / "a"), **kw), log=lambda *_: None)
    class Interrupted(Exception):
        pass

    def die(msg):  # the session ends right after the step-6 checkpoint is written
        raise Interrupted(msg)

    with pytest.raises(Interrupted, match="step 6"):
        train(tiny_cfg(), tr, va, TrainConfig(out_dir=str(tmp_path / "b"), **kw), log=die)
    again = train(tiny_cfg(), tr, va, TrainConfig(out_dir=str(tmp_path / "b"), **kw), resume=True, log=lambda *_: None)
    assert again["steps"] == 12 and again["best_val_loss"] == pytest.approx(full["best_val_loss"], abs=1e-6)


def test_early_stopping_after_patience(tmp_path, tokens):
    tr, va = tokens
    tc = TrainConfig(out_dir=str(tmp_path), batch_size=4, seq_len=16, lr=1e-9, min_lr=1e-9, warmup_steps=1,
                     max_steps=1000, eval_every=2, eval_windows=4, patience=3)
    s = train(tiny_cfg(), tr, va, tc, log=lambda *_: None)
    assert s["stop_reason"] == "early_stopping" and s["steps"] <= 2 * 4  # first eval sets best, 3 more fail


def test_schedule_and_kd_loss():
    tc = TrainConfig(lr=1.0, min_lr=0.1, warmup_steps=10, max_steps=110)
    assert lr_at(0, tc) == pytest.approx(0.1) and lr_at(9, tc) == pytest.approx(1.0)
    assert lr_at(60, tc) == pytest.approx(0.55) and lr_at(110, tc) == pytest.approx(0.1)
    g = torch.Generator().manual_seed(0)
    s, t = torch.randn(2, 3, 7, generator=g), torch.randn(2, 3, 7, generator=g)
    y = torch.randint(0, 7, (2, 3), generator=g)
    ce = torch.nn.functional.cross_entropy(s.flatten(0, 1), y.flatten())
    assert kd_loss(t, t, y, 2.0, 0.5).item() == pytest.approx(
        0.5 * torch.nn.functional.cross_entropy(t.flatten(0, 1), y.flatten()).item(), abs=1e-6)
    p, logq = torch.softmax(t / 2, -1), torch.log_softmax(s / 2, -1)
    kl = (p * (p.log() - logq)).sum(-1).mean()
    assert kd_loss(s, t, y, 2.0, 0.5).item() == pytest.approx(4 * kl.item() + 0.5 * ce.item(), rel=1e-5)


def test_bad_train_config():
    with pytest.raises(ValueError, match="TrainConfig.dropout"):
        TrainConfig(dropout=1.0)
    with pytest.raises(ValueError, match="TrainConfig.batch_size"):
        TrainConfig(batch_size=0)


def test_resume_without_state_says_so(tmp_path, tokens):
    tr, va = tokens
    with pytest.raises(FileNotFoundError, match="--resume: no saved state at .*state.pt"):
        train(tiny_cfg(), tr, va, TrainConfig(out_dir=str(tmp_path)), resume=True, log=lambda *_: None)


class Planted:
    """What a planted state.pt can hold: unpickling it calls open(marker, "w"), i.e. runs code."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (open, (self.marker, "w"))


def test_resume_reads_state_with_weights_only_and_refuses_code(tmp_path, tokens):
    tr, va = tokens
    kw = dict(batch_size=2, seq_len=8, warmup_steps=1, max_steps=2, eval_every=2, eval_windows=2, patience=9)
    train(tiny_cfg(), tr, va, TrainConfig(out_dir=str(tmp_path / "a"), **kw), log=lambda *_: None)
    st = torch.load(tmp_path / "a" / "state.pt", weights_only=True)    # a genuine state file is plain data
    assert st["step"] == 2
    marker = tmp_path / "pwned"
    torch.save({**st, "model": Planted(str(marker))}, tmp_path / "a" / "state.pt")
    with pytest.raises(ValueError, match=r"state.pt: refusing to unpickle .*weights_only"):
        train(tiny_cfg(), tr, va, TrainConfig(out_dir=str(tmp_path / "a"), **kw), resume=True, log=lambda *_: None)
    assert not marker.exists()


def test_train_cli_refuses_an_existing_run_unless_forced(tmp_path, tokens, capsys):
    """`train --out DIR` on a finished run: refused, naming DIR; --resume continues it; --force starts over."""
    from minillm.formats.loader import sample_tokenizer
    from minillm.training.train import _sha256, main
    tr, va = tokens
    data = tmp_path / "data"                       # a token cache prepare_data accepts as is: no corpus build
    data.mkdir()
    sample_tokenizer(300).save(str(data / "tokenizer.bin"))
    np.save(data / "train.npy", tr), np.save(data / "val.npy", va)
    (data / "corpus.json").write_text(json.dumps({"tokenizer_sha256": _sha256(str(data / "tokenizer.bin"))}))
    argv = ["--preset", "tiny", "--out", str(tmp_path / "run"), "--data-dir", str(data), "--vocab-size", "300",
            "--batch-size", "2", "--seq-len", "8", "--warmup-steps", "1", "--max-steps", "2", "--eval-every", "1",
            "--eval-windows", "2"]
    assert main(argv) == 0
    assert len(open(tmp_path / "run" / "log.jsonl").readlines()) == 2
    with pytest.raises(ValueError, match=rf"{tmp_path / 'run'} already holds a run \(state.pt, model.bin\)"
                                         r".*--resume.*--out.*--force"):
        main(argv)
    assert len(open(tmp_path / "run" / "log.jsonl").readlines()) == 2  # untouched
    assert main(argv + ["--max-steps", "3", "--resume"]) == 0
    assert len(open(tmp_path / "run" / "log.jsonl").readlines()) == 3  # continued
    assert main(argv + ["--force"]) == 0
    assert len(open(tmp_path / "run" / "log.jsonl").readlines()) == 2  # started over
