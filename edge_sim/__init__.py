"""The simulated edge: topology, network RTT, PoP nodes with engines, routing, latency account."""
