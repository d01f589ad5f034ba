"""Clients: `Queue` (sync) and `AsyncQueue` (asyncio), thin drivers of the operations."""
