"""Code that runs inside the user's training process: the child's entry (`child`, started by
`profile` as `python -m trainadvisor.training.child`), the hooks that find the script's steps and
record them (`hooks`), the measuring window (`window`), the DataLoaders seen and their settings
(`loaders`), the GPU's flags, facts and CUDA-event timing (`gpu`), trial windows in the same
process (`session`), a run started ahead of its settings (`gate`) and what an out-of-memory
death leaves (`failure`). `@advise` drives the same hooks and window in its own process. The
parent's side of each run (starting, sampling, collecting it) is `measure/`; what the two sides
exchange (the child's configuration, the steadiness test, its progress and heartbeat) is in
`measure/`'s torch-free modules.

May import: measure, fixes, frameworks, memory, compute, records, units, _serial, errors."""
