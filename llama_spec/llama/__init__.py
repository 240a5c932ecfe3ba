"""llama."""
