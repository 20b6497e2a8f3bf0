"""Scheduling: the policy that decides each step (admission, preemption, chunked prefill, fair
shares between tenants), its counts-only view of KV blocks, and the fair queues. It counts; it runs
no model, so the capacity simulator drives this same policy with modelled step times.

Compiled by mypyc when the build is current (engine.native lists these modules by name)."""
