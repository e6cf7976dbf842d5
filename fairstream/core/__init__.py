"""The pure engine: the model, the tenant tree, the fairness vocabulary, accounting, the
snapshot a policy reads and the pass it works on, and ``Engine.step``. No I/O, no clock."""
