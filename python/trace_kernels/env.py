"""Every environment knob of trace-kernels, in one place. All share the prefix TRACE_KERNELS_.

docs/toolchain.md lists them; `trace-kernels list --env` prints them with their current values.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

PREFIX = "TRACE_KERNELS_"


@dataclass(frozen=True)
class Knob:
    name: str  # without the prefix
    default: str
    help: str

    @property
    def env_name(self) -> str:
        return PREFIX + self.name


KNOBS: dict[str, Knob] = {k.name: k for k in (
    Knob("CACHE_DIR", "", "JIT cache root (default: $XDG_CACHE_HOME/trace_kernels or ~/.cache/trace_kernels)"),
    Knob("DISABLE_JIT", "0", "1: never compile at run time; a kernel missing from the AOT set and the cache raises"),
    Knob("LINEINFO", "0", "1: compile with -lineinfo and keep the generated .cu next to each cubin (profiling)"),
    Knob("PTXAS_CHECK", "0",
         "1: fail a build whose ptxas report shows register spills, a stack frame or serialized wgmma"),
    Knob("NVCC", "", "nvcc to use (default: nvcc on PATH, then $CUDA_HOME/bin/nvcc)"),
    Knob("VERBOSE", "0", "1: print each nvcc command and its ptxas report"),
    Knob("AOT", "tiny", "pip install: comma-separated presets to build ahead of time when nvcc is present; "
                        "empty or 0 skips the AOT build"),
    Knob("AOT_DIR", "", "folder of AOT cubins + manifest.json (default: trace_kernels/_data/aot)"),
    Knob("POISON_OUTPUTS", "0", "1: fill op outputs with 0xFF bytes (NaN / code 15) before each launch, so an "
                                "unwritten element cannot pass a test"),
    Knob("CHECK_FINITE", "0", "1: check the non-finite status flag after every op (a host sync; debugging)"),
    # read where they act (codegen.ops.moe_gemm / refit_weights, trace_rl.engine.sampler), listed here for `list --env`
    Knob("MOE_VARIANT", "auto", "MoE GEMM tile table for calls without tile=: auto (ws below 1/8 routed row "
                                "per expert, v1 beyond), v1, ws or auto_qa (auto, every fused gate_up "
                                "quantized by the quantize kernel after the GEMM)"),
    Knob("MOE_TABLES", "", "tuned MoE tile tables (JSON files, separated by the path separator; "
                           "trace_kernels.moe_tables, written by profiling/sweep_moe_gemm_tiles.py --write-tables): "
                           "under MOE_VARIANT=auto a GEMM with an entry runs its table"),
    Knob("MOE_BUILTIN_TABLES", "1", "0: leave out the tuned MoE tile tables shipped for other models' shapes "
                                    "(codegen/moe_tables, measured on an H200), so those shapes run auto's tables"),
    Knob("REFIT_VARIANT", "v9", "refit_weights kernel: v9 (quantizes with the previous refit's scales as a guess: one "
                                "read of the weights when no expert's amax moved) or v2 (an amax pass, then a quantize "
                                "pass: for buffers reused for unrelated weights); v8 for A/B runs"),
    Knob("REFIT_PACKED_VARIANT", "v2", "refit_weights_packed_ (the engine's weight sync): v2 (packs with the previous "
                                       "sync's scales as a guess, repacks the experts whose scale changed) or v1 "
                                       "(refit's amax pass, then a quantize-and-pack pass)"),
    Knob("SAMPLER", "auto", "rollout sampler: auto = the gumbel_max_sample kernel on CUDA for plain steps "
                            "(T > 0, no top-k / top-p), torch = always the torch reference"),
)}


def get(name: str) -> str:
    knob = KNOBS[name]
    return os.environ.get(knob.env_name, knob.default)


def flag(name: str) -> bool:
    return get(name).strip().lower() not in ("", "0", "false", "no", "off")
