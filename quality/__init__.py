"""The quality tool (`edge models eval`): what a weight or KV format costs in accuracy. Held-out
perplexity through the engine (quality.perplexity), and the chat evaluation (tool calls, JSON,
facts, prose), which drives a PoP node as the edge serves it and so sits above edge_sim.

Dependency order: runtime -> capacity | quality -> edge_sim -> engine -> kernels."""
