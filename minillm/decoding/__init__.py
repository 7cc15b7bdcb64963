"""Decoding strategies beyond sampling, plugged into the one engine path: beam search (beam groups the scheduler
runs whole, and the post-processor that picks the beams after verification)."""
from .beam import BeamGroup, BeamOptions, BeamSearchOutput, BeamSearchSequence, BeamStep, beam_step

__all__ = ["BeamGroup", "BeamOptions", "BeamSearchOutput", "BeamSearchSequence", "BeamStep", "beam_step"]
