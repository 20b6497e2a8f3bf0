"""Loading a model's weights: checkpoints and their safetensors, weights in their stored formats and
the parts a weight format applies to, compressed checkpoints written and costed, and integrity
(signed manifests checked before serving). It reads the tensors the models expect (engine.models),
so it sits above them."""
