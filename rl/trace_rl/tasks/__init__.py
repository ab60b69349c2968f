"""Synthetic RL tasks with exact programmatic rewards and seeded generators.

`make_task(name, **params)`; registered: `addition` (multi-digit, "47+8=" -> "55"), `reverse`
("rev:abc=" -> "cba"), `sort` ("sort:312=" -> "123"), `countdown` ("cd:3,4,2>14=" -> any
expression over the given numbers worth 14). Each has `problems(n, seed)`, `reward(problem,
completion)` (1.0 exact; optional partial credit stays below 1) and `sft_examples(n, seed)`.
"""
from . import arithmetic, countdown, sequences  # noqa: F401  (registers the tasks)
from .base import TASKS, Problem, Task, make_task, register_task

__all__ = ["TASKS", "Problem", "Task", "make_task", "register_task"]
