"""One machine, no cluster: the demo's local deployment, Prometheus, scrape, load generator."""
