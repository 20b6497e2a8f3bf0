"""Durable state and the operator's settings: SQLite state, accounts, the admin token, rate limits,
rollouts, the config and its schema (with its validation messages and HOST:PORT entries), tail and
metrics, the live dashboard's stream and sessions. Imports nothing of runtime."""
