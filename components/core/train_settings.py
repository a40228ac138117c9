"""The training loop's settings (`TrainSettings`) and where a process sits in data-parallel training
(`Parallel`): a leaf module, imported by the loop (`training`), its step (`train_step`) and every study
and asset that trains."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, Optional

from pydantic import BaseModel, ConfigDict, Field, model_validator

from .device import DeviceSetting, DtypeSetting
from .errors import ConfigError


class TrainSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    max_steps: int = Field(
        default=200, ge=1, description="Optimizer steps to train for (a resume continues up to this)."
    )
    batch_size: int = Field(
        default=16,
        ge=1,
        description="Blocks per micro-batch over all data-parallel ranks (each trains batch_size / world_size of "
        "them).",
    )
    flops_budget: Optional[float] = Field(
        default=None,
        gt=0,
        description="Training FLOPs to spend (the model's flops_per_token × tokens): when set, max_steps becomes the "
        "number of steps that spend it, so the schedule ends at the budget (a model compared at equal FLOPs is never a "
        "snapshot taken mid-schedule); None = max_steps as given.",
    )
    lr: float = Field(
        default=3e-3, ge=0, allow_inf_nan=False, description="Peak learning rate, reached after warmup_steps."
    )
    min_lr: float = Field(
        default=3e-4, ge=0, allow_inf_nan=False, description="Learning rate at the end of the cosine decay."
    )
    warmup_steps: int = Field(default=20, ge=0, description="Steps of linear warmup from ~0 to lr.")
    lr_decay_steps: Optional[int] = Field(
        default=None, ge=1, description="Step at which the cosine reaches min_lr; None = max_steps."
    )
    weight_decay: float = Field(
        default=0.1,
        ge=0,
        allow_inf_nan=False,
        description="Decoupled weight decay on >= 2-D weights (not biases or norms).",
    )
    beta1: float = Field(default=0.9, ge=0, lt=1, description="AdamW beta1 (the SGD momentum when optimizer='sgd').")
    beta2: float = Field(default=0.99, ge=0, lt=1, description="AdamW beta2.")
    grad_clip: float = Field(
        default=1.0, ge=0, allow_inf_nan=False, description="Maximum global gradient norm; 0 disables clipping."
    )
    grad_accum: int = Field(default=1, ge=1, description="Micro-batches accumulated per optimizer step.")
    eval_interval: int = Field(
        default=50, ge=0, description="Evaluate on the validation split every this many steps (0 = at the end only)."
    )
    eval_batches: Optional[int] = Field(
        default=None,
        ge=1,
        description="Validation batches per evaluation (the first blocks, so it is deterministic); None = the whole "
        "validation split, the one fixed set every model's validation loss (and the n-gram baseline's) is measured on.",
    )
    eval_batch_size: Optional[int] = Field(
        default=None,
        ge=1,
        description="Blocks per validation batch; None = batch_size. Evaluation has no backward pass and no step "
        "to take, so a small training batch need not make it slow: the whole split is the same targets at any size.",
    )
    log_interval: int = Field(default=10, ge=1, description="Log training metrics every this many steps.")
    checkpoint_interval: int = Field(
        default=0, ge=0, description="Checkpoint every this many steps; 0 = at evaluation points and at the end."
    )
    seed: int = Field(default=1337, description="Seed of the batch sampler and of dropout.")
    device: DeviceSetting = Field(
        default="auto", description="'cuda' demands a GPU; 'auto' uses one if present, else the CPU (with a warning)."
    )
    dtype: DtypeSetting = Field(
        default="auto",
        description="Autocast dtype; 'auto' = bfloat16 where the hardware multiplies it natively (a GPU that "
        "supports it, a CPU with AMX-BF16), else float32. Weights and optimizer state stay float32.",
    )
    compile: bool = Field(default=False, description="torch.compile the model.")
    # dict[str, Any], checked below: dagster's run config (TrainConfig) takes no union value type
    compile_options: dict[str, Any] = Field(
        default_factory=dict,
        description="Inductor options for torch.compile(options=...), with compile: true. {cpp_wrapper: true} "
        "calls the compiled kernels from generated C++ instead of Python: on a 2-core CPU that overhead is a "
        "sizeable share of a small model's step (benchmarks/train_throughput.py).",
    )
    threads: int = Field(default=0, ge=0, description="torch.set_num_threads when > 0 (CPU).")
    optimizer: Literal["adamw", "sgd"] = Field(
        default="adamw",
        description="'adamw', or plain 'sgd' (momentum beta1), whose update scales with the raw gradient: "
        "the setting where clipping is what keeps a recurrent net from exploding.",
    )

    @property
    def eval_batch(self) -> int:
        """Blocks per validation batch."""
        return self.eval_batch_size or self.batch_size

    @model_validator(mode="before")
    @classmethod
    def _context_is_the_models(cls, data: Any) -> Any:
        if isinstance(data, dict) and "block_size" in data:
            raise ValueError(
                "train.block_size is not a training setting: the context length is the model's block_size "
                "(model.block_size), the one setting that owns it; move it there"
            )
        return data

    @model_validator(mode="after")
    def _lr_order(self) -> "TrainSettings":
        if self.min_lr > self.lr:
            raise ValueError(f"min_lr ({self.min_lr}) must not exceed lr ({self.lr})")
        return self

    @model_validator(mode="after")
    def _compile_options(self) -> "TrainSettings":
        if self.compile_options and not self.compile:
            raise ValueError(f"compile_options {self.compile_options} need compile: true")
        if self.compile_options:
            from torch._inductor import list_options

            odd = {k: v for k, v in self.compile_options.items() if not isinstance(v, (bool, int, float, str))}
            if odd:
                raise ValueError(f"compile_options {odd}: each value must be a bool, number or string")
            unknown = sorted(set(self.compile_options) - set(list_options()))
            if unknown:
                raise ValueError(
                    f"compile_options: {unknown} are not torch inductor options (torch._inductor.list_options())"
                )
        return self


@dataclass(frozen=True)
class Parallel:
    """Where this process sits in data-parallel training: rank r of world_size (see the module doc).

    `sharded`: for a model whose parameters are sharded over the ranks (FSDP2), what writes and reads
    its checkpoints instead of `save_checkpoint` / `load_checkpoint` (same signatures; every rank
    calls both), so they hold the full model in the one format (`sharding.FullStateCheckpoints`).
    """

    rank: int = 0
    world_size: int = 1
    sharded: Any = None

    def __post_init__(self) -> None:
        if not 0 <= self.rank < self.world_size:
            raise ConfigError(f"rank={self.rank} must be in [0, world_size={self.world_size})")

    @property
    def is_main(self) -> bool:
        """The rank that logs and writes files."""
        return self.rank == 0
