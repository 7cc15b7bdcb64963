"""Fine-tuning an upcycled mixture of experts, and its dense baselines, on the same extra tokens:
`python -m minillm train --preset shakespeare-moe --init-from minillm/models/shakespeare.bin ...`.

Presets (MOE_PRESETS), all started from the trained dense model, all training the feed-forward layers only (every
other weight frozen, so the MoE file need store nothing else), all on the same batches (one seed) and schedule:
  shakespeare-moe      each FFN (hidden 768) split into 4 experts of 192 units, clustered by co-activation on
                       calibration text (minillm.moe.experts.cluster_partition), routers fitted there to the experts
                       each token needs most (router_init "fit"), top-2 routing; experts + routers train
  shakespeare-ffn384   dense at equal ACTIVE parameters per token: the FFN cut to the 384 hidden units that matter
                       most on calibration text (mean |activation| x |w2 column|), i.e. two experts' worth
  shakespeare-ffn768   the whole dense FFN fine-tuned: the same tokens with no capacity removed

The MoE loss adds the Switch load-balancing loss (Fedus et al. 2022):
    L = CE + aux_loss * mean over layers of (E * sum_e f_e * P_e)
with aux_loss = 0.01 by default, Switch's coefficient (it is 1 at uniform load, so 0.01 adds ~1% of a nat's scale);
--aux-loss 0 trains without it, for the imbalance comparison. The training loop is train.py's recipe (AdamW, warm-up
then cosine, clipping, fixed validation windows, best checkpoint kept), reusing its parts. `--compare-init` prints
the val loss at init per partition and router init; minillm.training.moe_ship ships the result with its card.
"""
from __future__ import annotations

import argparse
import json
import os
import time
from dataclasses import asdict

import numpy as np
import torch
import torch.nn.functional as F

from ..atomic import open_appending, open_replacing
from ..config import ModelConfig
from ..formats.llama2c import load_bin, save_bin
from ..formats.moe import save_moe
from ..llama.transformer import Transformer
from ..moe.experts import (
    ROUTER_INITS,
    MoEConfig,
    aux_loss,
    best_experts,
    expert_load,
    ffn_activations,
    load_imbalance,
    moe_layers,
    moe_partitions,
    reset_stats,
    upcycle,
)
from ..progress import progress
from ..threads import auto_threads, use_threads
from .train import TrainConfig, check_out_dir, eval_windows, evaluate, get_batch, lr_at, prepare_data

MOE_PRESETS = {
    "shakespeare-moe": {"kind": "moe", "n_experts": 4, "top_k": 2, "partition": "cluster", "router_init": "fit"},
    "shakespeare-ffn384": {"kind": "dense", "hidden": 384},
    "shakespeare-ffn768": {"kind": "dense", "hidden": 768},
}
CALIB_WINDOWS, CALIB_SEQ = 16, 256          # calibration text (train split) for clustering and pruning: 4,096 tokens


def calibration_tokens(train_ids: np.ndarray, seed: int = 1) -> torch.Tensor:
    """(16, 256) fixed training windows (another seed than the training batches')."""
    x, _ = get_batch(train_ids, CALIB_WINDOWS, CALIB_SEQ, np.random.default_rng(seed))
    return x


