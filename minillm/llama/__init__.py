"""The Llama model from scratch and its numerics: the transformer (RMSNorm, RoPE, GQA attention, SwiGLU),
attention over the paged KV pool, the KV pool itself, the tokenizer (llama2.c's, and BPE training for it), and the
weight types a linear layer may hold (int8, int4, Q8_0, W8A8, AWQ). The bottom layer: it imports only
minillm.config and minillm.kernels."""
