"""The RL loop: rollout -> guidance store -> trainer step -> refit, with metrics and checkpoints.

`train(cfg, run_dir)` runs (or resumes) a run in RUN_DIR:

    RUN_DIR/config.json        the resolved config; a resume with a different config is refused
                               (except [run]: a finished run can be extended with more steps)
    RUN_DIR/sft/               the supervised warm start (Hugging Face layout), when sft.steps > 0
    RUN_DIR/sft_metrics.jsonl  SFT loss
    RUN_DIR/metrics.jsonl      one record per RL step (trace_rl.metrics.REQUIRED_KEYS and more)
    RUN_DIR/guidance/          the current step's guidance file (trace_rl.guidance_store); with
                               run.guidance_io = "overlap" it is written by a background thread
                               while the trainer uses the same batch from memory, and the step
                               waits for it before its record is written
    RUN_DIR/checkpoints/       trace_rl.train_state checkpoints

Every random choice of step s derives from (seed, s): its problems, and the engine's sampling seed.
A resumed run restores weights, optimizer and RNG from the newest checkpoint, drops metrics records
after it, and redoes the steps after it, so no step is lost or recorded twice.
"""
from __future__ import annotations

import copy
import hashlib
import json
import math
import os
import random
import shutil
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch

from trace_rl import train_state
from trace_rl.engine import EngineConfig, RolloutEngine, SamplingParams
from trace_rl.guidance_store import read_guidance, write_guidance
from trace_rl.metrics import MetricsLog
from trace_rl.model import MoEForCausalLM
from trace_rl.tasks import make_task
from trace_rl.tokenizer import CharTokenizer
from trace_rl.trainer import PolicyTrainer, RunConfig, build_train_batch, sft_batch
from trace_rl.trainer.config import ConfigError

_DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32}
MAX_MODEL_LEN = 256  # prompt + completion tokens per sequence in the rollout engine


def derive_seed(seed: int, *parts) -> int:
    """A 62-bit seed from (seed, *parts), stable across processes and platforms."""
    text = ":".join(str(p) for p in (seed, *parts))
    return int(hashlib.sha256(text.encode()).hexdigest()[:15], 16)


class Progress:
    """tqdm when installed, else one plain line per update."""

    def __init__(self, total: int, initial: int, desc: str, enabled: bool = True):
        self.enabled, self.total, self.n = enabled, total, initial
        self._bar = None
        if enabled:
            try:
                from tqdm import tqdm
                self._bar = tqdm(total=total, initial=initial, desc=desc, dynamic_ncols=True)
            except ImportError:
                self._desc = desc

    def update(self, **fields) -> None:
        self.n += 1
        if not self.enabled:
            return
        text = " ".join(f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}" for k, v in fields.items())
        if self._bar is not None:
            self._bar.set_postfix_str(text, refresh=False)
            self._bar.update(1)
        else:
            print(f"{self._desc} {self.n}/{self.total} {text}", flush=True)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise ConfigError("model.device = 'cuda' but no CUDA device is available")
    return torch.device(name)


def _check_tokenizer(task, tok, model) -> None:
    missing = sorted(set(task.alphabet()) - set(CharTokenizer.ALPHABET))
    if missing:
        raise ConfigError(f"task {task.name!r} uses characters {missing} the character tokenizer lacks")
    if tok.vocab_size > model.config.vocab_size:
        raise ConfigError(f"model vocab_size {model.config.vocab_size} < tokenizer's {tok.vocab_size}")


def build_model(cfg: RunConfig, device: torch.device) -> MoEForCausalLM:
    dtype = _DTYPES[cfg.model.dtype]
    if cfg.model.init:
        if not (Path(cfg.model.init) / "config.json").is_file():
            raise ConfigError(f"model.init: {cfg.model.init!r} is not a model directory; create it "
                              "with `trace-rl sft --config ... --out DIR` first")
        return MoEForCausalLM.from_pretrained(cfg.model.init, dtype=dtype, device=device)
    return MoEForCausalLM.from_preset(cfg.model.preset, seed=cfg.seed, dtype=dtype, device=device)


