"""Where the shipped configs are: inside an installed wheel, or rl/configs in a source checkout."""

from __future__ import annotations

from pathlib import Path

_PACKAGE = Path(__file__).resolve().parent


def configs_dir() -> Path:
    """trace_rl/_configs in a wheel (setup.py copies rl/configs there), else the checkout's rl/configs."""
    shipped = _PACKAGE / "_configs"
    return shipped if shipped.is_dir() else _PACKAGE.parent / "configs"
