"""Pure decisions about a request: what it is (recognition), who sent it (auth), which arm
and priority it takes (traffic, priority), and whether it may go now (admission).

No I/O: nothing here opens a socket or reads a file, so the sweep's replay can reuse it.
Imports nothing from ``relay``, ``server``, ``record`` or ``pools`` at run time.
"""
