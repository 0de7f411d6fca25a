"""Measuring a run of the script, from trainadvisor's own process: one run (`runner`, what it is
asked to do `spec`, what it saved read back `results`), a run kept alive for trial windows
(`live`), host and NVML sampling (`sampling`, reading its own process tree a tick and the whole
table only to name other processes, `proctable`; `nvml`), the guard that leaves no process
behind (`reaper`), signals noted where they arrive (`interrupts`). Torch-free, and shared with
the training process's side (`training/`): what the parent asks of the child (`config`), the
steadiness test of a warm-up (`settle`) and a window's race (`race`), the run's progress and
heartbeat as it goes (`progress`, `watchdog`), the script's console (`console`).

May import: records, _serial, errors, redact, units."""
