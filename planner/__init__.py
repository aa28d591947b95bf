"""Pure capacity math for vLLM: architectures, GPUs, KV bytes, memory budget, SLO and cost.

Nothing in here does I/O beyond reading the package's own data files, and nothing imports
the rest of kvscope, so every other room can depend on it.
"""
