"""One trace's analysis (`analysis.analyze_trace`, into a `TraceAnalysis`): its steps (markers,
or iterations found from the loop's events, `steps`), the device's work and breakdown
(`device`, `kernels`, `intervals`), the loop's host work (`host`), copies, syncs and the call
sites that made them (`facts`, `copies`, `callsites`), the FLOPs its ops ran (`trace_flops`),
over the trace's records (`trace_records`).

May import: analyze.read, compute, records, errors."""
