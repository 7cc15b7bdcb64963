"""Parallelism: the same engine on several torch.distributed ranks (DESIGN.md).

    group = start_group(2)                              # rank 0 is this process; rank 1 a spawned one (gloo)
    LLM("shakespeare", tensor_parallel_size=2)          # or pipeline_parallel_size=2: the engine's forward, split
    TensorParallelModel(model, group)(tokens)           # the forward alone; PipelineParallelModel(..., micro_batches=4)
    group.comm.totals, group.comm.steps                 # payload bytes per collective (accounting.py: the formulas)
    with group.recording() as rec: ...                  # every rank's compute and communication events (timeline.py)
"""
from .accounting import input_bytes, pp_step_bytes, tp_bytes_per_token, tp_step_bytes, wire_bytes
from .group import RankFailure, RankGroup, current_group, start_group
from .sharded import ParallelModel, PipelineParallelModel, TensorParallelModel
from .timeline import Event, bubble, gpipe_bubble

__all__ = ["RankGroup", "RankFailure", "start_group", "current_group", "ParallelModel", "TensorParallelModel",
           "PipelineParallelModel", "Event", "bubble", "gpipe_bubble", "input_bytes", "tp_step_bytes",
           "pp_step_bytes", "tp_bytes_per_token", "wire_bytes"]
