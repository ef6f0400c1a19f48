"""Spot TPU runs through SkyPilot managed jobs: the task file, built from the pod launcher's
own settings and per-worker command.

SkyPilot (`sky jobs launch`) recreates a preempted slice, in another zone or region when
capacity moved, and relaunches the task; the run resumes from its gs:// checkpoints
(`--resume auto`). This package writes the task; it supervises nothing itself.
"""
