"""A checkout on PYTHONPATH=. without `pip install` (how the GPU machine runs the project): pyproject maps
minillm.kernels and minillm.viz to the top-level kernels/ and viz/ folders, which only an install does; here the
checkout's root joins the package's search path, so `import minillm.kernels` finds kernels/ there too."""
import os
import sys

_package = sys.modules[__name__.rpartition(".")[0]]
_root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if (not os.path.isdir(os.path.join(_package.__path__[0], "kernels"))
        and os.path.isfile(os.path.join(_root, "kernels", "__init__.py")) and _root not in _package.__path__):
    _package.__path__.append(_root)
