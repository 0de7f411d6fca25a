"""Why is the compiled trial slower on the H200? Times eager and compiled steps of the compiled_step
example's model, lists the child processes' CPU while the compiled steps run, then quiesces
inductor's compile pool (what torch does after 60 s idle) and shuts it down, timing again each time."""
import os, statistics as st, sys, time
import psutil, torch
from torch import nn
from torch.utils.data import BatchSampler, DataLoader, RandomSampler, TensorDataset
sys.path.insert(0, "examples")
from compiled_step import Gated
me = psutil.Process()
dev = "cuda" if torch.cuda.is_available() else "cpu"
sync = torch.cuda.synchronize if dev == "cuda" else (lambda: None)
W = int(os.environ.get("W", "1024")); K = float(os.environ.get("K", "1"))
def children(tag):
    kids = me.children(recursive=True)
    for k in kids:
        try: k.cpu_percent(None)
        except psutil.Error: pass
    return kids
def report(tag, kids):
    rows = []
    for k in kids:
        try: rows.append((k.cpu_percent(None), k.pid, k.ppid(), k.num_threads(), " ".join(k.cmdline())[-90:]))
        except psutil.Error: pass
    rows.sort(reverse=True)
    print(f"[{tag}] {len(rows)} descendants; busiest: {rows[:4]}", flush=True)
torch.manual_seed(0); g = torch.Generator().manual_seed(0)
inputs = torch.randn(16384, W, generator=g); targets = inputs[:, :10].argmax(1)
ds = TensorDataset(inputs, targets)
loader = DataLoader(ds, sampler=BatchSampler(RandomSampler(ds), batch_size=256, drop_last=True), batch_size=None)
model = nn.Sequential(*(Gated(W) for _ in range(4)), nn.Linear(W, 10)).to(dev)
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
def fl(x, y): return nn.functional.cross_entropy(model(x), y)
def timed(step_loss, n, tag):
    n = max(2, int(n * K))
    it = iter(loader); steps, waits = [], []
    me.cpu_percent(None); kids = children(tag); t_all = time.perf_counter()
    for _ in range(n):
        t0 = time.perf_counter()
        try: x, y = next(it)
        except StopIteration: it = iter(loader); x, y = next(it)
        t1 = time.perf_counter()
        x, y = x.to(dev), y.to(dev); loss = step_loss(x, y)
        opt.zero_grad(set_to_none=True); loss.backward(); opt.step(); sync()
        steps.append(time.perf_counter() - t0); waits.append(t1 - t0)
    wall = time.perf_counter() - t_all
    print(f"[{tag}] {n} steps {n / wall:.1f} steps/s, median step {1e3 * st.median(steps):.2f} ms, "
          f"median data {1e3 * st.median(waits):.3f} ms, main cpu {me.cpu_percent(None):.0f}%, threads {torch.get_num_threads()}", flush=True)
    report(tag, kids)
timed(fl, 100, "eager warm"); timed(fl, 300, "eager")
t = time.perf_counter(); cfl = torch.compile(fl); timed(cfl, 5, "compile first"); print(f"compile+5 steps {time.perf_counter() - t:.1f}s")
timed(cfl, 50, "compiled warm"); timed(cfl, 300, "compiled, pool alive"); timed(cfl, 300, "compiled, pool alive again")
from torch._inductor import async_compile as ac
pools = list(ac._pool_set); print("pools", [type(p).__name__ for p in pools], flush=True)
for p in pools:
    if hasattr(p, "quiesce"): p.quiesce()
time.sleep(1.0); timed(cfl, 300, "compiled, quiesced"); timed(cfl, 300, "compiled, quiesced again")
t = time.perf_counter(); ac.shutdown_compile_workers(); print(f"shutdown took {time.perf_counter() - t:.2f}s", flush=True)
timed(cfl, 300, "compiled, shut down"); timed(fl, 300, "eager again")
