"""The studies built on the models and the training loop: gradients across time in recurrent nets,
the cost of recurrence and of attention as sequences grow, Transformer ablations, and the
side-by-side comparison of the trained models."""
