"""Language models of the core: recurrent (RNN, LSTM) and Transformer, each in its own module, with
their settings, parameter counts, budget sizing and FLOPs. Training and checkpoints live elsewhere
(`components.core.training`, `components.core.lm`); nothing here imports them."""

from .sizing import count_parameters, meta_parameter_count, size_for_budget

__all__ = ["count_parameters", "meta_parameter_count", "size_for_budget"]