def export_fp32(trainer: PolicyTrainer) -> MoEForCausalLM:
    """A float32 copy of the model carrying the trainer's FP32 master weights."""
    model = copy.deepcopy(trainer.model).float()
    with torch.no_grad():
        for (name, p), m in zip(model.named_parameters(), trainer.master):
            p.copy_(m)
    return model


def _sft_pairs(task, tok, n: int, seed: int) -> list[tuple[list[int], list[int]]]:
    return [(tok.encode(p, add_bos=True), tok.encode(a) + [tok.eos_id])
            for p, a in task.sft_examples(n, seed)]


def run_sft(cfg: RunConfig, model, out_dir, progress: bool = True) -> MoEForCausalLM:
    """Supervised warm start: cfg.sft.steps AdamW steps of cross-entropy on task examples.

    Writes the FP32 result to out_dir (Hugging Face layout, atomically) and sft_metrics.jsonl next
    to it; returns the trained compute-dtype model."""
    out_dir = Path(out_dir)
    task, tok = make_task(cfg.task.name, **cfg.task.params), CharTokenizer()
    _check_tokenizer(task, tok, model)
    trainer = PolicyTrainer(model, cfg.trainer, lr=cfg.sft.lr)
    bar = Progress(cfg.sft.steps, 0, "sft", progress)
    log_path = out_dir.parent / f"{out_dir.name}_metrics.jsonl"
    records = []
    device = next(model.parameters()).device
    for step in range(1, cfg.sft.steps + 1):
        pairs = _sft_pairs(task, tok, cfg.sft.batch_size, derive_seed(cfg.sft.seed, "sft", step))
        loss = trainer.sft_step(sft_batch(pairs, tok.pad_id).to(device))
        records.append({"step": step, "loss": loss})
        bar.update(loss=loss)
    bar.close()
    tmp = out_dir.with_name(f".tmp-{out_dir.name}")
    if tmp.exists():
        shutil.rmtree(tmp)
    export_fp32(trainer).save_pretrained(tmp)
    with open(tmp / "sft_config.json", "w") as f:
        json.dump({"task": cfg.task.name, "task_params": cfg.task.params, "sft": cfg.to_dict()["sft"],
                   "final_loss": records[-1]["loss"] if records else None}, f, indent=1)
    if out_dir.exists():
        shutil.rmtree(out_dir)
    os.replace(tmp, out_dir)
    log_path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return model


def _load_or_run_sft(cfg: RunConfig, run_dir: Path, device, progress: bool) -> MoEForCausalLM:
    model = build_model(cfg, device)
    if cfg.sft.steps == 0:
        return model
    sft_dir = run_dir / "sft"
    if (sft_dir / "sft_config.json").is_file():  # written last: the directory is complete
        return MoEForCausalLM.from_pretrained(sft_dir, dtype=_DTYPES[cfg.model.dtype], device=device)
    return run_sft(cfg, model, sft_dir, progress)


