"""A small countdown: reach a target with + - * over given numbers, each used at most once.

Prompt "cd:3,4,2>14=", a correct completion is any expression such as "3*4+2" (no parentheses;
* binds tighter than + and -) whose numbers are a sub-multiset of the given ones and whose value is
the target. The generator builds the target from a random expression over all the numbers, which is
also the SFT completion.
"""
from __future__ import annotations

import random
import re
from collections import Counter

from .base import Problem, Task, register_task

_TOKEN = re.compile(r"\d+|[-+*]")


def parse_expression(text: str) -> tuple[int, list[int]] | None:
    """(value, numbers used) of an expression of non-negative integers and + - *, or None if it
    is not one."""
    tokens = _TOKEN.findall(text)
    if not tokens or "".join(tokens) != text or len(tokens) % 2 == 0:
        return None
    numbers, ops = tokens[0::2], tokens[1::2]
    if not all(n.isdigit() for n in numbers) or any(o.isdigit() for o in ops):
        return None
    values = [int(n) for n in numbers]
    terms, signs = [values[0]], [1]
    for op, v in zip(ops, values[1:]):
        if op == "*":
            terms[-1] *= v
        else:
            terms.append(v)
            signs.append(1 if op == "+" else -1)
    return sum(s * t for s, t in zip(signs, terms)), values


@register_task("countdown")
class Countdown(Task):
    def __init__(self, num_numbers: int = 3, max_number: int = 9, partial_credit: bool = False):
        if num_numbers < 2 or max_number < 1:
            raise ValueError(f"countdown needs num_numbers >= 2 and max_number >= 1, got "
                             f"{num_numbers}, {max_number}")
        self.num_numbers, self.max_number, self.partial_credit = num_numbers, max_number, partial_credit

    def sample(self, rng: random.Random) -> Problem:
        numbers = [rng.randint(1, self.max_number) for _ in range(self.num_numbers)]
        order = numbers[:]
        rng.shuffle(order)
        expression = str(order[0]) + "".join(rng.choice("+-*") + str(n) for n in order[1:])
        target, _ = parse_expression(expression)
        return Problem(f"cd:{','.join(map(str, numbers))}>{target}=", expression)

    def alphabet(self) -> str:
        return "0123456789+-*cd:,>="

    def max_answer_len(self) -> int:
        return self.num_numbers * len(str(self.max_number)) + self.num_numbers - 1

    def _given(self, problem: Problem) -> tuple[Counter, int]:
        numbers, target = problem.prompt[len("cd:"):-1].split(">")
        return Counter(int(n) for n in numbers.split(",")), int(target)

    def reward(self, problem: Problem, completion: str) -> float:
        parsed = parse_expression(completion.strip())
        if parsed is None:
            return 0.0
        value, used = parsed
        given, target = self._given(problem)
        if Counter(used) - given:  # a number not given, or used too often
            return 0.0
        if value == target:
            return 1.0
        if not self.partial_credit:
            return 0.0
        return 0.5 * max(0.0, 1.0 - abs(value - target) / max(abs(target), 1))