def build_moe(dense: Transformer, calib, n_experts: int = 4, top_k: int = 2, partition: str = "cluster",
              router_init: str = "fit") -> Transformer:
    """The dense model upcycled in place (experts of hidden_dim / n_experts units), partitioned and its routers
    initialised on the calibration tokens calib (B, T)."""
    cfg = MoEConfig(n_experts, top_k, dense.config.hidden_dim // n_experts, partition=partition)
    return upcycle(dense, cfg, moe_partitions(dense, cfg, calib), router_init, calib_tokens=calib)


@torch.no_grad()
def prune_ffn(dense: Transformer, calib, hidden: int) -> Transformer:
    """A copy of `dense` whose FFNs keep the `hidden` units with the largest mean |silu(w1 x) * w3 x| * |w2[:, j]|
    on the calibration tokens: the dense baseline at equal active parameters."""
    if hidden == dense.config.hidden_dim:
        return dense
    cfg = ModelConfig(**{**dense.config.to_dict(), "hidden_dim": hidden})
    small = Transformer(cfg)
    state = dense.state_dict()
    for i, (h, block) in enumerate(zip(ffn_activations(dense, calib), dense.layers)):
        score = h.abs().mean(0) * block.feed_forward.w2.weight.norm(dim=0)       # (Hd,)
        keep = score.topk(hidden).indices.sort().values                          # (hidden,)
        pre = f"layers.{i}.feed_forward."
        state[pre + "w1.weight"] = state[pre + "w1.weight"][keep]                # (hidden, C)
        state[pre + "w3.weight"] = state[pre + "w3.weight"][keep]                # (hidden, C)
        state[pre + "w2.weight"] = state[pre + "w2.weight"][:, keep]             # (C, hidden)
    small.load_state_dict(state)
    return small


def build(preset: str, init_from: str, train_ids: np.ndarray, partition: str | None = None,
          router_init: str | None = None):
    """-> (model, its trainable parameters): the FFN weights (experts and routers for the MoE); the rest frozen."""
    spec = MOE_PRESETS[preset]
    dense = load_bin(init_from)
    calib = calibration_tokens(train_ids)
    if spec["kind"] == "moe":
        model = build_moe(dense, calib, spec["n_experts"], spec["top_k"], partition or spec["partition"],
                          router_init or spec["router_init"])
    else:
        model = prune_ffn(dense, calib, spec["hidden"])
    for name, p in model.named_parameters():
        p.requires_grad_(".feed_forward." in name)
    return model, [p for p in model.parameters() if p.requires_grad]


@torch.no_grad()
def val_imbalance(model, vx) -> dict:
    """Expert load on the validation windows: per layer max/mean and coefficient of variation of tokens per expert."""
    reset_stats(model)
    evaluate(model, vx, vx)                       # targets unused here: only the routing is read
    load = expert_load(model)                                               # (L, E)
    reset_stats(model)
    return {"load": load.tolist(), **load_imbalance(load)}


def finetune(model, params, train_ids, val_ids, tc: TrainConfig, aux_coef: float, log=print, save=None,
             stop_step: int | None = None) -> dict:
    """train.py's loop on `params` only; with MoE layers, CE + aux_coef * aux_loss. The best evaluation's weights
    are restored at the end and save(model) called. stop_step: end there, on max_steps' schedule (a baseline
    matching a run that hit its time limit). -> summary (steps, tokens, seconds, val losses, imbalance at the end)."""
    os.makedirs(tc.out_dir, exist_ok=True)
    log_path = os.path.join(tc.out_dir, "log.jsonl")
    torch.manual_seed(tc.seed)
    rng = np.random.default_rng(tc.seed)
    opt = torch.optim.AdamW([{"params": [p for p in params if p.dim() >= 2], "weight_decay": tc.weight_decay},
                             {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}],
                            lr=tc.lr, betas=(0.9, 0.95))
    vx, vy = eval_windows(val_ids, tc.eval_windows, tc.seq_len)
    is_moe = bool(moe_layers(model))
    init_val = evaluate(model, vx, vy)
    log(f"step 0: val {init_val:.4f}")
    best, best_state, step, tokens, t0 = init_val, None, 0, 0, time.perf_counter()
    rows, stop = [{"step": 0, "tokens": 0, "val_loss": round(init_val, 4), "seconds": 0.0}], None
    model.train()
    bar = progress(tc.max_steps, 0, os.path.basename(os.path.normpath(tc.out_dir)))
    last = min(stop_step or tc.max_steps, tc.max_steps)
    while step < last:
        for g in opt.param_groups:
            g["lr"] = lr_at(step, tc)
        x, y = get_batch(train_ids, tc.batch_size, tc.seq_len, rng)
        logits = model(x)                                                        # (B, T, V)
        ce = F.cross_entropy(logits.flatten(0, 1), y.flatten())
        aux = aux_loss(model) if is_moe else torch.zeros(())
        loss = ce + aux_coef * aux
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, tc.grad_clip)
        opt.step()
        step, tokens = step + 1, tokens + x.numel()
        bar.update(1)
        out_of_time = tc.time_limit_s is not None and time.perf_counter() - t0 >= tc.time_limit_s
        if step % tc.eval_every == 0 or step == last or out_of_time:
            val = evaluate(model, vx, vy)
            rows.append({"step": step, "tokens": tokens, "train_loss": round(ce.item(), 4),
                         "aux_loss": round(aux.item(), 4), "val_loss": round(val, 4), "lr": lr_at(step - 1, tc),
                         "seconds": round(time.perf_counter() - t0, 1)})
            with open_appending(log_path) as f:
                f.write(json.dumps(rows[-1]) + "\n")
            log(f"step {step}: train {ce.item():.4f} aux {aux.item():.3f} val {val:.4f}")
            if val < best - 1e-4:
                best, best_state = val, {id(p): p.detach().clone() for p in params}
            if out_of_time:
                stop = "time_limit"
                break
    bar.close()
    stop = stop or ("max_steps" if last == tc.max_steps else "stop_step")
    seconds = time.perf_counter() - t0
    if best_state is not None:                     # back to the best evaluation's weights
        with torch.no_grad():
            for p in params:
                p.copy_(best_state[id(p)])
    model.eval()
    if save is not None:
        save(model)
    summary = {"stop_reason": stop, "steps": step, "tokens": tokens, "seconds": round(seconds, 1),
               "init_val_loss": init_val, "best_val_loss": best, "aux_loss_coef": aux_coef,
               "trainable_params": sum(p.numel() for p in params), "train_config": asdict(tc), "log": rows}
    if is_moe:
        summary["val_imbalance"] = val_imbalance(model, vx)
    with open_replacing(os.path.join(tc.out_dir, "summary.json"), "w") as f:
        json.dump(summary, f, indent=2)
    return summary


