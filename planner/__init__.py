"""Pure capacity math for vLLM: what fits, what the tail costs, what to buy.

errors (the error tree every room raises), models/ (architectures from config.json,
presets, parameter and weight counts), gpus (the catalog), kv (bytes, pages, blocks),
memory (vLLM's per-GPU budget), capacity (plans, curves, the OOM frontier), fragmentation
(contiguous vs paged), slo (promises and compliance), cost (reserve vs violation),
queueing (wait approximations), stats (histogram quantiles).

It imports nothing of the rest of kvscope and does no I/O beyond reading its own packaged
data files (planner/data), so every other room can depend on it.
"""
