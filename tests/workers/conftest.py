"""The trial-runner tests use the shared vLLM fixtures of tests/conftest.py (vllm_python, tiny_model, cpu_options)."""
