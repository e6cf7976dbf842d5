"""fairstream.state."""
