"""Training the bundled k3-small model: arithmetic data (arith), the stdlib + arithmetic corpus (corpus), its
tokenizer (tokenizer_train) and the pre-training loop behind `kestrel train` (trainer)."""
