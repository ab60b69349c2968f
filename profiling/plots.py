"""One report from the benchmarks' JSON: ratios to the BF16 baselines and the roofline, PNG plots, a
README table. Used by profiling/bench.py live and by `bench.py --from-json` without a GPU.

Inputs are the benchmark modules' own JSON (bench_memory_kernels, bench_moe_gemm, bench_attention,
bench_rollout), either inside one bench.py JSON (its "raw" section) or as the separate files in
profiling/results/. The unified report has one list per family; every timed row carries
`fraction_of_roofline` = minimal bytes / roofline bandwidth / time, where the roofline is the SM copy
kernel's bandwidth (a graph-captured copy_ of >= 512 MB runs at ~2.75 TB/s on the H200, an SM copy at
~4.2: docs/toolchain.md), and `vs_bf16` = BF16 baseline time / time (memory kernels: the same-size
torch copy_, since they have no BF16 counterpart; MoE: torch._grouped_mm; attention: SDPA over a
contiguous BF16 cache; rollout: BF16 engine decode tokens/s).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

SM_COPY = "SM kernel graph (bitwise_not)"


def sm_copy_roofline(memory_raw: dict) -> float | None:
    """Fastest SM-kernel copy of the memory benchmark's copy study, bytes/s."""
    rates = [s["tb_per_s"] for s in memory_raw.get("copy_study", []) if s["method"] == SM_COPY]
    return max(rates) * 1e12 if rates else None


def normalize_memory(raw: dict, roofline: float) -> list[dict]:
    copy_at = {r["input_mb"]: r["tb_per_s"] for r in raw["results"] if r["kernel"] == "copy"}
    rows = []
    for r in raw["results"]:
        if r["kernel"] == "copy":
            continue
        op, variant = (re.match(r"(.*?) \[(\w+)\]$", r["kernel"]).groups() if "[" in r["kernel"]
                       else (r["kernel"], ""))
        rows.append({"op": op, "variant": variant, "input_mb": r["input_mb"], "ms": r["ms"], "bytes": r["bytes"],
                     "tb_per_s": r["tb_per_s"], "copy_tb_per_s": copy_at.get(r["input_mb"]),
                     "vs_bf16": r["tb_per_s"] / copy_at[r["input_mb"]] if r["input_mb"] in copy_at else None,
                     "fraction_of_roofline": r["tb_per_s"] * 1e12 / roofline})
    return rows


def normalize_moe(raw: dict, roofline: float, bf16_tflops: float | None = None) -> list[dict]:
    rows = []
    for r in raw["results"]:
        bf16 = r.get("bf16_grouped_mm_ms")
        variants = r.get("variants") or {"default": r}
        for name, v in variants.items():
            rows.append({"shape": r["shape"], "tokens": r["tokens"], "variant": name, "ms": v["nvfp4_ms"],
                         "bf16_ms": bf16, "vs_bf16": bf16 / v["nvfp4_ms"] if bf16 else None,
                         "bytes": r.get("nvfp4_bytes"), "tflops": v.get("nvfp4_tflops"),
                         "fraction_of_bf16_matmul_rate": v["nvfp4_tflops"] / bf16_tflops
                         if bf16_tflops and v.get("nvfp4_tflops") else None,
                         "fraction_of_roofline": r["nvfp4_bytes"] / roofline / (v["nvfp4_ms"] * 1e-3)
                         if r.get("nvfp4_bytes") else None})
    return rows


ATTENTION_KERNELS = ("nvfp4", "nvfp4_mma", "bf16", "bf16_mma", "sdpa_bf16")


