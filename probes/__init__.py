"""Everything that talks to engines and runs in the worker, one subpackage per concern.

vllm/      the one client of an engine's HTTP API, metric spellings, log-line parsing
engine/    the managed engine: spec, process, log follower, crash policy (venv/: scripts
           the engine's own interpreter runs)
load/      the open/closed-loop load generator, its HTTP transport, workload profiles
kinds/     the probe contract, the registry and one module per probe kind
alerting/  alert rule kinds and their evaluation over stored series
worker/    the long-lived process: scheduler, scraping, engine registry, work queue

May import `planner` and `storage`; never `app` or Streamlit.
"""
