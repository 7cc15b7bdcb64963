"""Streaming deltas (minillm.serve.stream): what a stream sends is always a prefix of the final text, so the deltas
concatenate to exactly what LLM.generate returns; streaming from the engine directly (notebook 00)."""
import pytest

from minillm import LLM, SamplingParams
from minillm.core.outputs import CompletionOutput, RequestOutput
from minillm.serve.stream import DeltaTracker, stable_length, stream


def test_stable_length_holds_back_an_unfinished_character_and_a_stop_prefix():
    assert stable_length("abc", [], False) == 3
    assert stable_length("ab\ufffd", [], False) == 2                       # a character still arriving
    assert stable_length("ab\ufffd", [], True) == 3                        # finished: everything goes
    assert stable_length("to be\nEN", ["\nEND"], False) == len("to be")    # "\nEN" may become "\nEND"
    assert stable_length("to be\nEX", ["\nEND"], False) == len("to be\nEX")
    assert stable_length("abab", ["b", "abc"], False) == 2 and stable_length("abab", ["x", "b"], False) == 4


def _out(text, ids, finish=None):
    return RequestOutput("r", None, [1], [CompletionOutput(0, text, ids, finish)], finish is not None, None)


def test_the_tracker_sends_each_token_once_and_never_takes_text_back():
    t = DeltaTracker(["\n\n"])
    states = [("Hi", [5], None), ("Hi \ufffd", [5, 7], None), ("Hi é", [5, 7, 8], None), ("Hi é\n", [5, 7, 8, 9], None),
              ("Hi é", [5, 7, 8, 9, 9], "stop")]                        # the stop string was cut out of the text
    sent_text, sent_ids, reasons = "", [], []
    for text, ids, finish in states:
        for d in t.deltas(_out(text, ids, finish)):
            sent_text += d.text
            sent_ids += d.token_ids
            reasons.append(d.finish_reason)
    assert sent_text == "Hi é" and sent_ids == [5, 7, 8, 9, 9] and reasons[-1] == "stop"
    assert t.deltas(_out("Hi é", [5, 7, 8, 9, 9], "stop")) == []            # finished: nothing more, ever


@pytest.fixture(scope="module")
def llm():
    return LLM("shakespeare")


@pytest.mark.parametrize("params", [SamplingParams(temperature=0, max_tokens=40, stop=["\n\n"]),
                                    SamplingParams(temperature=0.9, seed=7, max_tokens=30, n=2)])
def test_streaming_from_the_engine_equals_generate(llm, params):
    want = llm.generate("ROMEO:", params)[0]
    text, ids, finish = {}, {}, {}
    for d in stream(llm.engine, "ROMEO:", params):
        text[d.index] = text.get(d.index, "") + d.text
        ids[d.index] = ids.get(d.index, []) + d.token_ids
        finish[d.index] = d.finish_reason
    for c in want.outputs:
        assert (text[c.index], ids[c.index], finish[c.index]) == (c.text, c.token_ids, c.finish_reason)
    assert not llm.engine.requests and llm.engine.block_manager.num_free == llm.engine.block_manager.num_blocks


def test_stopping_a_stream_early_aborts_its_request_and_frees_its_blocks(llm):
    other = llm.engine.add_request("Good morrow", SamplingParams(temperature=0, max_tokens=8))
    it = stream(llm.engine, "ROMEO:", SamplingParams(temperature=0, max_tokens=500, ignore_eos=True))
    next(it)
    it.close()                                                         # the reader stopped: abort
    assert [r for r in llm.engine.requests] == [other]                 # someone else's request goes on
    while llm.engine.has_unfinished_requests():
        llm.engine.step()
    assert llm.engine.pop_finished()[0].outputs[0].finish_reason == "length"
    assert llm.engine.block_manager.num_free == llm.engine.block_manager.num_blocks
