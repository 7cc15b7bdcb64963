"""The block manager: which physical KV blocks are free, and which sequence owns which (nano-vllm style).

Pure Python, no tensors: the scheduler asks it for room, the model reads the block tables it fills.
Reference counts are kept from the start so that sharing (copy-on-write for n > 1, prefix caching)
can be added on top without changing how blocks are owned and freed.
"""
from __future__ import annotations

from collections import deque

from .sequence import Sequence


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int):
        self.num_blocks, self.block_size = num_blocks, block_size
        self.free: deque[int] = deque(range(num_blocks))
        self.ref_count = [0] * num_blocks

    @property
    def num_free(self) -> int:
        return len(self.free)

    @property
    def num_used(self) -> int:
        return self.num_blocks - len(self.free)

    def blocks_needed(self, seq: Sequence, num_tokens: int) -> int:
        """Extra blocks seq needs so that num_tokens tokens fit."""
        return max(0, -(-num_tokens // self.block_size) - len(seq.block_table))

    def can_allocate(self, seq: Sequence, num_tokens: int) -> bool:
        return self.blocks_needed(seq, num_tokens) <= len(self.free)

    def allocate(self, seq: Sequence, num_tokens: int):
        """Grow seq's block table until num_tokens tokens fit."""
        need = self.blocks_needed(seq, num_tokens)
        if need > len(self.free):
            raise RuntimeError(f"out of KV blocks: need {need}, {len(self.free)} free")
        for _ in range(need):
            b = self.free.popleft()
            self.ref_count[b] = 1
            seq.block_table.append(b)

    def free_seq(self, seq: Sequence):
        for b in reversed(seq.block_table):
            self.ref_count[b] -= 1
            if self.ref_count[b] == 0:
                self.free.append(b)
        seq.block_table = []
        seq.num_computed = 0
