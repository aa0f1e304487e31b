"""Scripts that capture the project's own traces (see replay/traces/README.md)."""
