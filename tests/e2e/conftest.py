from tests.workers.conftest import cpu_options, tiny_model, vllm_python  # noqa: F401  (shared fixtures)
