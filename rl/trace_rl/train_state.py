"""Checkpoints of a run: master weights, optimizer state, RNG states, and a small JSON of scalars.

Layout: RUN_DIR/checkpoints/step_00000012/{model.safetensors, optimizer.safetensors,
rng.safetensors, state.json}. A checkpoint directory is built under a temporary name and renamed
into place, so a directory named step_* is always complete; the newest one is the resume point.
No pickle anywhere: tensors in safetensors, everything else in JSON.
"""
from __future__ import annotations

import json
import os
import random
import shutil
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

FORMAT_VERSION = 1
_PREFIX = "step_"


def checkpoint_dir(run_dir, step: int) -> Path:
    return Path(run_dir) / "checkpoints" / f"{_PREFIX}{step:08d}"


def list_checkpoints(run_dir) -> list[tuple[int, Path]]:
    root = Path(run_dir) / "checkpoints"
    if not root.is_dir():
        return []
    found = []
    for p in root.iterdir():
        if p.is_dir() and p.name.startswith(_PREFIX) and (p / "state.json").is_file():
            try:
                found.append((int(p.name[len(_PREFIX):]), p))
            except ValueError:
                continue
    return sorted(found)


def latest_checkpoint(run_dir) -> Path | None:
    found = list_checkpoints(run_dir)
    return found[-1][1] if found else None


def _rng_tensors() -> tuple[dict[str, torch.Tensor], dict]:
    version, state, gauss = random.getstate()
    out = {"torch_cpu": torch.get_rng_state(),
           "python_state": torch.tensor(state, dtype=torch.int64)}
    if torch.cuda.is_available():
        for i, s in enumerate(torch.cuda.get_rng_state_all()):
            out[f"torch_cuda_{i}"] = s
    return out, {"python_version": version, "python_gauss": gauss}


def _restore_rng(tensors: dict[str, torch.Tensor], scalars: dict) -> None:
    torch.set_rng_state(tensors["torch_cpu"])
    random.setstate((scalars["python_version"], tuple(int(v) for v in tensors["python_state"].tolist()),
                     scalars["python_gauss"]))
    cuda = [tensors[k] for k in sorted(t for t in tensors if t.startswith("torch_cuda_"))]
    if cuda and torch.cuda.is_available() and len(cuda) == torch.cuda.device_count():
        torch.cuda.set_rng_state_all(cuda)


def _optimizer_tensors(optimizer: torch.optim.Optimizer) -> tuple[dict, dict]:
    sd = optimizer.state_dict()
    tensors, scalar_state = {}, {}
    for idx, state in sd["state"].items():
        for key, value in state.items():
            if isinstance(value, torch.Tensor):
                tensors[f"state.{idx}.{key}"] = value.detach().contiguous().cpu()
            else:
                scalar_state.setdefault(str(idx), {})[key] = value
    return tensors, {"param_groups": sd["param_groups"], "scalar_state": scalar_state}


def _load_optimizer(optimizer: torch.optim.Optimizer, tensors: dict, meta: dict) -> None:
    state: dict[int, dict] = {}
    for name, value in tensors.items():
        _, idx, key = name.split(".", 2)
        state.setdefault(int(idx), {})[key] = value
    for idx, extra in meta["scalar_state"].items():
        state.setdefault(int(idx), {}).update(extra)
    optimizer.load_state_dict({"state": state, "param_groups": meta["param_groups"]})


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def save_checkpoint(run_dir, step: int, params: dict[str, torch.Tensor],
                    optimizer: torch.optim.Optimizer, scalars: dict, keep: int = 2) -> Path:
    """Write checkpoint `step` atomically and delete all but the newest `keep` ones."""
    final = checkpoint_dir(run_dir, step)
    tmp = final.with_name(f".tmp-{final.name}")
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    save_file({k: v.detach().contiguous().cpu() for k, v in params.items()}, str(tmp / "model.safetensors"))
    opt_tensors, opt_meta = _optimizer_tensors(optimizer)
    save_file(opt_tensors, str(tmp / "optimizer.safetensors"))
    rng_tensors, rng_scalars = _rng_tensors()
    save_file(rng_tensors, str(tmp / "rng.safetensors"))
    state = {"format_version": FORMAT_VERSION, "step": step, "scalars": scalars,
             "optimizer": opt_meta, "rng": rng_scalars}
    (tmp / "state.json").write_text(json.dumps(state, indent=1))
    for f in tmp.iterdir():
        with open(f, "rb") as fh:
            os.fsync(fh.fileno())
    if final.exists():  # a re-run of the same step after a crash: replace it
        shutil.rmtree(final)
    os.replace(tmp, final)
    _fsync_dir(final.parent)
    for _, old in list_checkpoints(run_dir)[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def load_checkpoint(path, params: dict[str, torch.Tensor], optimizer: torch.optim.Optimizer) -> dict:
    """Restore params in place (same names and shapes), the optimizer and the RNG states.

    Returns {"step": int, "scalars": dict}.
    """
    path = Path(path)
    state = json.loads((path / "state.json").read_text())
    if state.get("format_version") != FORMAT_VERSION:
        raise ValueError(f"{path}: checkpoint format {state.get('format_version')}, "
                         f"expected {FORMAT_VERSION}")
    saved = load_file(str(path / "model.safetensors"))
    missing, unexpected = sorted(set(params) - set(saved)), sorted(set(saved) - set(params))
    if missing or unexpected:
        raise ValueError(f"{path}: checkpoint parameters differ: missing {missing[:5]}, "
                         f"unexpected {unexpected[:5]}")
    with torch.no_grad():
        for name, p in params.items():
            if p.shape != saved[name].shape:
                raise ValueError(f"{path}: {name} has shape {tuple(saved[name].shape)}, "
                                 f"expected {tuple(p.shape)}")
            p.copy_(saved[name])
    _load_optimizer(optimizer, load_file(str(path / "optimizer.safetensors")), state["optimizer"])
    _restore_rng(load_file(str(path / "rng.safetensors")), state["rng"])
    return {"step": int(state["step"]), "scalars": state["scalars"]}
