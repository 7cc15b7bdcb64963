"""The fake model of the scheduler fuzzer (tests/test_scheduler_fuzz.py) lives in the package, where the labs'
checkers use it too: minillm.labs.hashmodel."""
from minillm.labs.hashmodel import HashModel, V, allowed, next_token, reference  # noqa: F401