@torch.no_grad()
def routing_diagnostics(model, x, y) -> dict:
    """Val loss of an MoE under other routings, to tell the router's error from the experts' capacity:
    "learned" (its own top-k), "all_experts" (every expert at weight 1: the dense FFN its experts now add up to),
    "oracle" (weight 1 on minillm.moe.experts.best_experts, per token and layer: what a router would ideally pick,
    greedily layer by layer) and "random" (k experts uniformly, weight 1). x, y: (N, T) windows."""
    layers = moe_layers(model)
    E, k = layers[0].cfg.n_experts, layers[0].cfg.top_k
    g = torch.Generator().manual_seed(0)

    def pick(m, xs, choose):             # -> what route() returns, for the chosen experts at weight 1
        probs = torch.softmax(m.router(xs).float(), -1)                           # (N, E)
        experts = choose(m, xs)                                                   # (N, k')
        return probs, experts, torch.ones(experts.shape, dtype=xs.dtype)
    choices = {"all_experts": lambda m, xs: torch.arange(E).expand(xs.shape[0], E), "oracle": best_experts,
               "random": lambda m, xs: torch.rand(xs.shape[0], E, generator=g).argsort(-1)[:, :k]}
    out = {"learned": evaluate(model, x, y)}
    for name, choose in choices.items():
        for m in layers:
            m.route = lambda xs, m=m, choose=choose: pick(m, xs, choose)          # an instance attribute, for now
        try:
            out[name] = evaluate(model, x, y)
        finally:
            for m in layers:
                del m.route                                                       # back to the class's method
    return out


def compare_init(init_from: str, train_ids, val_ids, windows: int = 16) -> dict:
    """Val loss of the upcycled model before any training, per partition and router init (top-2 of 4): which split
    of the dense units loses least when half of them are switched off per token, and how close each router init
    comes to the oracle's choice (routing_diagnostics). Also the dense model's own loss."""
    vx, vy = eval_windows(val_ids, windows, 256)
    calib = calibration_tokens(train_ids)
    out = {"dense": evaluate(load_bin(init_from), vx, vy), "windows": windows}
    for partition in ("contiguous", "cluster"):
        for router in ROUTER_INITS:
            model = build_moe(load_bin(init_from), calib, partition=partition, router_init=router)
            out[f"{partition}/{router}"] = evaluate(model, vx, vy)
        out[f"{partition}/oracle"] = routing_diagnostics(model, vx, vy)["oracle"]     # the routers do not matter
    return out


