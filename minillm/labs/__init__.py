"""Checkers for the notebooks' "your turn" exercises, one module per notebook.

A notebook exercise is a function the reader writes between `### BEGIN SOLUTION` and
`### END SOLUTION`; the next cell calls a checker from here on it. A checker compares the reader's
function with the engine's own code on a few inputs (odd shapes included), never raises, and returns
an ExerciseResult whose text says pass or fail and why. `make student` removes the solutions;
tests/test_exercises.py shows that every checker fails on the empty stub and passes on the solution.
"""
from .common import CHECKERS, ExerciseResult, checker
from .nb00_tour import *  # noqa: F401,F403
from .nb01_model import *  # noqa: F401,F403
from .nb02_kv_cache import *  # noqa: F401,F403
from .nb03_kernels import *  # noqa: F401,F403
from .nb04_flash_attention import *  # noqa: F401,F403
from .nb05_batching import *  # noqa: F401,F403
from .nb06_paged_attention import *  # noqa: F401,F403
from .nb07_quantization import *  # noqa: F401,F403
from .nb08_speculative import *  # noqa: F401,F403
from .nb09_training import *  # noqa: F401,F403
from .nb10_decoding import *  # noqa: F401,F403
from .nb11_scheduling import *  # noqa: F401,F403
from .nb12_parallelism import *  # noqa: F401,F403
from .nb13_sparsity import *  # noqa: F401,F403
from .nb14_long_context import *  # noqa: F401,F403
from .nb15_moe_lora import *  # noqa: F401,F403
from .nb16_capstone import *  # noqa: F401,F403

globals().update(CHECKERS)          # every check_* by name: from minillm.labs import check_rope
__all__ = ["CHECKERS", "ExerciseResult", "checker", *CHECKERS]
