"""Progress bars (tqdm), off when MINILLM_PROGRESS=0: tests and CI set it, since nbval compares stderr."""
from __future__ import annotations

import os


def progress(total: int, initial: int = 0, desc: str = "", enabled: bool = True):
    from tqdm.auto import tqdm
    return tqdm(total=total, initial=initial, desc=desc,
                disable=not enabled or os.environ.get("MINILLM_PROGRESS", "1") == "0")
