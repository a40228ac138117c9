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
    ShardedLabels,
    ShardTokenizer,
    Tokenizer,
    WordEmbeddings,
)
from .models import (
    GradientStudy,
    LanguageModel,
    LrSweep,
    ModelComparison,
    NgramReference,
    RecurrentCost,
    TransformerAblations,
)
from .studies import (
    ArticleExamples,
    AttentionCost,
    AttentionHeads,
    AttentionTopk,
    ContextUsage,
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
    "ENVELOPE", "KINDS", "TAG", "ArticleExamples", "AttentionCost", "AttentionHeads", "AttentionTopk", "ContextUsage",
    "Corpus", "CorpusShard", "EmbeddingEval", "FfnMemories", "FileRecord", "GenerationCost", "GradientStudy",
    "LabelShard", "Labels", "LanguageModel", "LongContextCost", "LrSweep", "Manifest", "ManifestError", "MemoryDelay",
    "MemoryInduction", "MemoryRecall", "ModelComparison", "ModelExport", "NgramBaseline", "NgramReference",
    "Published", "QuantizedModels", "RecurrentCost", "Report", "ShardTokenizer", "ShardedLabels", "Tokenizer",
    "TransformerAblations", "WeightsArithmetic", "WordEmbeddings", "from_json",
]
