"""The training half of TRACE: run config, trainer-side quantizers, batches, and the policy trainer."""
from trace_rl.trainer.batch import TrainBatch, build_train_batch, sft_batch
from trace_rl.trainer.config import ConfigError, RunConfig, load_config, parse_config
from trace_rl.trainer.policy import PolicyTrainer, make_quantizer
from trace_rl.trainer.quantizers import AuditedRoundToNearest, GuidedQuantizer, QuantStats

__all__ = ["AuditedRoundToNearest", "ConfigError", "GuidedQuantizer", "PolicyTrainer", "QuantStats",
           "RunConfig", "TrainBatch", "build_train_batch", "load_config", "make_quantizer",
           "parse_config", "sft_batch"]
