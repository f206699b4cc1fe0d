"""OpenAI-compatible inference servers: launching them, and a client that spreads requests over them."""
