"""Goodput: where a run's hours went, in Google's categories (ml-goodput-measurement).

- `timeline`: what the training loop records of one attempt, beside the checkpoints
  (and to Cloud Logging with `goodput = "cloud"`);
- `store`: the records folder `<checkpoint_dir>-records`: events, the incident log, the
  completion record;
- `account`: the library's own calculator over every attempt's records, and its table;
- `intervals`: the records as intervals: what each category claims, and `other`;
- `cli`: the `goodput` command, and the account at the end of every `train`.
"""
