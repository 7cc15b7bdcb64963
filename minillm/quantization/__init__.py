"""Quantizers: turn a float model's linears into the weight types of minillm.llama.linears (int8, int4, Q8_0,
W8A8), with AWQ's searches and SmoothQuant's calibration. EngineConfig.quantization picks one (minillm.engine.parts
applies it before the engine is built)."""
