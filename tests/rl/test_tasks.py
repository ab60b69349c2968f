"""Synthetic tasks: exact rewards, seeded generators, formatting."""
import pytest

from trace_rl.tasks import TASKS, make_task


def test_registered_tasks():
    assert {"addition", "reverse", "sort", "countdown"} <= set(TASKS)


@pytest.mark.parametrize("name", ["addition", "reverse", "sort", "countdown"])
def test_generators_are_seeded_and_answers_are_exact(name):
    task = make_task(name)
    a, b = task.problems(50, seed=3), task.problems(50, seed=3)
    assert a == b
    assert a != task.problems(50, seed=4)
    for p in a:
        assert set(p.prompt + p.answer) <= set(task.alphabet())
        assert len(p.answer) <= task.max_answer_len()
        assert task.reward(p, p.answer) == 1.0
        assert task.reward(p, " " + p.answer + " ") == 1.0
        assert task.reward(p, p.answer + "0") == 0.0
    assert task.sft_examples(5, seed=3) == [(p.prompt, p.answer) for p in a[:5]]


def test_addition_and_partial_credit():
    task = make_task("addition", min_digits=2, max_digits=3)
    for p in task.problems(100, seed=0):
        x, y = p.prompt[:-1].split("+")
        assert int(p.answer) == int(x) + int(y)
        assert 2 <= len(x) <= 3
    pc = make_task("addition", partial_credit=True)
    p = pc.problems(1, seed=0)[0].__class__("47+8=", "55")
    assert pc.reward(p, "55") == 1.0
    assert pc.reward(p, "45") == pytest.approx(0.25)  # units digit right
    assert pc.reward(p, "") == 0.0


def test_reverse_and_sort_content():
    rev, srt = make_task("reverse", min_len=3, max_len=3), make_task("sort", partial_credit=True)
    p = rev.problems(1, seed=1)[0]
    assert p.prompt == f"rev:{p.answer[::-1]}=" and len(p.answer) == 3
    q = srt.problems(1, seed=1)[0]
    assert list(q.answer) == sorted(q.prompt[len("sort:"):-1])
    assert 0.0 < srt.reward(q, q.answer[:-1] + "x") < 1.0


def test_bad_parameters_name_the_key():
    with pytest.raises(ValueError, match="unknown task 'multiply'"):
        make_task("multiply")
    with pytest.raises(ValueError, match="max_lenn"):
        make_task("reverse", max_lenn=4)
    with pytest.raises(ValueError, match="min_digits"):
        make_task("addition", min_digits=3, max_digits=2)


def test_countdown_verifier():
    from trace_rl.tasks.base import Problem
    from trace_rl.tasks.countdown import parse_expression

    assert parse_expression("3*4+2") == (14, [3, 4, 2])
    assert parse_expression("2+3*4-5*2") == (4, [2, 3, 4, 5, 2])
    for bad in ("", "3+", "+3", "3**4", "3 + 4", "(3)", "34a"):
        assert parse_expression(bad) is None, bad
    task = make_task("countdown", partial_credit=True)
    p = Problem("cd:3,4,2>14=", "3*4+2")
    assert task.reward(p, "4*3+2") == 1.0 and task.reward(p, "2+4*3") == 1.0
    assert task.reward(p, "7*2") == 0.0          # 7 is not given
    assert task.reward(p, "3*4+2+2") == 0.0      # 2 used twice
    assert task.reward(p, "3*4") == pytest.approx(0.5 * (1 - 2 / 14))
    assert make_task("countdown").reward(p, "3*4") == 0.0
    for q in make_task("countdown", num_numbers=4, max_number=20).problems(100, seed=5):
        assert task.reward(q, q.answer) == 1.0
