"""fairstream.producers."""
