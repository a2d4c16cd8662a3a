"""Training of the bundled tiny Dream-layout dLLM (dllm/assets/tiny-dream)."""
