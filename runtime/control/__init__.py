"""Durable state and the operator's settings: SQLite state, accounts, the admin token, rate limits,
rollouts, the config and its schema, tail and metrics. Imports only http of runtime."""
