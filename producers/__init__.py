"""fairstream.producers: trace replay, single-event publishing, decision tailing and the cluster
emulator for the streaming worker (next milestone)."""
