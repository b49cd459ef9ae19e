"""The training and evaluation engine, pure PyTorch, usable with no service (`training.runs`)."""
