"""A trace's bytes in, in bounded memory and time: where traces are (`sources`: paths and URLs
of object storage, with deadlines, `deadline`), what may be opened (`bounds`), archives unpacked
member by member (`archives`), the JSON streamed (`stream`, `kineto_json`) into compact columns
(`columns`, each op's FLOPs from its shapes by `op_flops`), gzip streamed to workers
(`pipeline`), one trace's table (`reading`).

May import: errors."""
