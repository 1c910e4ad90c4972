"""The OpenAI-compatible HTTP server and the thread that runs the engine loop for it."""
