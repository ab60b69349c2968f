"""Synthetic tasks with exact programmatic rewards: the interface and the registry."""
from __future__ import annotations

import inspect
import random
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Callable


@dataclass(frozen=True)
class Problem:
    prompt: str   # what the policy sees, e.g. "12+34="
    answer: str   # the exact expected completion (without the end-of-sequence token)


class Task(ABC):
    """A seeded problem generator plus an exact reward.

    Prompts and answers are plain text over `alphabet()`, for the character-level tokenizer; the
    policy's completion ends at the tokenizer's end-of-sequence token, which the caller strips.
    """

    name: str = ""

    @abstractmethod
    def sample(self, rng: random.Random) -> Problem: ...

    @abstractmethod
    def alphabet(self) -> str:
        """Every character a prompt or answer can contain."""

    @abstractmethod
    def max_answer_len(self) -> int: ...

    def reward(self, problem: Problem, completion: str) -> float:
        """1.0 for an exact answer, else 0.0 (tasks may add partial credit, always < 1)."""
        return 1.0 if completion.strip() == problem.answer else 0.0

    def problems(self, n: int, seed: int) -> list[Problem]:
        """n problems, a pure function of (task parameters, n, seed)."""
        rng = random.Random(seed)
        return [self.sample(rng) for _ in range(n)]

    def sft_examples(self, n: int, seed: int) -> list[tuple[str, str]]:
        """n (prompt, completion) pairs for supervised warm start."""
        return [(p.prompt, p.answer) for p in self.problems(n, seed)]


TASKS: dict[str, type[Task]] = {}


def register_task(name: str) -> Callable[[type[Task]], type[Task]]:
    def wrap(cls: type[Task]) -> type[Task]:
        if name in TASKS:
            raise ValueError(f"task {name!r} registered twice")
        cls.name = name
        TASKS[name] = cls
        return cls
    return wrap


def make_task(name: str, **params) -> Task:
    """Build a registered task; unknown names or parameters raise ValueError naming them."""
    if name not in TASKS:
        raise ValueError(f"unknown task {name!r}; known: {sorted(TASKS)}")
    cls = TASKS[name]
    accepted = set(inspect.signature(cls.__init__).parameters) - {"self"}
    unknown = sorted(set(params) - accepted)
    if unknown:
        raise ValueError(f"task {name!r} has no parameter(s) {unknown}; accepted: {sorted(accepted)}")
    return cls(**params)
