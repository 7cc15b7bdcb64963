"""The minimal engine stays small (issue 34's size goals, measured by tests/line_counts.py): no file of the
package, kernels or viz over 400 lines; LLMEngine.step() a few lines over advance(), whose body is the one path
(schedule, propose, run, verify, post-process, update, trace); engine.py within 260 lines; one greedy decode step
of 3 requests runs at most 400 distinct lines of ours (379 when this was written; the goal is 300)."""
import line_counts


def test_no_file_over_the_limit_and_a_thin_step():
    over = {f: n for f, n in ((f, line_counts.lines(f)) for f in line_counts.py_files("minillm", "kernels", "viz"))
            if n > line_counts.LIMIT}
    assert not over, f"files over {line_counts.LIMIT} lines: {over}"
    import inspect

    from minillm.engine.engine import LLMEngine
    assert len(inspect.getsource(LLMEngine.step).splitlines()) <= 5
    assert len(inspect.getsource(LLMEngine.advance).splitlines()) <= 25
    assert line_counts.lines(f"{line_counts.ROOT}/minillm/engine/engine.py") <= 260


def test_a_greedy_decode_step_runs_few_lines():
    n, per_file = line_counts.step_lines()
    assert n <= 400, f"{n} distinct lines in one greedy decode step: {per_file}"
