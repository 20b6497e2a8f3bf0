"""The HTTP vocabulary every door shares: Cloudflare's error envelope and codes, JSON bodies, validation
messages. Imports no other room of runtime."""
