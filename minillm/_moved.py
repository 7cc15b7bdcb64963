"""Old import paths from before minillm's subpackages (minillm.scheduler, minillm.quant, ...). A module that moved
whole still imports for one release, with a DeprecationWarning naming its new path; a module that was split into
several fails with an ImportError naming where each part went."""
from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
import warnings

MOVED = {
    "minillm.sysinfo": "minillm.bench.sysinfo", "minillm.model": "minillm.llama.transformer",
    "minillm.attention": "minillm.llama.attention", "minillm.kv_cache": "minillm.llama.kv_cache",
    "minillm.tokenizer": "minillm.llama.tokenizer", "minillm.bpe": "minillm.formats.bpe",
    "minillm.checkpoint": "minillm.formats.llama2c", "minillm.runq": "minillm.formats.runq",
    "minillm.hf": "minillm.formats.hf", "minillm.loader": "minillm.formats.loader",
    "minillm.sequence": "minillm.core.sequence", "minillm.block_manager": "minillm.core.block_manager",
    "minillm.scheduler": "minillm.core.scheduler", "minillm.sampling": "minillm.core.sampling",
    "minillm.outputs": "minillm.core.outputs", "minillm.trace": "minillm.core.trace",
    "minillm.model_runner": "minillm.core.model_runner", "minillm.speculative": "minillm.spec_decode.config",
    "minillm.acceptance": "minillm.spec_decode.acceptance", "minillm.numba_model": "minillm.backends.numba_model",
    "minillm.cuda_model": "minillm.backends.cuda_model", "minillm.llm": "minillm.engine.llm",
    "minillm.runc": "minillm.engine.runc", "minillm.bench_quant": "minillm.bench.quant",
    "minillm.bench_serve": "minillm.bench.serve", "minillm.bench_spec": "minillm.bench.spec",
    "minillm.profiling": "minillm.bench.profiling", "minillm.roofline": "minillm.bench.roofline",
    "minillm.data": "minillm.training.data",
    "minillm.train": "minillm.training.train", "minillm.ship": "minillm.training.ship",
    "minillm.exercises": "minillm.labs", "minillm.student": "minillm.labs.student",
    # plug-ins that left the minimal engine (core/): each imports core, core never imports it
    "minillm.core.beam": "minillm.decoding.beam", "minillm.core.radix": "minillm.scheduling.radix",
    "minillm.core.orders": "minillm.scheduling.orders", "minillm.core.kv_eviction": "minillm.kv_eviction.policies",
    "minillm.llama.lora": "minillm.lora.adapters", "minillm.llama.moe": "minillm.moe.experts",
    "minillm.llama.bpe": "minillm.formats.bpe",     # training a vocabulary: a tokenizer file's maker, not the model
    "minillm.bench.workload": "minillm.workload",   # a lower layer that bench, cluster and labs share
}
SPLIT = {
    "minillm.quant": "weight types (Int8Linear, Int4Linear, Q80Linear, W8A8Linear, AWQLinear) to "
                     "minillm.llama.linears; quantize_model and SCHEMES to minillm.quantization.quantize; "
                     "AWQ's search to minillm.quantization.awq; calibration and SmoothQuant's factors to "
                     "minillm.quantization.calibration",
    "minillm.medusa": "MedusaHeads and its file format to minillm.spec_decode.medusa_heads; the candidate tree "
                      "(build_tree, greedy_accept, DEFAULT_CHOICES) to minillm.spec_decode.medusa_tree; training "
                      "(train_medusa, head_accuracy, the CLI) to minillm.training.medusa",
    "minillm.proposers": "the proposer interface to minillm.core.proposer; ngram_lookup and the n-gram proposer to "
                         "minillm.spec_decode.ngram; the draft model to minillm.spec_decode.draft_model; Medusa to "
                         "minillm.spec_decode.medusa",
}


class MovedFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname, path, target=None):
        if fullname in MOVED or fullname in SPLIT:
            return importlib.util.spec_from_loader(fullname, self)
        return None

    def create_module(self, spec):
        if spec.name in SPLIT:
            raise ImportError(f"{spec.name} was split when minillm grew subpackages: {SPLIT[spec.name]}",
                              name=spec.name)
        new = MOVED[spec.name]
        warnings.warn(f"{spec.name} moved to {new}; the old path goes away in the next release", DeprecationWarning,
                      stacklevel=2)
        return importlib.import_module(new)

    def exec_module(self, module):
        pass


def install():
    if not any(isinstance(f, MovedFinder) for f in sys.meta_path):
        sys.meta_path.append(MovedFinder())
