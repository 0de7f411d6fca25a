"""What fills a busy step's time: the FLOPs of one step counted as it runs (`flops`), the
hardware's dense peak by device and dtype (`peaks`: a datasheet table for GPUs, a matmul
benchmark for the CPU), MFU from both (`mfu`), and torch.compile's own records of a script that
compiles (`dynamo`).

May import: records, errors."""