def _flatten(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        if isinstance(v, dict) and v:
            out.update(_flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def _check_run_dir(cfg: RunConfig, run_dir: Path) -> None:
    """Record the config in run_dir, or check it against the recorded one. Only the [run] section
    (length, checkpoint cadence) may change between invocations, e.g. to extend a run."""
    path = run_dir / "config.json"
    current = json.loads(json.dumps(cfg.to_dict()))
    if path.is_file():
        a, b = _flatten(json.loads(path.read_text())), _flatten(current)
        diff = sorted(k for k in a.keys() | b.keys() if a.get(k) != b.get(k) and not k.startswith("run."))
        if diff:
            raise ConfigError(f"{run_dir} holds a run with a different config (differs in {diff}); "
                              "use a new --out directory or the same config")
    run_dir.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name("config.json.tmp")
    tmp.write_text(json.dumps(current, indent=1))
    os.replace(tmp, path)


def train(cfg: RunConfig, run_dir, *, progress: bool = True, stop_after_step: int | None = None) -> Path:
    """Run or resume the RL loop of cfg in run_dir; returns run_dir.

    stop_after_step: raise RuntimeError right after that step's metrics are written (before its
    checkpoint), as a crash would; used by the resume tests.
    """
    run_dir = Path(run_dir)
    _check_run_dir(cfg, run_dir)
    device = resolve_device(cfg.model.device)
    random.seed(cfg.seed)
    torch.manual_seed(cfg.seed)
    task, tok = make_task(cfg.task.name, **cfg.task.params), CharTokenizer()
    model = _load_or_run_sft(cfg, run_dir, device, progress)
    _check_tokenizer(task, tok, model)
    ref_model = None
    if cfg.trainer.kl_coef > 0:  # KL to the initial (post-SFT) policy
        ref_model = copy.deepcopy(model).eval().requires_grad_(False)
    trainer = PolicyTrainer(model, cfg.trainer)
    log = MetricsLog(run_dir / "metrics.jsonl")
    start = 1
    ckpt = train_state.latest_checkpoint(run_dir)
    if ckpt is not None:
        info = train_state.load_checkpoint(ckpt, trainer.master_state(), trainer.optimizer)
        trainer.sync_model_from_master()
        start = info["step"] + 1
    log.truncate_to_step(start - 1)

    r = cfg.rollout
    # The synthetic tasks' prompts and answers are short: a short model length keeps the KV pool small.
    max_len = min(model.config.max_position_embeddings, MAX_MODEL_LEN)
    engine = RolloutEngine(trainer.model, EngineConfig(max_num_seqs=r.prompts_per_step * r.group_size,
                                                       max_model_len=max_len),
                           mode=r.mode, capture=r.capture, device=device)
    sampling = SamplingParams(temperature=r.temperature, max_new_tokens=r.max_new_tokens,
                              stop_token_ids=(tok.eos_id,))
    guidance_dir = run_dir / "guidance"
    bar = Progress(cfg.run.steps, start - 1, f"train[{cfg.trainer.quant}]", progress)
    writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="guidance-writer")
    try:
        for step in range(start, cfg.run.steps + 1):
            record = rl_step(cfg, step, task, tok, engine, sampling, trainer, guidance_dir, ref_model,
                             device, writer)
            log.append(record)
            bar.update(reward=record["reward_mean"], kl=record["k3_kl"])
            if stop_after_step is not None and step == stop_after_step:
                raise RuntimeError(f"stopped after step {step} (simulated crash)")
            if step % cfg.run.checkpoint_every == 0 or step == cfg.run.steps:
                train_state.save_checkpoint(run_dir, step, trainer.master_state(), trainer.optimizer,
                                            {"reward_mean": record["reward_mean"]},
                                            keep=cfg.run.keep_checkpoints)
    finally:
        writer.shutdown(wait=True)
        bar.close()
    return run_dir


def _compact_bits_per_element(guidance) -> float:
    """Bits/element compact guidance of this batch would take (equal to the stored figure in
    compact mode; in full mode, the packed codes [.., D/2] are counted as mantissa bits [.., D/8])."""
    nbytes = elements = 0
    for t in guidance.tables.values():
        payload = t.payload.numel() * t.payload.element_size()
        nbytes += t.guidance_nbytes - payload + (payload // 4 if guidance.mode == "full" else payload)
        elements += t.num_elements
    return 8.0 * nbytes / elements if elements else 0.0


def _store_guidance(path: Path, batch) -> tuple[dict, float]:
    """Write this step's guidance file, drop the previous steps' files; (write stats, seconds)."""
    t0 = time.perf_counter()
    stats = write_guidance(path, batch)
    for old in path.parent.glob("step_*.safetensors"):  # keep only the current batch's file
        if old != path:
            old.unlink(missing_ok=True)
    return stats, time.perf_counter() - t0


def rl_step(cfg: RunConfig, step: int, task, tok, engine: RolloutEngine, sampling: SamplingParams,
            trainer: PolicyTrainer, guidance_dir: Path, ref_model, device,
            writer: ThreadPoolExecutor | None = None) -> dict:
    """One RL step; returns its metrics record. writer: the thread that stores guidance files in
    run.guidance_io = "overlap" mode (without one, the file is written in line)."""
    r = cfg.rollout
    problems = task.problems(r.prompts_per_step, derive_seed(cfg.seed, "problems", step))
    prompts = [tok.encode(p.prompt, add_bos=True) for p in problems]
    t0 = time.perf_counter()
    rollout = engine.generate(prompts, sampling, group_size=r.group_size,
                              seed=derive_seed(cfg.seed, "sampling", step))
    t_rollout = time.perf_counter() - t0

    guidance, gstats, t_write, pending = None, {}, 0.0, None
    t0 = time.perf_counter()
    if rollout.guidance is not None:
        path = guidance_dir / f"step_{step:08d}.safetensors"
        if cfg.run.guidance_io == "overlap" and writer is not None:
            pending = writer.submit(_store_guidance, path, rollout.guidance)
        else:
            gstats, t_write = _store_guidance(path, rollout.guidance)
        # overlap: the file is the record; the trainer needs none of its checks on its own memory
        guidance = (read_guidance(path, device=device) if cfg.run.guidance_io == "roundtrip"
                    else rollout.guidance.to(device))
    t_io = time.perf_counter() - t0
    compact_bits = _compact_bits_per_element(rollout.guidance) if rollout.guidance is not None else None

    samples = rollout.samples
    completions = [tok.decode([t for t in s.output_ids if t != tok.eos_id]) for s in samples]
    rewards = [task.reward(problems[s.prompt_index], c) for s, c in zip(samples, completions)]
    batch = build_train_batch([s.prompt_ids for s in samples], [s.output_ids for s in samples],
                              [s.logprobs for s in samples], [s.seq_id for s in samples], rewards,
                              tok.pad_id, [s.routing for s in samples]).to(device)
    t0 = time.perf_counter()
    m = trainer.grpo_step(batch, r.group_size, r.temperature, cfg.trainer.quant, guidance, ref_model)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    t_train = time.perf_counter() - t0
    t_refit = engine.refit(trainer.model)
    if pending is not None:  # join: a failed write fails this step; the host batch is not reused before
        t0 = time.perf_counter()
        gstats, t_write = pending.result()
        t_io += time.perf_counter() - t0

    rw = torch.tensor(rewards)
    return {
        "step": step,
        "reward_mean": float(rw.mean()),
        "reward_std": float(rw.std(unbiased=False)),
        "exact_match": float((rw == 1.0).float().mean()),
        "response_len_mean": sum(len(s.output_ids) for s in samples) / len(samples),
        "stop_fraction": sum(s.finish_reason == "stop" for s in samples) / len(samples),
        "k3_kl": m["k3_kl"],
        "max_abs_prob_diff": m["max_abs_prob_diff"],
        "code_agreement": m["code_agreement"],
        "code_agreement_neighbour": m["code_agreement_neighbour"],
        "neighbour_fraction": m["neighbour_fraction"],
        "code_distance_histogram": m["code_distance_histogram"],
        "guidance_fallback_fraction": m["guidance_fallback_fraction"],
        "guidance_fallback_elements": m["guidance_fallback_elements"],
        "route_agreement": m["route_agreement"],
        "guidance_mode": r.capture,
        "guidance_bits_per_element": gstats.get("bits_per_element"),
        "guidance_bytes": gstats.get("guidance_bytes", 0),
        "guidance_file_bytes": gstats.get("bytes", 0),
        "guidance_bits_per_element_compact": compact_bits,
        "loss": m["loss"],
        "grad_norm": m["grad_norm"] if math.isfinite(m["grad_norm"]) else None,
        "clip_frac": m.get("clip_frac"),
        "tis_weight_mean": m.get("tis_weight_mean"),
        "tis_capped_frac": m.get("tis_capped_frac"),
        "ref_kl": m.get("ref_kl"),
        "seconds_rollout": t_rollout,
        "seconds_guidance_io": t_io,
        "seconds_guidance_write": t_write,
        "seconds_train": t_train,
        "seconds_refit": t_refit,
    }
