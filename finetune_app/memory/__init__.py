"""The GPU memory budget: model shape from config.json, a pure per-GPU estimator, verdict and advice."""
