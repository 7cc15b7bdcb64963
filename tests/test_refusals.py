"""Every refusal the validators and the capability table gave before the slim-core change is given after it, with
the same exception and message (tests/refusal_cases.py lists the cases; tests/data/refusals.json holds what the
engine said before the change, at commit 8e4cca8; since then two deliberate changes: the list of options an unknown
option's message names gained `max_n`, the per-request sample limit of the hostile-server issue, and
`guided_compile_timeout_s`, its guided compile budget)."""
import json
import os

from refusal_cases import refusals

HERE = os.path.dirname(__file__)


def test_every_refusal_is_the_same_as_before_the_slim_core_change():
    want = json.load(open(os.path.join(HERE, "data", "refusals.json")))
    got = refusals()
    assert got.keys() == want.keys()
    changed = {k: (want[k], got[k]) for k in want if got[k] != want[k]}
    assert not changed, "\n".join(f"{k}: was {w}, now {g}" for k, (w, g) in changed.items())
