"""Where the package's own files are. The bottom of the import graph: it imports nothing from minillm, so any
module may use it (quant.py needs the sample text, and importing loader for it closed an import circle)."""
from __future__ import annotations

import os

PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))
MODELS_DIR = os.path.join(PACKAGE_DIR, "models")                  # shipped checkpoints (see MODEL_CARD.md there)
SAMPLE_TEXT = os.path.join(PACKAGE_DIR, "data", "sample.txt")     # the packaged Hamlet excerpt
