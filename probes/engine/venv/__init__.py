"""Scripts the engine's own interpreter runs (its venv's python, not kvscope's).

Standard library only at module level; the engine venv's packages (torch, transformers,
tokenizers, safetensors, vllm) only inside functions, so kvscope can import these modules
for their constants and command lines. tests/probes/test_engine_venv.py holds them to it.
"""
