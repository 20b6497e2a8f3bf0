"""The simulated edge: topology, network RTT, PoP nodes with engines, routing, latency account."""

from engine import native as _native

_native.install()  # the compiled hot paths, when their build is current (engine.native)
