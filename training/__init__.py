"""Training and evaluation engine: filled by the training issue; nothing here yet."""
