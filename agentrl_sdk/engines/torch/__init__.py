"""The embedded engine: `TorchEngine` (``engine``) and its parts, a continuous-batching
scheduler over a paged KV cache with a prefix cache, sampling and LoRA rows."""
