"""The engine's mechanisms, one concept per file, in the order a step uses them: sequences and requests, the
block manager, scheduling policies and the scheduler, the batch a step runs, the model runner (one input
builder), sampling and verification, the detokenizer and stop checks, outputs and the trace. Also the seams the
rest plugs into: SchedulingPolicy (policies), the block manager's interface, Proposer (proposer), the verify
rule, logits processors (sampling). Pure Python above minillm.llama; nothing here loads a file."""
