"""The block manager: which physical KV blocks are free, who owns which, and which hold reusable prefixes.

Pure Python, no tensors (nano-vllm's BlockManager, vLLM's KVCacheManager): the scheduler asks it for
room; the model reads the block tables it fills; the engine performs the copies it asks for.

- Reference counts: a block may be in several sequences' tables. n > 1 samples `fork` the prompt's
  blocks; the first write into a shared block copies it first (copy-on-write), and the copy is
  returned as (src, dst) for the engine to apply to the K/V tensors.
- Prefix caching (enable_prefix_caching): a *full* block is named by a hash chaining its parent
  block's hash and its own token ids, so equal prefixes get equal hashes. A new prompt reuses
  every leading block whose hash (and tokens) match; a block nobody references stays cached and is
  evicted least-recently-used only when a fresh block is needed.
- Swap (swap_blocks > 0): a second pool standing for host memory; swap_out moves a sequence's blocks
  there and frees the device blocks, swap_in brings them back; both return the (src, dst) pairs.

The interface the scheduler uses (a replacement implements these; tests/test_seams.py plugs in a minimal one):
    num_blocks, block_size, num_free                 counters
    can_allocate(seq, n) / allocate_prompt(seq)      room for a prompt / take it (-> tokens found in the cache)
    write_cost(seq, start, end) / prepare_write(...) blocks that writing positions start..end-1 takes / take them,
                                                     copying shared blocks first (-> [(src, dst)] copy-on-write)
    fork(parent, child), free_seq(seq)               share all of a sequence's blocks / give them back
    truncate(seq, n)                                 keep only the blocks n tokens need (speculative rollback)
    mark_computed(seq)                               full computed blocks become reusable prefixes (may do nothing)
    drop_blocks(seq, indices)                        kv_eviction only: blocks leave the middle of a table
    can_swap_out, swap_out, swap_in, free_swap       only with swap_blocks > 0 (preemption_mode="swap")
    save() / restore(saved)                          what a failed step puts back (LLMEngine._transaction)
"""
from __future__ import annotations

import hashlib
from array import array
from collections import OrderedDict, deque
from typing import Optional

