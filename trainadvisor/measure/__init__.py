"""Measuring a run of the script. In the script's process: the measuring window (`window`, its
warm-up until step time settles in `settle`), the hooks that find steps and time the DataLoader
(`hooks`, `loaders`), the GPU's side (`gpu`), the fixes' run-time switches (`switches`), trial
windows (`session`), a run started ahead of its settings (`gate`), the stall watchdog's heartbeat
(`watchdog`), all started by `child`. In trainadvisor's process: one run (`runner`), a run kept
alive for trial windows (`live`), host and NVML sampling (`sampling`, reading its own process
tree a tick and the whole table only to name other processes, `proctable`; `nvml`), the child's console
(`console`) and what the parent asks of the child (`config`).

May import: fixes/ (their switches), frameworks/ (their settings objects), records and the
top-level helpers; never profile/, advising/, analyze/, report/ or cli."""
