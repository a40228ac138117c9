"""Language models of the core: recurrent (RNN, LSTM) and Transformer, each in its own module."""
