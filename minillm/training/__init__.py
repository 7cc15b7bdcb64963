"""Training on 2 CPU cores: the corpus (data.py), training and distillation (train.py), packaging the shipped
models with their card (ship.py), and the Medusa heads (medusa.py). Run offline by `python -m minillm train`;
never in CI or a notebook."""
