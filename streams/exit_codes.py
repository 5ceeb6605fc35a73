"""The exit codes of every ``relay`` command (and of ``python -m streams run``, its alias).

One table, so that a script or a supervisor can act on the code alone:

====  ===========  ========================================================================
code  name         meaning, and what to do
====  ===========  ========================================================================
0     OK           done; a worker stopped by SIGINT or SIGTERM after a clean shutdown
1     FAILED       failed while working (a stream thread's fatal error, a broker error, a
                   corrupt snapshot manifest): read the message and the log; a restart may
                   help
2     USAGE        bad arguments, or an unknown app, instance or store: fix the command
3     UNREACHABLE  no broker answers at the bootstrap address: start it, or fix the address
4     CONFIG       a configuration error (a bad setting, a state_dir that cannot be written,
                   a topology that cannot run, no bootstrap address): fix the configuration;
                   restarting as it is fails again
====  ===========  ========================================================================

Kept beside the runtime rather than in ``tools``: ``python -m streams run`` uses it too, and
``streams`` never imports ``tools``.
"""

from __future__ import annotations

from enum import IntEnum


class ExitCode(IntEnum):
    OK = 0
    FAILED = 1
    USAGE = 2
    UNREACHABLE = 3
    CONFIG = 4


#: Each code in a few words, for ``--help``.
LABELS = {
    ExitCode.OK: "done",
    ExitCode.FAILED: "failed",
    ExitCode.USAGE: "bad arguments or unknown app/instance/store",
    ExitCode.UNREACHABLE: "broker unreachable",
    ExitCode.CONFIG: "configuration error",
}


def summary() -> str:
    """The table in one line, for ``--help``: ``0 done, 1 failed, ...``."""
    return ", ".join(f"{code.value} {LABELS[code]}" for code in ExitCode)
