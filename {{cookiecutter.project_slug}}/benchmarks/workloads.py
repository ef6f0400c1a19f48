"""The benchmark's workloads: what each trains, for how long, on how many devices.

Every contender of a workload trains the same model on the same data with the same batch
size and the defaults of `TrainConfig` (`CONFIG`): AdamW, warm-up + cosine schedule,
gradient clipping at 1.0, fp32, the loss read every `LOG_EVERY` steps.
"""

from __future__ import annotations

import importlib.util
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import Dataset

from {{ cookiecutter.package_name }}.tasks import available, load_task
from {{ cookiecutter.package_name }}.training import TrainConfig

WARMUP_STEPS = 3  # the training loop's own timer also starts after step 3
LOG_EVERY = 20
CONFIG = TrainConfig()  # the defaults every contender copies
WORKLOADS = {
    # name: (steps per run, rounds, devices, contenders)
    "mlp": (128, 5, 1, ("hand-written", "trainer", "accelerate")),
    "task": (43, 3, 1, ("hand-written", "trainer", "trainer (traced)", "accelerate")),
    "spmd": (64, 3, 8, ("hand-written", "trainer")),
    "fsdp": (32, 3, 8, ("hand-written", "trainer")),
    "hf-llama": (33, 3, 1, ("hand-written", "trainer", "trainer (traced)")),
    "hf-moe": (33, 3, 1, ("hand-written", "trainer")),
    "ckpt": (60, 3, 1, ("trainer", "trainer+sync saves", "trainer+async saves")),
    "wandb": (60, 3, 1, ("trainer", "trainer+wandb")),
}
CHECKPOINT_EVERY = 10  # the ckpt workload: steps/s while saving this often
# The trainer's steps/s against the hand-written loop's, on every workload: at least this.
TRAINER_TARGET = 1.0
STRATEGY = {"spmd": "spmd", "fsdp": "fsdp"}  # workload -> strategy; the rest: one device
FSDP_BATCH = 4  # per device: the task's global batch of 32 over 8 devices
DEPTHS = "2,8,24"  # blocks of the depth sweep
DEPTH_STEPS = 8
# The hf-llama workload: big enough that a step is the model's compute, not Python's tracing.
HF_LLAMA = {"seq_len": 128, "dim": 256, "layers": 2, "heads": 8, "kv_heads": 4, "mlp_dim": 688}
HF_LLAMA_BATCH = 16
# The hf-moe workload: the Llama's attention, a Mixtral's 8 experts of which each token uses 2.
HF_MOE = {**HF_LLAMA, "architecture": "mixtral", "mlp_dim": 512, "experts": 8,
          "experts_per_token": 2}  # fmt: skip
HF_WORKLOADS = {"hf-llama": HF_LLAMA, "hf-moe": HF_MOE}  # each with a batch of HF_LLAMA_BATCH
HF_EXAMPLE = "hf-causal-lm"


class Pairs(Dataset[dict[str, torch.Tensor]]):
    def __init__(self, x: torch.Tensor, y: torch.Tensor) -> None:
        self.x, self.y = x, y

    def __len__(self) -> int:
        return len(self.y)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return {"x": self.x[index], "y": self.y[index]}


class MlpTask:
    """An MLP 64-256-10 on synthetic data: 4096 samples, 32 steps of 128 per epoch."""

    name = "mlp"
    batch_size = 128

    def __init__(self) -> None:
        generator = torch.Generator().manual_seed(0)
        self.x = torch.randn(5120, 64, generator=generator)
        self.y = torch.randint(0, 10, (5120,), generator=generator)

    def build_model(self) -> nn.Module:
        return nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 10))

    def train_dataset(self) -> Pairs:
        return Pairs(self.x[:4096], self.y[:4096])

    def eval_dataset(self) -> Pairs:
        return Pairs(self.x[4096:], self.y[4096:])

    def loss(self, model: nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        return F.cross_entropy(model(batch["x"]), batch["y"])

    def metrics(self, model: nn.Module, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return {"loss": F.cross_entropy(model(batch["x"]), batch["y"], reduction="none")}


class DecoderTask:
    """The hf-causal-lm example's decoder of a workload (`HF_WORKLOADS`), for bakes without
    that example.

    Built by the same `hf.models` functions; its data are random bytes, since a step
    costs the same whatever the tokens.
    """

    batch_size = HF_LLAMA_BATCH

    def __init__(self, name: str) -> None:
        from {{ cookiecutter.package_name }}.hf.byte_tokenizer import BYTE_VOCAB
        from {{ cookiecutter.package_name }}.hf.models import Sizes, decoder_config

        self.name = name
        options = dict(HF_WORKLOADS[name])
        architecture, seq_len = options.pop("architecture", "llama"), options.pop("seq_len")
        self.tokens_per_sample = seq_len
        self.config = decoder_config(architecture, Sizes(BYTE_VOCAB, seq_len, **options))
        generator = torch.Generator().manual_seed(0)
        self.windows = torch.randint(0, BYTE_VOCAB, (2304, seq_len + 1), generator=generator)

    def build_model(self) -> nn.Module:
        from {{ cookiecutter.package_name }}.hf.models import build_decoder

        return build_decoder(self.config)

    def train_dataset(self) -> Pairs:
        return Pairs(self.windows[:2048, :-1], self.windows[:2048, 1:])

    def eval_dataset(self) -> Pairs:
        return Pairs(self.windows[2048:, :-1], self.windows[2048:, 1:])

    def loss(self, model: nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        from {{ cookiecutter.package_name }}.hf.moe import add_router_loss

        output = model(input_ids=batch["x"])
        loss = F.cross_entropy(output.logits.flatten(0, 1).float(), batch["y"].flatten())
        return add_router_loss(loss, model, output)

    def metrics(self, model: nn.Module, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        logits = model(input_ids=batch["x"]).logits.float()
        per_token = F.cross_entropy(logits.transpose(1, 2), batch["y"], reduction="none")
        return {"loss": per_token.mean(dim=1)}


def skip_reason(name: str) -> str | None:
    """Why this bake cannot run the workload (None: it can)."""
    if name in HF_WORKLOADS and importlib.util.find_spec("transformers") is None:
        return "transformers is not installed (pip install -e '.[hf]')"
    if name == "wandb" and importlib.util.find_spec("wandb") is None:
        return "wandb is not installed (pip install -e '.[wandb]')"
    return None


def make_workload(name: str) -> Any:
    if name in ("mlp", "spmd"):
        return MlpTask()
    if name in HF_WORKLOADS:
        if HF_EXAMPLE.replace("-", "_") not in available():
            return DecoderTask(name)
        task = load_task(HF_EXAMPLE, options=HF_WORKLOADS[name])  # the bake's own, resized
        task.batch_size = HF_LLAMA_BATCH
        return task
    task = load_task(CONFIG.task)
    task.batch_size = FSDP_BATCH if name == "fsdp" else CONFIG.batch_size
    return task


def log_reads(steps: int) -> int:
    """Loss reads at the logging cadence, the last step included (as the training loop logs)."""
    return steps // LOG_EVERY + (1 if steps % LOG_EVERY else 0)