def normalize_attention(raw: dict, roofline: float) -> list[dict]:
    rows = []
    for r in raw.get("decode", []):
        sdpa = r.get("sdpa_bf16", {}).get("ms")
        for k in ATTENTION_KERNELS:
            v = r.get(k, {})
            if "ms" not in v:
                continue
            label = f"{k} [{v['variant']}]" if v.get("variant") and k != "sdpa_bf16" else k
            rows.append({"kernel": label, "batch": r["batch"], "length": r["length"], "ms": v["ms"], "bytes": v["bytes"],
                         "tb_per_s": v["tb_per_s"], "vs_bf16": sdpa / v["ms"] if sdpa else None,
                         "fraction_of_roofline": v["bytes"] / roofline / (v["ms"] * 1e-3)})
    for a in raw.get("kv_append", []):
        rows.append({"kernel": f"kv_append {a['format']}" + (" +guidance" if a["guidance"] else ""), "batch": None,
                     "length": a["tokens"], "ms": a["ms"], "bytes": a["bytes"], "tb_per_s": a["tb_per_s"],
                     "vs_bf16": None, "fraction_of_roofline": a["bytes"] / roofline / (a["ms"] * 1e-3)})
    return rows


def normalize_rollout(raw: dict) -> list[dict]:
    rows = raw.get("results", [])
    bf16 = {r["prompt_len"]: r["decode_tokens_per_s"] for r in rows if r["mode"] == "bf16" and r["graphs"]}
    return [{"mode": r["mode"], "capture": r["capture"], "graphs": r["graphs"], "kv_kernels": r["kv_kernels"],
             "prompt_len": r["prompt_len"], "batch": r["batch"], "output_len": r["output_len"],
             "decode_tokens_per_s": r["decode_tokens_per_s"],
             "vs_bf16": r["decode_tokens_per_s"] / bf16[r["prompt_len"]] if r["prompt_len"] in bf16 else None}
            for r in rows]


def normalize_sampling(raw: dict, roofline: float) -> list[dict]:
    """The kernel rows of bench_sampling, against the torch sampler of the same case."""
    rows = raw.get("results", [])
    torch_ms = {(r["logits"], r["batch"]): r["ms"] for r in rows if r["path"] == "torch"}
    out = []
    for r in (r for r in rows if r["path"].startswith("kernel")):
        base = torch_ms.get((r["logits"], r["batch"]))
        out.append({"path": r["path"], "batch": r["batch"], "vocab": r["vocab"], "logits": r["logits"], "ms": r["ms"],
                    "vs_bf16": base / r["ms"] if base else None,
                    "fraction_of_roofline": r["logit_bytes"] / roofline / (r["ms"] * 1e-3)})
    return out


def unify(raw: dict, roofline: dict) -> dict:
    """raw: {memory, moe, attention, sampling, rollout} (each optional) in the modules' formats."""
    bw = roofline["sm_copy_bytes_per_s"]
    out = {"roofline": roofline}
    if raw.get("memory"):
        out["memory"] = normalize_memory(raw["memory"], bw)
    if raw.get("moe"):
        out["moe"] = normalize_moe(raw["moe"], bw, roofline.get("bf16_tflops"))
    if raw.get("attention"):
        out["attention"] = normalize_attention(raw["attention"], bw)
    if raw.get("sampling"):
        out["sampling"] = normalize_sampling(raw["sampling"], bw)
    if raw.get("rollout"):
        out["rollout"] = normalize_rollout(raw["rollout"])
    return out


COMMITTED = {"memory": "memory_kernels_h200.json", "moe": "moe_gemm_h200_ab.json", "attention": "attention_h200.json",
             "sampling": "sampling_h200.json", "rollout": "rollout_h200*.json"}


def load_results(path: Path) -> tuple[dict, dict]:
    """(raw, meta) from one bench.py JSON or from a folder of the separate committed JSON files."""
    if path.is_file():
        report = json.loads(path.read_text())
        return report["raw"], {k: report[k] for k in ("gpu", "date", "commit", "command", "roofline") if k in report}
    raw, sources = {}, {}
    for family, pattern in COMMITTED.items():
        found = sorted(path.glob(pattern))
        if found:
            raw[family] = json.loads(found[-1].read_text())
            sources[family] = {"file": found[-1].name, **{k: raw[family].get(k) for k in ("date", "commit", "command")}}
    if "memory" not in raw:
        raise FileNotFoundError(f"{path}: no {COMMITTED['memory']} (its copy study gives the roofline)")
    mem = raw["memory"]
    roofline = {"sm_copy_bytes_per_s": sm_copy_roofline(mem), "bf16_tflops": None,
                "source": f"{COMMITTED['memory']} copy study, {SM_COPY}"}
    return raw, {"gpu": mem.get("gpu"), "sources": sources, "roofline": roofline}


