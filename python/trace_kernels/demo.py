"""A short TRACE demo: rollout and trainer compute the same activation slightly differently.

The rollout quantizes its activation to NVFP4 and keeps compact guidance; the trainer recomputes
the activation with another reduction order (as a training framework does), then fake-quantizes
it by round-to-nearest and by guided rounding. Prints how often each reproduces the rollout's codes.

    python -m trace_kernels.demo [--tokens 1024] [--hidden 2048] [--seed 0]
"""

from __future__ import annotations

import argparse

import torch

from trace_kernels import nvfp4


def activations(tokens: int, hidden: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The same BF16 product x @ w computed two ways: one FP32 reduction vs two BF16 halves."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(tokens, hidden, generator=g).to(torch.bfloat16)  # [T, H]
    w = (torch.randn(hidden, hidden, generator=g) / hidden**0.5).to(torch.bfloat16)  # [H, H]
    rollout = (x.float() @ w.float()).to(torch.bfloat16)  # [T, H]
    half = hidden // 2
    trainer = ((x[:, :half].float() @ w[:half].float()).to(torch.bfloat16)
               + (x[:, half:].float() @ w[half:].float()).to(torch.bfloat16))  # [T, H]
    return rollout, trainer


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=1024)
    parser.add_argument("--hidden", type=int, default=2048)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    rollout, trainer = activations(args.tokens, args.hidden, args.seed)
    rel_diff = ((trainer.float() - rollout.float()).norm() / rollout.float().norm()).item()
    q_rollout = nvfp4.quantize(rollout)
    compact, full = nvfp4.make_guidance(q_rollout, "compact"), nvfp4.make_guidance(q_rollout, "full")
    rtn = nvfp4.agreement(q_rollout.codes, nvfp4.quantize(trainer).codes)
    guided = nvfp4.agreement(q_rollout.codes, nvfp4.guided_quantize(trainer, compact).codes)
    guided_values_match = torch.equal(nvfp4.guided_fake_quantize(trainer, compact),
                                      nvfp4.dequantize(q_rollout, torch.bfloat16))
    print(f"activation [{args.tokens}, {args.hidden}] BF16; trainer vs rollout relative difference {rel_diff:.2e}")
    print(f"codes equal to the rollout's: round-to-nearest {rtn['equal_fraction']:.4%}, "
          f"guided {guided['equal_fraction']:.4%}")
    print(f"round-to-nearest grid-step histogram: {dict(sorted(rtn['distance_histogram'].items()))}")
    print(f"guided values equal the rollout's dequantized values exactly: {guided_values_match}")
    print(f"guidance: compact {compact.bits_per_element:.3f} bits/element, full {full.bits_per_element:.3f}")
    return {"rtn": rtn, "guided": guided, "exact": guided_values_match}


if __name__ == "__main__":
    main()
