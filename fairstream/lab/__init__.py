"""Experiment tools on top of the engine and the simulator: benchmarks, parameter sweeps,
FLEX training, the theory a run is compared with, the TSF paper's divisible model."""
