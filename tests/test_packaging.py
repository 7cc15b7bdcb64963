"""The distribution ships every package: pyproject lists packages by hand (package-dir maps kernels/ and viz/ under
minillm), so a new subpackage left out of the list would be missing from a built wheel while an editable install
hides it. This test builds nothing: it compares the list with the folders that hold an __init__.py."""
import os

import tomllib

ROOT = os.path.join(os.path.dirname(__file__), "..")


def test_every_package_folder_is_in_pyproject():
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        tool = tomllib.load(f)["tool"]["setuptools"]
    listed, dirs = set(tool["packages"]), tool["package-dir"]
    found = set()
    for top, folder in dirs.items():
        base = os.path.join(ROOT, folder)
        for dirpath, subdirs, files in os.walk(base):
            subdirs[:] = [d for d in subdirs if d != "__pycache__"]
            rel = os.path.relpath(dirpath, base)
            if "__init__.py" in files:
                found.add(top if rel == "." else top + "." + rel.replace(os.sep, "."))
    assert found - listed == set(), f"packages missing from pyproject.toml's list: {sorted(found - listed)}"
    assert listed - found == set(), f"pyproject.toml lists packages that do not exist: {sorted(listed - found)}"