def _family_op(op: str) -> str:
    return op.split(" ")[0]


def _label_measured(ax, xs) -> None:
    """Log x axis ticks at the measured sizes only, as plain numbers (no overlapping minor labels)."""
    ticks = sorted(set(xs))
    ax.set_xticks(ticks, [f"{x:g}" for x in ticks], fontsize=7)
    ax.minorticks_off()


def draw(report: dict, out_dir: Path) -> list[Path]:
    """PNG plots of a unified report; returns the files written (families without data are skipped)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir.mkdir(parents=True, exist_ok=True)
    roof_tb = report["roofline"]["sm_copy_bytes_per_s"] / 1e12
    gpu = report.get("gpu") or "GPU"
    written = []

    def save(fig, name):
        path = out_dir / name
        fig.tight_layout()
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(path)

    if any(len({r["input_mb"] for r in report["memory"] if r["op"] == op}) > 1
           for op in {r["op"] for r in report.get("memory", [])}):
        # size sweeps only (one-size studies such as the refit group sweep stay in the JSON and table)
        ops = [op for op in dict.fromkeys(r["op"] for r in report["memory"])
               if len({r["input_mb"] for r in report["memory"] if r["op"] == op}) > 1]
        cols = min(3, len(ops))
        fig, axes = plt.subplots(-(-len(ops) // cols), cols, figsize=(5 * cols, 3.6 * -(-len(ops) // cols)),
                                 squeeze=False)
        for ax, op in zip(axes.flat, ops):
            rows = [r for r in report["memory"] if r["op"] == op]
            for variant in dict.fromkeys(r["variant"] for r in rows):
                pts = sorted((r["input_mb"], r["tb_per_s"]) for r in rows if r["variant"] == variant)
                ax.plot(*zip(*pts), marker="o", label=variant or op)
            copy = sorted({(r["input_mb"], r["copy_tb_per_s"]) for r in rows if r["copy_tb_per_s"]})
            if copy:
                ax.plot(*zip(*copy), ls=":", color="gray", label="torch copy_ (same size)")
            ax.axhline(roof_tb, ls="--", color="k", label=f"SM copy roofline {roof_tb:.2f}")
            ax.set(xscale="log", xlabel="input MB", ylabel="TB/s", title=op, ylim=(0, roof_tb * 1.1))
            _label_measured(ax, [r["input_mb"] for r in rows])
            ax.legend(fontsize=7)
        for ax in list(axes.flat)[len(ops):]:
            ax.axis("off")
        fig.suptitle(f"memory kernels: bandwidth vs size ({gpu})")
        save(fig, "memory_roofline.png")

    if report.get("moe"):
        fig, ax = plt.subplots(figsize=(6.5, 4))
        for key in dict.fromkeys((r["shape"], r["variant"]) for r in report["moe"]):
            pts = sorted((r["tokens"], r["vs_bf16"]) for r in report["moe"]
                         if (r["shape"], r["variant"]) == key and r["vs_bf16"])
            if pts:
                ax.plot(*zip(*pts), marker="o", label=f"{key[0]} [{key[1]}]")
        ax.axhline(1, color="k", lw=0.8)
        ax.set(xscale="log", xlabel="tokens", ylabel="speedup vs BF16 torch._grouped_mm",
               title=f"NVFP4 MoE layer (gate_up + down) ({gpu})")
        _label_measured(ax, [r["tokens"] for r in report["moe"]])
        ax.legend(fontsize=7)
        save(fig, "moe_speedup.png")

    decode = [r for r in report.get("attention", []) if r["batch"] is not None and r["vs_bf16"]]
    if decode:
        fig, ax = plt.subplots(figsize=(6.5, 4))
        for key in dict.fromkeys((r["kernel"], r["batch"]) for r in decode if r["kernel"] != "sdpa_bf16"):
            pts = sorted((r["length"], r["vs_bf16"]) for r in decode if (r["kernel"], r["batch"]) == key)
            ax.plot(*zip(*pts), marker="o", label=f"{key[0]}, batch {key[1]}")
        ax.axhline(1, color="k", lw=0.8)
        ax.set(xscale="log", xlabel="context (tokens)", ylabel="speedup vs SDPA (contiguous BF16)",
               title=f"paged decode attention ({gpu})")
        _label_measured(ax, [r["length"] for r in decode])
        ax.legend(fontsize=7)
        save(fig, "attention_speedup.png")

    if report.get("rollout"):
        rows = report["rollout"]
        fig, ax = plt.subplots(figsize=(6.5, 4))
        labels = [f"{r['mode']} {r['capture']} {'graphs' if r['graphs'] else 'eager'}"
                  + ("" if r["kv_kernels"] or r["mode"] == "bf16" else " nokv") + f"\nprompt {r['prompt_len']}"
                  for r in rows]
        ax.bar(range(len(rows)), [r["decode_tokens_per_s"] for r in rows],
               color=["tab:gray" if r["mode"] == "bf16" else "tab:blue" for r in rows])
        ax.set_xticks(range(len(rows)), labels, fontsize=6, rotation=30, ha="right")
        ax.set(ylabel="decode tokens/s", title=f"rollout decode throughput, BF16 vs NVFP4 ({gpu})")
        save(fig, "rollout_tokens_per_s.png")
    return written


def _pct(x):
    return "-" if x is None else f"{100 * x:.0f}%"


def _x(x):
    return "-" if x is None else f"{x:.2f}x"


def table(report: dict) -> list[str]:
    """Markdown rows: the default variant at the largest size of each memory kernel, the MoE layer at
    each token count, decode attention per case, the sampling kernel, rollout arms."""
    lines = ["| benchmark | case | time | vs BF16 baseline | of roofline |", "|---|---|---|---|---|"]
    mem = report.get("memory", [])
    for op in dict.fromkeys(r["op"] for r in mem):
        rows = [r for r in mem if r["op"] == op]
        size = max(r["input_mb"] for r in rows)
        for r in sorted((r for r in rows if r["input_mb"] == size), key=lambda r: -r["tb_per_s"])[:1]:
            lines.append(f"| {op} [{r['variant']}] | {size:.0f} MB | {r['ms']:.4f} ms, {r['tb_per_s']:.2f} TB/s "
                         f"| {_pct(r['vs_bf16'])} of copy_ | {_pct(r['fraction_of_roofline'])} |")
    for r in report.get("moe", []):
        lines.append(f"| MoE layer {r['shape']} [{r['variant']}] | {r['tokens']} tokens | {r['ms']:.4f} ms "
                     f"| {_x(r['vs_bf16'])} | {_pct(r['fraction_of_roofline'])} |")
    for r in report.get("attention", []):
        case = f"B={r['batch']} L={r['length']}" if r["batch"] is not None else f"{r['length']} tokens"
        lines.append(f"| attention {r['kernel']} | {case} | {r['ms']:.4f} ms | {_x(r['vs_bf16'])} "
                     f"| {_pct(r['fraction_of_roofline'])} |")
    for r in report.get("sampling", []):
        lines.append(f"| sampling {r['path']} | B={r['batch']} V={r['vocab']} {r['logits']} | {r['ms']:.4f} ms "
                     f"| {_x(r['vs_bf16'])} of torch | {_pct(r['fraction_of_roofline'])} |")
    for r in report.get("rollout", []):
        lines.append(f"| rollout {r['mode']} {r['capture']} {'graphs' if r['graphs'] else 'eager'} "
                     f"| prompt {r['prompt_len']}, batch {r['batch']} | {r['decode_tokens_per_s']:.0f} tok/s "
                     f"| {_x(r['vs_bf16'])} | - |")
    return lines
