"""Speculative decoding, plugged into the engine's Proposer seam: its config, the n-gram, draft-model and Medusa
proposers (heads, tree), and the acceptance-rate and speedup model. The verification rule is the engine's own
(minillm.core.verify): plain decoding is speculation with k = 0."""
