"""`python -m minillm run`: llama2.c's run.c, flag for flag and byte for byte (FORMATS.md).

    run CKPT [-z tokenizer] [-t temperature] [-p topp] [-s seed] [-n steps] [-i prompt]

Greedy stdout equals run.c's plain build on the same files: the prompt is echoed, one leading space
is dropped after BOS, <0xXX> pieces print as raw bytes, unprintable single bytes are dropped, BOS
stops generation, -n counts prompt positions, a newline ends the output. `achieved tok/s` goes to
stderr, timed as run.c times it (clock started after the first forward, prompt positions counted).
This is batch-1 decoding through the same model and KV pool as the engine (one block of seq_len).
"""
from __future__ import annotations

import sys
import time

import torch

from ..backends.capabilities import backend_model, choose_backend
from ..config import EngineConfig
from ..core.sampling import RunCSampler
from ..formats.loader import load_checkpoint
from ..llama.attention import AttentionMetadata
from ..llama.kv_cache import KVCache
from ..llama.tokenizer import BOS, Tokenizer
from ..threads import auto_threads


def decode_loop(model, tokenizer: Tokenizer, sampler, prompt: str, steps: int, write=None, stop_at_bos: bool = True):
    """run.c's generate(): writes bytes through `write`, returns (tokens, tok/s). stop_at_bos=False keeps
    decoding past BOS, so a benchmark always times `steps` positions whatever the weights produce."""

    cfg = model.config
    if steps <= 0 or steps > cfg.max_seq_len:
        steps = cfg.max_seq_len
    prompt_ids = tokenizer.encode(prompt, bos=True, eos=False, c_string=True)
    kv = KVCache(cfg, num_blocks=1, block_size=cfg.max_seq_len, dtype=next(model.parameters()).dtype,
                 device=getattr(model, "device", "cpu"))                  # backend='cuda': the pool on the GPU
    table = torch.zeros(1, 1, dtype=torch.long)                     # (B=1, M=1): the contiguous cache
    token, pos, start, out = prompt_ids[0], 0, None, [prompt_ids[0]]
    fast = hasattr(model, "decode_step")    # the numba backend's compiled batch-1 step
    with torch.inference_mode():
        while pos < steps:
            if fast:                                                 # numba: one compiled call, argmax included
                logits, best = model.decode_step(token, pos, kv)
            else:
                positions = torch.tensor([[pos]])                    # (1, 1)
                attn = AttentionMetadata(positions, table, torch.tensor([pos + 1]), positions)  # slot = pos
                logits = model(torch.tensor([[token]]), positions, kv, attn, rows=torch.tensor([0]))[0].float().numpy()
                best = None
            if pos < len(prompt_ids) - 1:
                nxt = prompt_ids[pos + 1]
            else:
                nxt = best if best is not None and sampler.temperature == 0 else sampler(logits)   # (V,) numpy
            pos += 1
            if nxt == BOS and stop_at_bos:
                break
            if write is not None:
                write(tokenizer.printable(tokenizer.piece_bytes(token, nxt)))
            token = nxt
            out.append(nxt)
            if start is None:
                start = time.perf_counter()
    if write is not None:
        write(b"\n")
    tok_s = (pos - 1) / (time.perf_counter() - start) if pos > 1 and start else 0.0
    return out, tok_s


def main(argv: list[str]) -> int:
    usage = ("Usage:   python -m minillm run <checkpoint> [options]\n"
             "Example: python -m minillm run model.bin -n 256 -i \"Once upon a time\"\n"
             "Options:\n  -t <float>  temperature in [0,inf], default 1.0\n"
             "  -p <float>  p value in top-p (nucleus) sampling in [0,1] default 0.9\n"
             "  -s <int>    random seed, default time(NULL)\n"
             "  -n <int>    number of steps to run for, default 256. 0 = max_seq_len\n"
             "  -i <string> input prompt\n  -z <string> optional path to custom tokenizer\n"
             "  --backend <auto|torch|numba|cuda>  the kernel backend (the engine's option), default auto\n")
    if not argv or argv[0] in ("-h", "--help"):
        sys.stderr.write(usage)
        return 1
    ckpt, backend = argv[0], "auto"
    opts = {"t": "1.0", "p": "0.9", "s": "0", "n": "256", "i": "", "z": "tokenizer.bin", "m": "generate"}
    rest = argv[1:]
    if len(rest) % 2:
        sys.stderr.write(usage)
        return 1
    for flag, value in zip(rest[::2], rest[1::2]):
        if flag == "--backend":
            if value not in ("auto", "torch", "numba", "cuda"):
                sys.stderr.write(f"backend {value!r} is not available; use auto, torch, numba or cuda\n")
                return 1
            backend = value
            continue
        if len(flag) != 2 or flag[0] != "-" or flag[1] not in "tpsnizmy":
            sys.stderr.write(usage)
            return 1
        opts[flag[1]] = value
    if opts["m"] != "generate":
        sys.stderr.write(f"mode {opts['m']!r} is not supported; only generate\n")
        return 1
    temperature, topp = max(0.0, float(opts["t"])), float(opts["p"])
    if topp < 0.0 or topp > 1.0:
        topp = 0.9
    seed = int(opts["s"])
    if seed <= 0:
        seed = int(time.time())
    model = load_checkpoint(ckpt)
    try:
        backend, _ = choose_backend(EngineConfig(backend=backend), None, model)   # "auto": numba on a CPU
        model = backend_model(model, backend)
    except ValueError as e:          # e.g. backend='cuda' with no GPU
        sys.stderr.write(f"{e}\n")
        return 1
    tokenizer = Tokenizer.load(opts["z"], model.config.vocab_size)
    auto_threads()           # the free cores: a busy core would make a thread pool spin-wait
    if backend == "numba":   # numba's OpenMP threads do the work; torch's would only spin against them
        torch.set_num_threads(1)

    def stdout(b):
        return sys.stdout.buffer.write(b), sys.stdout.buffer.flush()
    _, tok_s = decode_loop(model, tokenizer, RunCSampler(temperature, topp, seed), opts["i"], int(opts["n"]), stdout)
    if tok_s:
        sys.stderr.write(f"achieved tok/s: {tok_s:f}\n")
    return 0
