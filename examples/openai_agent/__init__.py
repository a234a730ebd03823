"""An agent written with the OpenAI SDK (no LangChain), trained through the recording gateway."""