# ---------------------------------------------------------------------------- CLI
def main(argv: list[str]) -> int:
    """`train --preset P`: the presets above run here; any other preset is train.py's."""
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--preset", default="shakespeare")
    if pre.parse_known_args(argv)[0].preset not in MOE_PRESETS:
        from .train import main as train_main
        return train_main(argv)
    ap = argparse.ArgumentParser(prog="python -m minillm train", description=__doc__.split("\n")[0])
    ap.add_argument("--preset", choices=sorted(MOE_PRESETS), required=True)
    ap.add_argument("--init-from", required=True, help="the trained dense model (.bin) to upcycle or fine-tune")
    ap.add_argument("--out", required=True, help="run folder: log.jsonl, summary.json, the model")
    ap.add_argument("--data-dir", default=None, help="token cache (default: <out>/../data)")
    ap.add_argument("--tokenizer", default=None, help="default: the tokenizer.bin beside --init-from")
    ap.add_argument("--aux-loss", type=float, default=0.01, help="Switch load-balancing coefficient (0: off)")
    ap.add_argument("--partition", choices=["contiguous", "cluster"], default=None, help="default: the preset's")
    ap.add_argument("--router-init", choices=list(ROUTER_INITS), default=None, help="default: the preset's")
    ap.add_argument("--stop-step", type=int, default=None,
                    help="end at this step of --max-steps' schedule (to match a run that hit --time-limit-s)")
    ap.add_argument("--compare-init", action="store_true", help="only print val losses at init, per partition")
    ap.add_argument("--force", action="store_true", help="start over in an --out that holds a run")
    ap.add_argument("--threads", type=int, default=None)
    for f in TrainConfig.__dataclass_fields__.values():
        if f.name not in ("out_dir", "kd_temperature", "kd_lambda"):
            ap.add_argument("--" + f.name.replace("_", "-"),
                            type=float if f.type in ("float", "Optional[float]") else int, default=f.default)
    a = ap.parse_args(argv)
    if a.aux_loss < 0:
        raise ValueError(f"--aux-loss must be >= 0, got {a.aux_loss}")
    use_threads(a.threads) if a.threads is not None else auto_threads()
    tokenizer = a.tokenizer or os.path.join(os.path.dirname(os.path.abspath(a.init_from)), "tokenizer.bin")
    data_dir = a.data_dir or os.path.join(os.path.dirname(os.path.abspath(a.out)), "data")
    _, train_ids, val_ids = prepare_data(data_dir, 4096, tokenizer)
    if a.compare_init:
        print(json.dumps(compare_init(a.init_from, train_ids, val_ids)))
        return 0
    check_out_dir(a.out, False, a.force)
    for name in ("log.jsonl", "summary.json"):
        if os.path.exists(os.path.join(a.out, name)):
            os.remove(os.path.join(a.out, name))
    tc = TrainConfig(out_dir=a.out, **{k: getattr(a, k) for k in TrainConfig.__dataclass_fields__
                                       if k not in ("out_dir", "kd_temperature", "kd_lambda")})
    model, params = build(a.preset, a.init_from, train_ids, a.partition, a.router_init)
    model.config.dropout = tc.dropout
    for m in model.modules():
        if isinstance(m, torch.nn.Dropout):
            m.p = tc.dropout
    is_moe = MOE_PRESETS[a.preset]["kind"] == "moe"
    out = os.path.join(a.out, "model.safetensors" if is_moe else "model.bin")
    save = (lambda m: save_moe(m, out, a.init_from)) if is_moe else (lambda m: save_bin(m, out))
    print(f"{a.preset}: {sum(p.numel() for p in params):,} trainable parameters (FFN only)"
          + (f", aux loss {a.aux_loss}" if is_moe else ""))
    summary = finetune(model, params, train_ids, val_ids, tc, a.aux_loss if is_moe else 0.0, save=save,
                       stop_step=a.stop_step)
    recipe = dict(MOE_PRESETS[a.preset], **{k: v for k, v in (("partition", a.partition),
                                                                ("router_init", a.router_init)) if v})
    summary.update(preset=a.preset, recipe=recipe, init_from=a.init_from, argv=argv)
    with open_replacing(os.path.join(a.out, "summary.json"), "w") as f:
        json.dump(summary, f, indent=2)
    print(json.dumps({k: v for k, v in summary.items() if k not in ("train_config", "log")}))
    return 0
