"""The meter: a proxy beside a vLLM engine that judges each stream as its client sees it.

vLLM exports histograms of first tokens and of gaps, not one verdict per request, and
the product of their shares reads a class's goodput high wherever slow gaps bunch on a
few requests (on mixed traffic in the simulator, 81 % of P0's tokens read good where
13.5 % were: docs/benchmarks.md, "goodput_truth"). The operator runs the meter
in each vLLM pod, in front of the engine (``slopilot meter``): it forwards every request,
judges each streamed completion by ``ClassSLO.met`` on its TTFT and token gaps as
written to the client (``stream_judge``), observes their TTFT and token gaps as written
(``client_latency``: the P99s the rules read on a vLLM deployment, where vLLM's own
leave out its frontend's work), counts each request for generation as it arrives (the
workload probe's arrivals on vLLM, whose own series drop a request whose client gave up),
and serves vLLM's ``/metrics`` with the verdict counters (the ones the goodput rule reads
per replica), those histograms and the arrivals after them (``exposition``).
"""
