"""The paged KV cache: the block pool (ids, reference counts, prefix hashes salted per tenant), the
per-layer tensor stores in each KV format, and the batch views a step hands the model."""
