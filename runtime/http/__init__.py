"""The HTTP vocabulary every door shares: Cloudflare's error envelope and codes, JSON bodies, the headers
a client may send any door. Imports no other room of runtime."""
