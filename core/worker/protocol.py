"""How the worker reports to its launcher: one prefixed JSON line on standard output.

Rank 0 prints the metrics after `RESULT_PREFIX`; any rank prints a problem the user can fix after
`ERROR_PREFIX`, so the launcher can report it whatever exit status torchrun turns it into.
"""

RESULT_PREFIX = "TUNELINE_RESULT "
ERROR_PREFIX = "TUNELINE_ERROR "

# A worker started ahead of its job (`launch.worker_started_ahead`) reads the job's path from its standard input.
WAIT_FOR_JOB = "--wait-for-job"
WITHOUT_BITSANDBYTES = "--without-bitsandbytes"
