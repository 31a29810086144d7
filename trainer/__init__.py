"""The training library: `trainer.loop.train_and_evaluate(config, workdir)` is the entry point."""