from ..kernels import cdiv
from .sequence import Sequence


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = False, swap_blocks: int = 0):
        self.num_blocks, self.block_size = num_blocks, block_size
        self.prefix_caching = enable_prefix_caching
        self.free: deque[int] = deque(range(num_blocks))    # ref 0 and holding nothing reusable
        self.ref_count = [0] * num_blocks
        self.num_shared = 0                                  # blocks in two or more tables (the trace reads it)
        self.block_hash: list = [None] * num_blocks          # hash of a full block's prefix, or None
        self.block_tokens: list = [None] * num_blocks        # its token ids, to rule out hash collisions
        self.cached: dict = {}                               # hash -> block id
        self.evictable: OrderedDict = OrderedDict()          # cached blocks with ref 0, least recent first
        self.swap_free: deque[int] = deque(range(swap_blocks))
        self.swap_blocks = swap_blocks
        self.prefix_hits = 0                                 # tokens whose K/V came from the cache
        self.num_evicted = 0                                 # blocks kv_eviction dropped from sequences

    # ------------------------------------------------------------------ counters
    @property
    def num_free(self) -> int:
        """Blocks a new sequence could get: free ones plus cached ones nobody uses (evictable)."""
        return len(self.free) + len(self.evictable)

    @property
    def num_used(self) -> int:
        return self.num_blocks - self.num_free

    @property
    def num_cached(self) -> int:
        return len(self.evictable)

    def is_cached(self, b: int) -> bool:
        """Does block b hold a named (reusable) prefix?"""
        return self.block_hash[b] is not None

    # ------------------------------------------------------------------ hashing
    @staticmethod
    def chain_hash(parent: Optional[bytes], tokens) -> bytes:
        """Name of a full block: SHA-256 of its parent's name and its token ids, so equal prefixes get equal names
        and a block's name depends on every token before it. A cryptographic hash, as vLLM uses since
        CVE-2025-25183: with Python's hash() a user could craft a prompt whose blocks collide with another
        user's prefix and be served that user's K/V."""
        h = hashlib.sha256(parent if parent is not None else b"root")
        h.update(array("q", tokens).tobytes())
        return h.digest()

    def _full_block_hashes(self, token_ids: list[int], root: Optional[bytes] = None) -> list[bytes]:
        """root: the sequence's cache_salt (its LoRA adapter), where the chain starts; None: b"root"."""
        hashes, parent, bs = [], root, self.block_size
        for i in range(len(token_ids) // bs):
            parent = self.chain_hash(parent, token_ids[i * bs:(i + 1) * bs])
            hashes.append(parent)
        return hashes

    # ------------------------------------------------------------------ allocation
    def _take_block(self) -> int:
        if self.free:
            b = self.free.popleft()
        elif self.evictable:  # evict the least recently used cached block
            b, _ = self.evictable.popitem(last=False)
            del self.cached[self.block_hash[b]]
            self.block_hash[b] = self.block_tokens[b] = None
        else:
            raise RuntimeError("out of KV blocks")
        self.ref_count[b] = 1
        return b

    def _ref(self, b: int):
        if self.ref_count[b] == 0:
            self.evictable.pop(b, None)
        self.ref_count[b] += 1
        self.num_shared += self.ref_count[b] == 2

    def _unref(self, b: int) -> bool:
        """One table lets go of block b. -> True if nobody holds it any more."""
        self.ref_count[b] -= 1
        assert self.ref_count[b] >= 0, f"block {b} freed more often than referenced"
        self.num_shared -= self.ref_count[b] == 1
        return self.ref_count[b] == 0

    def blocks_for(self, num_tokens: int) -> int:
        """Blocks that hold num_tokens tokens (the one place it is computed; block_size is this object's)."""
        return cdiv(num_tokens, self.block_size)

    def blocks_needed(self, seq: Sequence, num_tokens: int) -> int:
        """Extra blocks seq needs so that num_tokens tokens fit (ignoring prefix-cache hits)."""
        return max(0, self.blocks_for(num_tokens - seq.evicted) - len(seq.block_table))

    def can_allocate(self, seq: Sequence, num_tokens: int) -> bool:
        return self.blocks_needed(seq, num_tokens) <= self.num_free

    def allocate_prompt(self, seq: Sequence, num_tokens: Optional[int] = None) -> int:
        """Blocks for a sequence about to be prefilled from scratch (its first num_tokens tokens; default all: with
        kv_eviction only the first chunk's). With prefix caching, leading full blocks already cached are shared
        instead; returns how many tokens need no computing (always leaving the last token to compute, since its
        logits are needed)."""
        assert not seq.block_table, "allocate_prompt is for a sequence that holds no blocks"
        ids, bs = seq.token_ids, self.block_size
        hits = 0
        seq.evicted, seq.kv_scores = 0, None         # (a recompute after preemption starts with the whole prompt)
        scoring = seq.prompt_logprobs is not None and len(seq.prompt_logprobs) < len(seq.prompt_ids)
        if self.prefix_caching and not scoring:      # prompt_logprobs needs logits at every prompt position (vLLM v1)
            for i, h in enumerate(self._full_block_hashes(ids[:-1], seq.cache_salt)):  # the last is computed
                b = self.cached.get(h)
                if b is None or self.block_tokens[b] != tuple(ids[i * bs:(i + 1) * bs]):
                    break
                self._ref(b)
                seq.block_table.append(b)
                hits += bs
        self.allocate(seq, max(hits, num_tokens or len(seq)))
        self.prefix_hits += hits
        seq.num_computed = hits
        return hits

    def allocate(self, seq: Sequence, num_tokens: int):
        """Grow seq's block table until num_tokens tokens fit."""
        need = self.blocks_needed(seq, num_tokens)
        if need > self.num_free:
            raise RuntimeError(f"out of KV blocks: need {need}, {self.num_free} free")
        for _ in range(need):
            seq.block_table.append(self._take_block())

    def write_cost(self, seq: Sequence, start: int, end: int) -> int:
        """Fresh blocks that writing positions start..end-1 takes: growth plus copies of shared blocks."""
        bs, table = self.block_size, seq.block_table
        start, end = start - seq.evicted, end - seq.evicted     # kv_eviction: cache positions
        cow = sum(1 for i in range(start // bs, min(len(table), cdiv(end, bs))) if self.ref_count[table[i]] > 1)
        return self.blocks_needed(seq, end) + cow

    def prepare_write(self, seq: Sequence, start: int, end: int) -> list[tuple[int, int]]:
        """Before positions start..end-1 are written: make every block they touch private to seq.
        A shared block is copied (copy-on-write); returns the (src, dst) block copies to perform."""
        copies, bs = [], self.block_size
        self.allocate(seq, end)
        start, end = start - seq.evicted, end - seq.evicted     # kv_eviction: cache positions
        for i in range(start // bs, cdiv(end, bs)):
            b = seq.block_table[i]
            if self.ref_count[b] > 1:
                new = self._take_block()
                self._unref(b)
                seq.block_table[i] = new
                copies.append((b, new))
            elif self.block_hash[b] is not None:
                # rewriting a cached block (after a rollback): its K/V no longer stand for its hash
                if self.cached.get(self.block_hash[b]) == b:
                    del self.cached[self.block_hash[b]]
                self.block_hash[b] = self.block_tokens[b] = None
        return copies

    def mark_computed(self, seq: Sequence):
        """After a step: register seq's newly full blocks in the prefix cache."""
        if not self.prefix_caching:
            return
        ids, bs = seq.token_ids, self.block_size
        parent = seq.cache_salt                      # None, or its LoRA adapter: no block shared across adapters
        for i in range(min(seq.num_computed, len(ids)) // bs):
            b = seq.block_table[i]
            if self.block_hash[b] is not None:
                parent = self.block_hash[b]
                continue
            tokens = tuple(ids[i * bs:(i + 1) * bs])
            parent = self.chain_hash(parent, tokens)
            if parent not in self.cached:
                self.cached[parent] = b
                self.block_hash[b], self.block_tokens[b] = parent, tokens

    def fork(self, parent: Sequence, child: Sequence):
        """child shares all of parent's blocks (n > 1 samples after the prompt's prefill)."""
        child.block_table = list(parent.block_table)
        for b in child.block_table:
            self._ref(b)
        child.num_computed = parent.num_computed
        child.evicted = parent.evicted
        child.kv_scores = None if parent.kv_scores is None else parent.kv_scores.clone()

    def free_seq(self, seq: Sequence):
        for b in reversed(seq.block_table):
            if self._unref(b):
                if self.block_hash[b] is not None:
                    self.evictable[b] = None          # keep its K/V for a future prefix hit
                else:
                    self.free.append(b)
        seq.block_table = []
        seq.num_computed = 0
        seq.evicted = 0                               # its K/V are gone: a recompute starts from token 0 (H2O's
                                                      # kv_scores stay readable; allocate_prompt resets them)

    def truncate(self, seq: Sequence, num_tokens: int):
        """Rollback (speculative decoding): keep only the blocks positions < num_tokens need; the blocks
        that held rejected draft tokens go back to the pool. The caller sets seq.num_computed."""
        keep = self.blocks_for(num_tokens - seq.evicted)
        for b in reversed(seq.block_table[keep:]):
            if self._unref(b):
                self.free.append(b)     # a block past the computed tokens was never hashed
        del seq.block_table[keep:]

    def drop_blocks(self, seq: Sequence, indices: list[int]) -> list[int]:
        """kv_eviction (minillm.kv_eviction): the blocks at these indices of seq's table leave it, full blocks
        only; the tokens after them move up to fill the gap (seq.evicted counts the tokens gone). -> freed ids."""
        freed = []
        for i in sorted(indices, reverse=True):
            b = seq.block_table.pop(i)
            if self._unref(b):
                self.free.append(b)       # eviction excludes prefix caching: no block is named
                freed.append(b)
        seq.evicted += len(indices) * self.block_size
        self.num_evicted += len(indices)
        return freed

    # ------------------------------------------------------------------ swap
    def can_swap_out(self, seq: Sequence) -> bool:
        return len(seq.block_table) <= len(self.swap_free)

    def swap_out(self, seq: Sequence) -> list[tuple[int, int]]:
        """Move seq's blocks to the swap pool. Returns (device block, swap block) pairs to copy."""
        if not self.can_swap_out(seq):
            raise RuntimeError(f"swap space full: need {len(seq.block_table)} blocks, {len(self.swap_free)} free")
        pairs = [(b, self.swap_free.popleft()) for b in seq.block_table]
        computed = seq.num_computed
        self.free_seq(seq)
        seq.swap_table = [s for _, s in pairs]
        seq.num_computed = computed
        return pairs

    def can_swap_in(self, seq: Sequence) -> bool:
        return len(seq.swap_table) <= self.num_free

    def swap_in(self, seq: Sequence) -> list[tuple[int, int]]:
        """Bring seq's blocks back. Returns (swap block, device block) pairs to copy."""
        if not self.can_swap_in(seq):
            raise RuntimeError(f"out of KV blocks to swap in: need {len(seq.swap_table)}, {self.num_free} free")
        pairs = [(s, self._take_block()) for s in seq.swap_table]
        seq.block_table = [b for _, b in pairs]
        self.swap_free.extend(s for s, _ in pairs)
        seq.swap_table = []
        return pairs

    def free_swap(self, seq: Sequence):
        """Drop a swapped-out sequence's blocks in the swap space (it finished or was aborted)."""
        self.swap_free.extend(seq.swap_table)
        seq.swap_table = []

    # ------------------------------------------------------------------ a failed step
    def save(self) -> tuple:
        """What a step may change, for restore() if it fails. A step's update gives blocks back and names them but
        never takes one, so the free lists only grow in it (kept as lengths) and the cache only gains names."""
        return (list(self.ref_count), list(self.block_hash), list(self.block_tokens), len(self.free),
                len(self.evictable), len(self.swap_free), self.num_shared, self.prefix_hits, self.num_evicted)

    def restore(self, saved: tuple):
        ref, hashes, tokens, free, evictable, swap_free, *counts = saved
        for h, b in [(h, b) for h, b in self.cached.items() if hashes[b] != h]:
            del self.cached[h]                        # named since save(): unnamed again
        for grown, n, pop in [(self.free, free, self.free.pop), (self.evictable, evictable, self.evictable.popitem),
                              (self.swap_free, swap_free, self.swap_free.pop)]:
            assert len(grown) >= n, "a block was taken after save(): restore() cannot put it back"
            for _ in range(len(grown) - n):
                pop()
        self.ref_count[:], self.block_hash[:], self.block_tokens[:] = ref, hashes, tokens
        self.num_shared, self.prefix_hits, self.num_evicted = counts

    def check(self, seqs):
        """Invariant check for tests: reference counts equal table occurrences; nothing lost or doubled."""
        counts = [0] * self.num_blocks
        for s in seqs:
            for b in s.block_table:
                counts[b] += 1
        assert counts == self.ref_count, "reference counts do not match the block tables"
        free, evict = set(self.free), set(self.evictable)
        assert len(free) == len(self.free) and not free & evict
        for b in range(self.num_blocks):
            assert (counts[b] == 0) == (b in free or b in evict), f"block {b}: ref {counts[b]}, free/evictable mismatch"
        assert all(self.block_hash[b] == h for h, b in self.cached.items())
        assert len(self.swap_free) + sum(len(getattr(s, "swap_table", [])) for s in seqs) == self.swap_blocks
