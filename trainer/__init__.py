"""The training library: `train.train_and_evaluate(config, workdir)` runs a resolved config."""
