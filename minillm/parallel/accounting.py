"""How many bytes tensor and pipeline parallelism move: the formulas, what the wire carries, what the OS counted.

Payload per step (what rank 0 hands to its collectives; minillm.parallel.comm counts the same thing):

    broadcast   the model runner's inputs, int64: tokens and RoPE positions (B, T) each; with a KV cache also
                slot_mapping and cache positions (B, T), block_tables (B, M), context_lens (B,); the rows (N,)
                = 8 (2BT [+ 2BT + BM + B] [+ N]) bytes
    tensor parallel (p ranks):
      all_reduce  2 per layer (after attention, after the MLP), each the (B, T, C) activations: 2 L B T C e
      all_gather  the classifier's vocabulary shard of the N logit rows: N (V / p) e
    pipeline parallel (p stages), rank 0's:
      send        the (B, T, C) activations to stage 1: B T C e (every later stage sends as much to the next)
      recv        the N logit rows back from the last stage: N V e

Per decoded token (T = 1, one logit row per sequence) that is, in tensor parallelism, 2 L C e + (V / p) e plus
about 8 (6 + M) bytes of inputs: 16 KiB + 8 KiB + ~60 B for the shipped model (L 8, C 256, V 4096) in float32.

On the wire: gloo's all-reduce is a ring (Patarasuk & Yuan 2009): a reduce-scatter then an all-gather, each p - 1
rounds in which every rank sends 1/p of the tensor, so each rank sends 2 (p - 1) / p of it and the p ranks together
2 (p - 1) times the payload (p = 2: each rank sends its whole tensor, half in each phase). The ring all-gather has
each rank send its shard p - 1 times; a broadcast reaches p - 1 ranks; a send crosses once. The loopback interface
counts each byte once as sent (tx) and once as received (rx), plus TCP/IP headers and acknowledgements, which
are small once the messages are large (lo's MTU is 64 KiB).
"""
from __future__ import annotations

from typing import Optional

INT64 = 8


def input_bytes(B: int, T: int, M: int = 0, N: Optional[int] = None, kv: bool = False) -> int:
    """Bytes of the inputs rank 0 broadcasts for one forward (see the module docstring)."""
    ints = 2 * B * T + (2 * B * T + B * M + B if kv else 0) + (N if N is not None else 0)
    return INT64 * ints


def tp_step_bytes(cfg, p: int, B: int, T: int, M: int = 0, N: Optional[int] = None, kv: bool = False,
                  elem: int = 4) -> dict:
    """Payload bytes rank 0 hands to each collective in one tensor-parallel forward.
    cfg: the ModelConfig; N: logit rows asked for (None: all B T); elem: bytes per activation element."""
    rows = B * T if N is None else N
    return {"broadcast": input_bytes(B, T, M, N, kv),
            "all_reduce": 2 * cfg.n_layers * B * T * cfg.dim * elem,
            "all_gather": rows * (cfg.vocab_size // p) * elem}


def pp_step_bytes(cfg, p: int, B: int, T: int, M: int = 0, N: Optional[int] = None, kv: bool = False,
                  elem: int = 4) -> dict:
    """Payload bytes rank 0 (the first stage) hands to each op in one pipeline-parallel forward (any number of
    micro-batches: they split the same rows)."""
    rows = B * T if N is None else N
    return {"broadcast": input_bytes(B, T, M, N, kv),
            "send": B * T * cfg.dim * elem,
            "recv": rows * cfg.vocab_size * elem}


def tp_bytes_per_token(cfg, p: int, elem: int = 4, M: int = 1) -> dict:
    """Tensor parallelism per decoded token (batched decode: T = 1, one logit row per sequence, M blocks each)."""
    step = tp_step_bytes(cfg, p, 1, 1, M, 1, True, elem)
    return {"all_reduce": step["all_reduce"], "all_gather": step["all_gather"], "broadcast": step["broadcast"]}


def wire_bytes(counts: list) -> int:
    """Bytes every rank together sends for the payloads counted. counts: each rank's {op: payload bytes} (a
    collective's payload is the same on every rank, so rank 0's is used; sends are summed over the ranks)."""
    p, c = len(counts), counts[0]
    return (2 * (p - 1) * c.get("all_reduce", 0)          # ring: each rank sends 2 (p - 1) / p of the tensor
            + p * (p - 1) * c.get("all_gather", 0)        # ring: each rank sends its shard p - 1 times
            + (p - 1) * c.get("broadcast", 0)             # every other rank receives it once
            + sum(r.get("send", 0) for r in counts))      # point to point: once


def loopback_bytes() -> Optional[tuple]:
    """(rx, tx) bytes the loopback interface has counted since boot (/proc/net/dev's "lo" line), or None where there
    is no /proc/net/dev (not Linux) or no lo. Every process of the machine adds to it."""
    try:
        with open("/proc/net/dev") as f:
            for line in f:
                name, _, rest = line.partition(":")
                if name.strip() == "lo":
                    fields = rest.split()
                    return int(fields[0]), int(fields[8])
    except OSError:
        return None
    return None


# GPU projection (assumptions, stated wherever it is shown): bandwidth per direction per GPU
LINKS = {"NVLink (H100, ~450 GB/s per direction)": 450e9, "PCIe 4.0 x16 (~25 GB/s per direction)": 25e9}


def link_seconds(bytes_per_rank: float) -> dict:
    """Seconds to send bytes_per_rank over each link of LINKS at full bandwidth (latency and overlap ignored)."""
    return {name: bytes_per_rank / bw for name, bw in LINKS.items()}
