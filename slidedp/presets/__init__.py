"""Built-in model shapes and hardware profiles."""
