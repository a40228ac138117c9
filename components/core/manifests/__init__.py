"""Typed manifests: one frozen dataclass per kind of asset output, stored as tagged JSON (`base`).

The IO manager stores and reads them (`Manifest.to_json`, `from_json`), `Stage.publish` fills in
the envelope, and the claims and the report read their fields by name."""

from .base import ENVELOPE, KINDS, TAG, FileRecord, Manifest, ManifestError, Published, from_json
from .data import (
    Corpus,
    CorpusShard,
    EmbeddingEval,
    Labels,
    LabelShard,
    NgramBaseline,
    NgramRung,
    ShardedLabels,
    ShardTokenizer,
    Tokenizer,
    WordEmbeddings,
)
from .models import (
    Crossing,
    FamilyScaling,
    GradientStudy,
    LanguageModel,
    LrSweep,
    ModelComparison,
    NgramReference,
    RecurrentCost,
    Scaling,
    ScalingFit,
    ScalingTrial,
    TransformerAblations,
    TransformerVsLstm,
)
from .studies import (
    ArticleExamples,
    AttentionCost,
    AttentionHeads,
    AttentionTopk,
    ContextUsage,
    FactSeed,
    FfnMemories,
    GenerationCost,
    LongContextCost,
    MemoryDelay,
    MemoryInduction,
    MemoryRecall,
    ModelExport,
    QuantizedModels,
    Report,
    WeightsArithmetic,
)

__all__ = [
    "ArticleExamples", "AttentionCost", "AttentionHeads", "AttentionTopk", "ContextUsage", "Corpus", "CorpusShard",
    "Crossing", "ENVELOPE", "EmbeddingEval", "FactSeed", "FamilyScaling", "FfnMemories", "FileRecord", "GenerationCost",
    "GradientStudy", "KINDS", "LabelShard", "Labels", "LanguageModel", "LongContextCost", "LrSweep", "Manifest",
    "ManifestError", "MemoryDelay", "MemoryInduction", "MemoryRecall", "ModelComparison", "ModelExport",
    "NgramBaseline", "NgramReference", "NgramRung", "Published", "QuantizedModels", "RecurrentCost", "Report",
    "Scaling", "ScalingFit", "ScalingTrial", "ShardTokenizer", "ShardedLabels", "TAG", "Tokenizer",
    "TransformerAblations", "TransformerVsLstm", "WeightsArithmetic", "WordEmbeddings", "from_json",
]
