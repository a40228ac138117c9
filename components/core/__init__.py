"""The framework-free ML core: corpus readers, tokenizers, label packing, embeddings,
recurrent and Transformer language models, the shared training loop and evaluations.

Nothing in this package imports Dagster or MLflow; every function runs from plain Python.
"""
