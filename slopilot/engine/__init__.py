"""The continuous-batching engine: config, requests, KV blocks, scheduler, executors."""
