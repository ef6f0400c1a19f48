"""Shared fixtures: fresh interpreters for runs, a GCS emulator, the environment restored."""

# Fixtures `gcs_emulator` and `gcs_bucket`: a local GCS server for `gs://` checkpoints;
# `python_subprocess`, `restore_environ` and `gated_src` (tests/subprocess_fixtures.py).
pytest_plugins = ["gcs_emulator", "subprocess_fixtures"]
