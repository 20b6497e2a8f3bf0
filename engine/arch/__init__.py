"""What a model is: its config.json read into a ModelConfig and the architecture described from it
(attention kind, KV components, sizes). Torch-free, and imported by every other room of the engine
(the KV stores, the models, loading, the step) and by the planner and the roofline, so it sits lowest.

Nothing is imported here, so `engine.arch.config` stays light."""
