"""LoRA adapters: low-rank deltas on the linears, per-row slots in a batch (a plug-in of the model)."""
