"""`edge bench serve`: a load generator against a running runtime, in `vllm bench serve`'s vocabulary.

load: when each request is sent (Poisson / gamma arrivals, ramp-up); dataset: what each request asks
(prompt and output lengths from capacity.workload's profiles, or a JSONL file); clients: the three
backends (workers-ai, openai-chat, worker) and what each answer measured; tenants: the API tokens
requests are spread over; runner: sending a dataset on a schedule under a concurrency limit;
metrics: percentiles and goodput; report: the printed table and the result file; sweep: rates
from light to past the knee and the latency-against-load plot; simcompare: the capacity simulator
on the same requests, side by side. The command line is runtime/cli/bench.py."""
