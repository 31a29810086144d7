"""The training library: `trainer.train.train_and_evaluate(config, workdir)` runs a resolved config
(configs/validation.py); trainer/run.py builds what every driver trains from; docs/operations.md."""
