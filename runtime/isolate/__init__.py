"""The runtime's side of an isolate process and its jail: launch, channel, streams, watchdog, console. Must
stay importable without site-packages (the jail's launcher runs with -S)."""
