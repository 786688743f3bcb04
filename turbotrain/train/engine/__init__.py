"""A training run: built from the plan (builder.py), the epoch loop (trainer.py), its
resumable state (trainer_state.py), its data (data.py, loader.py: the Loader a
user's own loop gets too), the batch-size search and summary.json.
"""
