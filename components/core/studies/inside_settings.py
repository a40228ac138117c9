"""Settings of the look inside a trained Transformer (`inside`, `heads`): a leaf module."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from ..device import DeviceSetting


class InsideSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    sentences: list[str] = Field(
        default=[],
        description="Sentences whose attention maps are drawn (empty: the start of the first validation blocks).",
    )
    map_sentences: int = Field(default=2, ge=1, description="Validation excerpts drawn when `sentences` is empty.")
    map_tokens: int = Field(default=20, ge=2, description="Tokens per attention map (readable at that size).")
    stat_blocks: int = Field(
        default=128,
        ge=1,
        description="Validation blocks for head statistics, head ablation and neuron activations.",
    )
    prev_threshold: float = Field(
        default=0.4, gt=0, le=1, description="Previous-token head: at least this share of attention on t − 1."
    )
    first_threshold: float = Field(
        default=0.4, gt=0, le=1, description="Sink head: at least this share on the first position."
    )
    self_threshold: float = Field(
        default=0.4, gt=0, le=1, description="Self head: at least this share on the query's own position."
    )
    local_distance: float = Field(
        default=4.0, gt=0, description="Local head: mean attention distance at most this many tokens."
    )
    top_neurons: int = Field(
        default=6, ge=1, description="Most selective FFN neurons shown with their keys and values."
    )
    top_contexts: int = Field(default=4, ge=1, description="Top-activating contexts shown per neuron.")
    context_tokens: int = Field(default=8, ge=1, description="Tokens of context shown before each activating token.")
    value_tokens: int = Field(default=5, ge=1, description="Tokens each shown neuron's output promotes most.")
    batch_size: int = Field(default=16, ge=1, description="Blocks per forward pass.")
    device: DeviceSetting = Field(default="auto", description="Where to run: 'auto' = CUDA if present, else CPU.")
