"""simpar."""
