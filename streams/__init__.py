"""fairstream.streams."""
