"""List tasks: reverse a string of letters, sort a string of digits."""
from __future__ import annotations

import random

from .base import Problem, Task, register_task


def _positional_credit(got: str, want: str) -> float:
    """Fraction of positions right, over the longer of the two, halved so it stays below an exact 1."""
    right = sum(1 for g, w in zip(got, want) if g == w)
    return 0.5 * right / max(len(got), len(want), 1)


class _ListTask(Task):
    symbols = ""
    tag = ""

    def __init__(self, min_len: int = 2, max_len: int = 5, partial_credit: bool = False):
        if not 1 <= min_len <= max_len:
            raise ValueError(f"{self.name} needs 1 <= min_len <= max_len, got {min_len}, {max_len}")
        self.min_len, self.max_len, self.partial_credit = min_len, max_len, partial_credit

    def _items(self, rng: random.Random) -> str:
        return "".join(rng.choice(self.symbols) for _ in range(rng.randint(self.min_len, self.max_len)))

    def alphabet(self) -> str:
        return self.symbols + self.tag + ":="

    def max_answer_len(self) -> int:
        return self.max_len

    def reward(self, problem: Problem, completion: str) -> float:
        got = completion.strip()
        if got == problem.answer:
            return 1.0
        return _positional_credit(got, problem.answer) if self.partial_credit else 0.0


@register_task("reverse")
class Reverse(_ListTask):
    symbols = "abcdefghij"
    tag = "rev"

    def sample(self, rng: random.Random) -> Problem:
        s = self._items(rng)
        return Problem(f"rev:{s}=", s[::-1])


@register_task("sort")
class Sort(_ListTask):
    symbols = "0123456789"
    tag = "sort"

    def sample(self, rng: random.Random) -> Problem:
        s = self._items(rng)
        return Problem(f"sort:{s}=", "".join(sorted(s)))
