"""The generation layer: one step core (core.py) under every entry point (solo, batch, server)."""
