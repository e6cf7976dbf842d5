"""The embedded simulator: scenarios and trace loaders, the discrete-event driver of the
engine, metrics, the files and plots of a run, and the demo (the main job)."""
