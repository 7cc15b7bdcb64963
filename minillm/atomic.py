"""Writes that cannot escape their folder: each file is written to a temporary file beside it, then os.replace()d
into place. A symlink already at the target is replaced by the new file, never followed to overwrite what it
points to; a write that fails leaves the old file (and no half-written one). Every writer of the package uses it
(checkpoints, tokenizers, exports, training outputs, model cards, the student edition)."""
from __future__ import annotations

import os
import shutil
import tempfile
from contextlib import contextmanager
from typing import Callable


@contextmanager
def _replacing(target):
    """-> a temporary path beside target, which replaces target when the block ends without an exception."""
    folder, name = os.path.split(os.path.abspath(os.fspath(target)))
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{name}.", suffix=".tmp")
    os.close(fd)
    try:
        yield tmp
        os.replace(tmp, target)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise


def write_replacing(target, write: Callable[[str], None]):
    """write(tmp_path) writes the file's content to tmp_path; the result then replaces `target` in one rename."""
    with _replacing(target) as tmp:
        write(tmp)


def write_text_replacing(target, text: str):
    with open_replacing(target, "w", encoding="utf-8") as f:
        f.write(text)


def copy_replacing(source, target):
    """shutil.copyfile(source, target), through a temporary file: a symlink at target is replaced, not followed."""
    write_replacing(target, lambda tmp: shutil.copyfile(source, tmp))


def open_appending(target, **kw):
    """open(target, "a"), refusing (OSError) to follow a symlink at target: a log appended to as training runs."""
    return open(target, "a", opener=lambda path, flags: os.open(path, flags | os.O_NOFOLLOW, 0o644), **kw)


@contextmanager
def open_replacing(target, mode: str = "wb", **kw):
    """`with open_replacing(path, "w") as f:` is open(path, "w"), except that the file replaces `target` only once
    the block ends without an exception."""
    with _replacing(target) as tmp, open(tmp, mode, **kw) as f:
        yield f
