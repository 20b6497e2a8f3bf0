"""Durable state and the operator's settings: SQLite state, accounts, the admin token, rate limits,
rollouts, the config and its schema, tail and metrics, the live dashboard's stream and sessions.
Imports only http of runtime."""
