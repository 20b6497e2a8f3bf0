"""What runs inside the jail: the isolate's main loop, its end of the channel, what a script is given, its
sandbox. Imports only the wire types (runtime.isolate.ipc) and workers."""
