"""Writes that cannot escape their folder: each file is written to a temporary file beside it, then os.replace()d
into place. A symlink already at the target is replaced by the new file, never followed to overwrite what it
points to; a write that fails leaves the old file (and no half-written one)."""
from __future__ import annotations

import os
import tempfile
from typing import Callable


def write_replacing(target: str, write: Callable[[str], None]):
    """write(tmp_path) writes the file's content to tmp_path; the result then replaces `target` in one rename."""
    folder, name = os.path.split(os.path.abspath(target))
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{name}.", suffix=".tmp")
    os.close(fd)
    try:
        write(tmp)
        os.replace(tmp, target)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise


def write_text_replacing(target: str, text: str):
    def write(tmp):
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)
    write_replacing(target, write)
