"""Alignment on the slice: preference tuning by DPO and its variants as TRL defines them
(`dpo.py`), on preference pairs in TRL's formats (`preferences.py`), as the objective a run
trains its task's model for (`objective.py`)."""
