"""Detection models: the operator-built ONNX detector and the Triton model repository."""
