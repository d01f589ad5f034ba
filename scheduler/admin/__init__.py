"""Admin: read-only inspection, the invariant checker (doctor), server health and startup checks."""
