"""Notebook 06's core exercise: check_block_manager runs the reader's block manager in the engine on the hash
model's seeded schedules and names the paging mistake."""
import pytest

from minillm.core.block_manager import BlockManager
from minillm.labs import check_block_manager


class FreesSharedBlocks(BlockManager):
    def free_seq(self, seq):                    # ignores the reference count
        for b in seq.block_table:
            self.ref_count[b] = 0
            (self.evictable.__setitem__(b, None) if self.block_hash[b] is not None else self.free.append(b))
        seq.block_table, seq.num_computed = [], 0


class NoCopyOnWrite(BlockManager):
    def prepare_write(self, seq, start, end):
        self.allocate(seq, end)
        return []


class CopyKeepsReference(BlockManager):
    def prepare_write(self, seq, start, end):   # copies, but the shared block keeps seq's reference
        self.allocate(seq, end)
        copies, bs = [], self.block_size
        for i in range(start // bs, -(-end // bs)):
            b = seq.block_table[i]
            if self.ref_count[b] > 1:
                seq.block_table[i] = self._take_block()
                copies.append((b, seq.block_table[i]))
        return copies


class LeaksBlocks(BlockManager):
    def free_seq(self, seq):                    # drops the references, never returns a block to the pool
        for b in seq.block_table:
            self.ref_count[b] -= 1
        seq.block_table, seq.num_computed = [], 0


class OneTokenEarly(BlockManager):
    def allocate(self, seq, num_tokens):
        for _ in range(num_tokens // self.block_size + 1 - len(seq.block_table)):
            seq.block_table.append(self._take_block())


class OneTokenLate(BlockManager):
    def allocate(self, seq, num_tokens):
        for _ in range(num_tokens // self.block_size - len(seq.block_table)):
            seq.block_table.append(self._take_block())


class ForkWithoutReferences(BlockManager):
    def fork(self, parent, child):
        child.block_table, child.num_computed = list(parent.block_table), parent.num_computed


class CachedBlocksToFreeList(BlockManager):
    def free_seq(self, seq):
        for b in seq.block_table:
            self.ref_count[b] -= 1
            if self.ref_count[b] == 0:
                self.free.append(b)
        seq.block_table, seq.num_computed = [], 0


def mine(cls):
    """The engine's own class as a reader's subclass: checkers refuse minillm's own objects as answers."""
    return type(cls.__name__, (cls,), {})


def test_the_engine_block_manager_passes():
    result = check_block_manager(mine(BlockManager))
    assert result.passed and result.kind == "core", repr(result)


@pytest.mark.parametrize("cls,named", [
    (FreesSharedBlocks, "free a block only when it reaches 0"),
    (NoCopyOnWrite, "written without copy-on-write"),
    (CopyKeepsReference, "a reference was never dropped"),
    (LeaksBlocks, "leaking blocks (the pool is not full again)"),
    (OneTokenEarly, "a new block is taken one token early"),
    (OneTokenLate, "a new block is taken one token late"),
    (ForkWithoutReferences, "fork must add a reference"),
    (CachedBlocksToFreeList, "goes to self.evictable"),
])
def test_paging_mistakes_fail_and_are_named(cls, named):
    result = check_block_manager(cls)
    assert not result.passed and named in result.message, repr(result)


class Crashes(BlockManager):
    def fork(self, parent, child):
        self.free.clear()                       # corrupts its own pool before failing: nothing may leak out
        raise KeyError("my bug")


class Hangs(BlockManager):
    def free_seq(self, seq):
        while True:
            pass


def test_bad_block_managers_fail_cleanly_and_the_next_attempt_passes(monkeypatch):
    result = check_block_manager(Crashes)
    assert not result.passed and "KeyError: 'my bug'" in result.message and "step" in result.message, repr(result)
    assert "expected a subclass" in check_block_manager(dict).message
    import minillm.labs.common as common
    monkeypatch.setattr(common, "LIMIT_S", 1.0)
    result = check_block_manager(Hangs)
    assert not result.passed and "timed out" in result.message, repr(result)
    monkeypatch.undo()
    assert check_block_manager(mine(BlockManager)).passed


def test_the_fuzzer_hash_model_is_the_packages():
    import hashmodel

    from minillm.labs import hashmodel as packaged
    assert hashmodel.HashModel is packaged.HashModel and hashmodel.reference is packaged.reference
    assert packaged.allowed([1, 5, 7], 2)[0] == packaged.next_token([1, 5, 7])
