"""Headers a client may send any door of the runtime (a worker's, the AI REST and OpenAI APIs)."""

LOCATION_HEADER = "x-edge-client-location"  # where the client is; else the config's default location
