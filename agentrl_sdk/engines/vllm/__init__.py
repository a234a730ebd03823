"""vLLM as an engine: in this process (`VLLMEngine`, ``engine``) or as its OpenAI-compatible
server (`VLLMServerEngine`, ``server``). vLLM itself is imported only when one is built."""
