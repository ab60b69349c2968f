"""Multi-digit addition: "47+8=" -> "55"."""
from __future__ import annotations

import random

from .base import Problem, Task, register_task


@register_task("addition")
class Addition(Task):
    def __init__(self, min_digits: int = 1, max_digits: int = 2, partial_credit: bool = False):
        if not 1 <= min_digits <= max_digits:
            raise ValueError(f"addition needs 1 <= min_digits <= max_digits, got {min_digits}, {max_digits}")
        self.min_digits, self.max_digits, self.partial_credit = min_digits, max_digits, partial_credit

    def _operand(self, rng: random.Random) -> int:
        digits = rng.randint(self.min_digits, self.max_digits)
        return rng.randint(0 if digits == 1 else 10 ** (digits - 1), 10 ** digits - 1)

    def sample(self, rng: random.Random) -> Problem:
        a, b = self._operand(rng), self._operand(rng)
        return Problem(f"{a}+{b}=", str(a + b))

    def alphabet(self) -> str:
        return "0123456789+="

    def max_answer_len(self) -> int:
        return self.max_digits + 1

    def reward(self, problem: Problem, completion: str) -> float:
        got = completion.strip()
        if got == problem.answer:
            return 1.0
        if not self.partial_credit:
            return 0.0
        # Digits right from the units position, as column addition produces them; capped below 1.
        right = sum(1 for g, w in zip(reversed(got), reversed(problem.answer)) if g == w)
        return 0.5 * right / max(len(got), len(problem.answer))
