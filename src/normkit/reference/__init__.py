"""The ATen contract as plain torch code (being written)."""
