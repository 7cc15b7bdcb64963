"""Files in and out: llama2.c checkpoints (v0) and runq.c's Q8_0 files, Hugging Face Llama directories, and
minillm.load, which sniffs which one a path is. Builds models from minillm.llama; knows nothing of the engine."""
