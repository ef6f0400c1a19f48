"""The exit codes every command and the run's own records share (below everything: it
imports nothing of the package).

2 a usage or configuration error, 3 training diverged (NaN/inf), 4 a checkpoint could not be
written (the previous one is kept), 75 stopped by SIGTERM after saving (EX_TEMPFAIL: not
finished; the same command continues it). A run stopped by a preemption must not exit 0: a
supervisor (SkyPilot, a Kubernetes Job) takes 0 for "done".
"""

EXIT_USAGE, EXIT_DIVERGED, EXIT_CHECKPOINT, EXIT_PREEMPTED = 2, 3, 4, 75
# The exit code of each way a run that trained can end.
EXIT_OF_STATUS = {"completed": 0, "preempted": EXIT_PREEMPTED, "diverged": EXIT_DIVERGED}
